"""Task-specific distillation (`configs/finetune.py:distill`): a smaller student of a fine-tuned classifier.

  python run.py --config=configs/finetune.py:distill --workdir=DIR --config.task.teacher=TEACHER \
      [--config.task.student_layers=0,2,4 | --config.init_from=STUDENT] --config.task.train_file=... ...

The teacher is any fine-tuned sequence classifier or regressor jbert predicts with (a jbert export or workdir, a
Hugging Face folder with a classification head); its tokenizer and label names are the run's. The student is the
teacher's architecture with the listed teacher layers (`jbert.model.student`: DistilBERT's init, embeddings,
pooler and classifier copied; default every other layer), or `init_from`'s model.

Losses (`jbert.model.distill`), each an objective at its config weight:
  soft    T² · KL(softmax(teacher / T) || softmax(student / T)) per row (Hinton; a regressor: the squared error to
          the teacher's value)
  hard    the classifier's own loss on gold labels (cross-entropy, or squared error), where the file has labels;
          unlabelled transfer data trains on the teacher alone
  hidden  1 - cos (or the MSE) between student hidden state m and its teacher hidden state, over attended tokens,
          averaged over the mapped states: m = 0 (the embeddings) maps to the teacher's embeddings, the output of
          student layer k to the output of the teacher layer it was copied from (`student_layers[k]`); a student
          from `init_from` maps uniformly (`distill.uniform_layer_map`: the last to the last)
Metrics beside them: `accuracy` on gold labels and `agreement` (the student's class is the teacher's).

The teacher's outputs are computed once per run, in example order, when the training stream is made: after the
trainer's finished check (a finished run never runs the teacher) and before the first step (`jbert.tasks.
teacher_cache`): `teacher_logits` [N, C] are features of the training rows, and with `hidden_weight` > 0 the mapped
hidden states of each row's tokens (no padding, in the teacher's dtype) are rebuilt as a batch's `teacher_hidden`
[B, K, H, T] at its length; a resume sees the same targets, and the TrainState holds only the student
(docs/ARCHITECTURE.md: "Distillation"). A cache over `task.teacher_cache_mib` or half of the memory available is
refused before it is allocated.

The export is an ordinary classifier (or regressor) of the student's size, recorded with the teacher's kind, so
`jbert.predict` and transformers load it as any fine-tuned model.
"""
from __future__ import annotations

import dataclasses
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from jbert import tokenizer as tokenizer_lib
from jbert.data import files as files_lib
from jbert.data import local
from jbert.model import BertForSequenceClassification
from jbert.model import distill
from jbert.model import student as student_lib
from jbert.tasks import sections
from jbert.tasks.distillation import teacher_cache
from jbert.tasks.base import Weighted, rows_of
from jbert.tasks.classification import sources
from jbert.tasks.classification.task import SequenceClassification, local_files
from jbert.tasks.finetuning import Batching
from jbert.tasks.registry import register

log = logging.getLogger("jbert")

HIDDEN_LOSSES = ("cosine", "mse")


def parse_layers(text: str) -> tuple[int, ...] | None:
  """`task.student_layers` ("0,2,4") as ints; None when empty."""
  parts = [p.strip() for p in str(text or "").split(",") if p.strip()]
  if not parts:
    return None
  try:
    return tuple(int(p) for p in parts)
  except ValueError:
    raise ValueError(f"task.student_layers={text!r} is not a comma-separated list of teacher layer indices "
                     "(e.g. 0,2,4).") from None


def describe_teacher(task_cfg):
  """The teacher's `ModelInfo`, or a ValueError naming what is wrong with `task.teacher` and the fix."""
  from jbert import weights  # pylint: disable=g-import-not-at-top  (TF/torch readers only when needed)
  teacher = task_cfg.get("teacher")
  if not teacher:
    raise ValueError("task distill needs --config.task.teacher=MODEL: the fine-tuned classifier to distil (a "
                     "jbert export or workdir, or a Hugging Face folder with a classification head).")
  if "://" not in teacher and not os.path.exists(teacher):
    raise FileNotFoundError(f"task.teacher={teacher} does not exist; pass a fine-tuned classifier (a jbert export "
                            "or workdir, or a Hugging Face folder with a classification head).")
  info = weights.describe(teacher)
  want = BertForSequenceClassification.__name__
  if info.head is None or info.head.architecture != want:
    what = f"a {info.head.architecture}" if info.head else "a model without a recorded head"
    raise ValueError(f"task.teacher={teacher} is {what}, not a {want}: distillation needs a fine-tuned sequence "
                     "classifier or regressor as the teacher (fine-tune one first with configs/finetune.py).")
  if not info.num_labels:
    raise ValueError(f"task.teacher={teacher} records no number of labels (config.json num_labels/id2label); "
                     "pass the folder a fine-tuning run exported.")
  return info


def student_layers(task_cfg, init_from: str | None, teacher_layers: int) -> tuple[int, ...] | None:
  """The teacher layers the student starts from (default every other one); None when `init_from` is the
  student. A ValueError says what is wrong (out of range, not increasing, both ways of making the student)."""
  layers = parse_layers(task_cfg.get("student_layers"))
  if init_from:
    if layers is not None:
      raise ValueError(f"task.student_layers={task_cfg.student_layers} and init_from={init_from} both set the "
                       "student; drop one of them.")
    return None
  if layers is None:
    layers = tuple(range(0, teacher_layers, 2))
  return student_lib.check_teacher_layers(layers, teacher_layers)


@register
class Distillation(SequenceClassification):
  """A student classifier (or regressor) trained on a teacher's soft targets, hidden states and gold labels."""

  kinds = ("distillation",)
  datasets = {}  # the user's files only
  config_names = ("distill",)
  local_kind = None
  predicts = False  # its export is served as the teacher's kind (`kind`)
  title = "distillation"
  packable = False
  unpackable_reason = "its losses read the teacher's outputs per padded row"

  def __init__(self, dataset, *, teacher: str, layers: tuple[int, ...] | None, temperature: float,
               soft_weight: float, hard_weight: float, hidden_weight: float, hidden_loss: str,
               layer_map: tuple[int, ...] = (), teacher_runtime: dict | None = None,
               train_labelled: bool | None = None, teacher_cache_mib: float = 2048, **kwargs):
    # The training file may lack the label column that the evaluation file has (unlabelled transfer data).
    self.labelled = dataset.label_key is not None if train_labelled is None else train_labelled
    self.teacher, self.layers, self.temperature = teacher, layers, float(temperature)
    self.hidden_weight, self.hidden_loss, self.layer_map = float(hidden_weight), hidden_loss, tuple(layer_map)
    self.teacher_runtime = dict(teacher_runtime or {})
    self.teacher_cache_mib, self.hidden_cache = float(teacher_cache_mib), None
    super().__init__(dataset, **kwargs)
    if self._train is not None and not self.labelled and hard_weight > 0:
      log.info("task distill: %s has no labels; training on the teacher's outputs alone (hard_weight ignored).",
               dataset.splits["train"])
    weights = {"soft": float(soft_weight), "hard": float(hard_weight) if self.labelled else 0.0,
               "hidden": self.hidden_weight}
    self.objectives = {k: w for k, w in weights.items() if w > 0}
    # With hidden states, each row carries its index: the stream rebuilds its states from the cache by it.
    self.label_keys = (*(("label",) if self.labelled else ()), "teacher_logits",
                       *((teacher_cache.ROW_KEY,) if self.hidden_weight > 0 else ()))

  # -- configuration --

  @classmethod
  def config_section(cls, name):
    cols = sections.columns()
    return {
        **sections.files(),
        **{k: cols[k] for k in ("text_a", "text_b", "label")},  # label None: unlabelled transfer data
        "label_names": "",                    # the teacher's class names override (their count must match);
                                              # empty: the teacher's id2label
        "teacher": sections.optional(str),    # the fine-tuned classifier/regressor to distil (a jbert export or
                                              # workdir, a Hugging Face folder with a classification head)
        "student_layers": "",                 # teacher layers the student starts from, e.g. 0,2,4; empty:
                                              # every other layer (or init_from's model when that is set)
        "temperature": 2.0,                   # softmax temperature T of the soft targets (the loss is T²-scaled)
        "soft_weight": 1.0,                   # weight of the soft-target KL (a regressor: squared error to the
                                              # teacher's value)
        "hard_weight": 0.5,                   # weight of the loss on gold labels (ignored without labels)
        "hidden_weight": 0.0,                 # weight of the hidden-state loss (caches the teacher's hidden
                                              # states: N·(L'+1)·T·H floats in memory)
        "hidden_loss": "cosine",              # cosine | mse: the hidden-state loss
        "teacher_cache_mib": 2048.0,          # the most memory the teacher's cached hidden states may take
                                              # (its tokens x (layers + 1) x H in model.dtype); a bigger cache
                                              # is refused before it is allocated
    }

  @classmethod
  def architecture_source(cls, config):
    """The teacher, with as many layers as `task.student_layers` lists; `init_from` when that is the student."""
    info = describe_teacher(config.task)
    if config.get("init_from"):
      return config.init_from, {}
    layers = student_layers(config.task, None, info.config.num_hidden_layers)
    return config.task.teacher, {"num_hidden_layers": len(layers)}

  @classmethod
  def from_config(cls, config, tokenizer=None) -> "Distillation":
    t = config.task
    info = describe_teacher(t)
    init_from = config.get("init_from")
    layers = student_layers(t, init_from, info.config.num_hidden_layers)
    for key in ("temperature", "soft_weight", "hard_weight", "hidden_weight", "teacher_cache_mib"):
      if not np.isfinite(t[key]) or t[key] < 0 or (key == "temperature" and t[key] == 0):
        raise ValueError(f"task.{key}={t[key]} must be a finite number >= 0{' (and > 0)' * (key == 'temperature')}.")
    if not t.soft_weight + t.hard_weight + t.hidden_weight > 0:
      raise ValueError("task.soft_weight, task.hard_weight and task.hidden_weight are all 0: nothing to train; "
                       "set at least one above 0.")
    if t.hidden_loss not in HIDDEN_LOSSES:
      raise ValueError(f"task.hidden_loss={t.hidden_loss!r}; one of {', '.join(HIDDEN_LOSSES)}.")
    regression = info.num_labels == 1
    if regression and t.label_names:
      raise ValueError(f"task.teacher={t.teacher} is a regressor (one output); drop task.label_names.")
    labels = None if regression else list(info.label_names or (f"LABEL_{i}" for i in range(info.num_labels)))
    if t.label_names and not regression:
      names = [n.strip() for n in t.label_names.split(",") if n.strip()]
      if len(names) != info.num_labels:
        raise ValueError(f"task.label_names names {len(names)} classes but the teacher {t.teacher} has "
                         f"{info.num_labels}; name the teacher's classes in its id order, or drop task.label_names.")
      labels = names
    layer_map = ()
    if t.hidden_weight > 0:
      layer_map = cls._layer_map(info, layers, init_from)
    files = local_files(t)
    if not t.text_a:
      raise ValueError("task distill needs --config.task.text_a=COLUMN (and --config.task.text_b=COLUMN for pairs; "
                       "--config.task.label=COLUMN where the file has gold labels).")
    columns = {"text_a": t.text_a, **({"text_b": t.text_b} if t.text_b else {}),
               **({"label": t.label} if t.label else {})}
    train_labelled = bool(t.label) and _has_column(files["train"], t.label)
    if t.label and not train_labelled:
      log.warning("task distill: %s has no %r column: unlabelled transfer data (the teacher's outputs alone).",
                  files["train"], t.label)
    if init_from and tokenizer is not None:
      _check_same_tokenizer(t.teacher, init_from, tokenizer)
    dataset = sources.local_dataset("distill", files, columns, labels)
    runtime = {"dtype": config.model.dtype, "scan_layers": bool(config.model.scan_layers)}
    try:
      return cls(dataset, teacher=t.teacher, layers=layers, temperature=t.temperature, soft_weight=t.soft_weight,
                 hard_weight=t.hard_weight, hidden_weight=t.hidden_weight, hidden_loss=t.hidden_loss,
                 layer_map=layer_map, teacher_runtime=runtime, train_labelled=train_labelled,
                 teacher_cache_mib=t.teacher_cache_mib,
                 max_seq_length=config.data.max_seq_length, global_batch_size=config.batch_size, seed=config.seed,
                 tokenizer=tokenizer, data_dir=t.tfds_data_dir, batching=Batching.from_config(config))
    except ValueError as e:
      if "task.label_names" not in str(e):
        raise
      what = f"{info.num_labels} classes {', '.join(labels)}" if labels else "one output (a regressor)"
      raise ValueError(f"{e} The teacher {t.teacher} has {what}: distil on labels of the teacher's classes, or "
                       "drop task.label to train on its outputs alone.") from None

  @staticmethod
  def _layer_map(info, layers, init_from) -> tuple[int, ...]:
    """The teacher hidden state of each student hidden state (module docstring)."""
    if layers is not None:
      return (0, *(i + 1 for i in layers))
    from jbert import weights  # pylint: disable=g-import-not-at-top
    student = weights.describe(init_from).config
    if student.hidden_size != info.config.hidden_size:
      raise ValueError(f"task.hidden_weight>0 compares hidden states, but the student init_from={init_from} is "
                       f"{student.hidden_size} wide and the teacher {info.config.hidden_size}; set "
                       "task.hidden_weight=0 or start the student from the teacher's layers (task.student_layers).")
    return distill.uniform_layer_map(student.num_hidden_layers, info.config.num_hidden_layers)

  def _local_split(self, dataset, split):
    if split == "train" and not self.labelled:  # transfer data: read without the label column
      dataset = dataclasses.replace(dataset, column_map={k: v for k, v in dataset.column_map.items() if k != "label"})
    return super()._local_split(dataset, split)

  # -- the student --

  def init_path(self, init_from):
    return init_from or self.teacher

  def load_init(self, path, bert_config, *, seed, fresh):
    """`init_from`'s model, or the teacher's listed layers (DistilBERT's init: all else copied)."""
    if self.layers is None or path != self.teacher:
      return super().load_init(path, bert_config, seed=seed, fresh=fresh)
    from jbert import weights  # pylint: disable=g-import-not-at-top
    runtime = {k: getattr(bert_config, k) for k in weights.OVERRIDABLE}
    config, params = weights.load_pretrained(self.teacher, self.head.cls, num_labels=self.num_labels, **runtime)
    log.info("student: teacher layers %s of %s", ",".join(map(str, self.layers)), self.teacher)
    return student_lib.student_from_teacher(params, config, self.layers)[1]

  # -- the teacher's outputs, once --

  def train_features(self) -> dict[str, np.ndarray] | None:
    """The featurised training rows with the teacher's outputs beside them, which its pass computes on the first
    call: when the trainer makes the training stream, after its finished check, so that a finished run never
    runs the teacher (minutes on a real training set)."""
    if self._train is not None and "teacher_logits" not in self._train:
      self._train = {**self._train, **self.teacher_outputs(self._train)}
    return self._train

  def teacher_outputs(self, features) -> dict[str, np.ndarray]:
    """{teacher_logits [N, C] float32, and with hidden_weight > 0 teacher_row [N]: each row's index} of the rows of
    `features`, in their order; their hidden states go to `hidden_cache` (`teacher_cache.compute`)."""
    layer_map = self.layer_map if self.hidden_weight > 0 else None
    logits, self.hidden_cache = teacher_cache.compute(
        self.teacher, features, num_labels=self.num_labels, layer_map=layer_map, runtime=self.teacher_runtime,
        cap_mib=self.teacher_cache_mib)
    rows = {teacher_cache.ROW_KEY: np.arange(len(logits), dtype=np.int32)} if self.hidden_cache is not None else {}
    return {"teacher_logits": logits, **rows}

  def train_stream(self, shards):
    self.train_features()
    stream = super().train_stream(shards)
    return stream if self.hidden_cache is None else teacher_cache.TeacherStream(stream, self.hidden_cache)

  # -- batches and losses --

  def batch_spec(self, batch_size, max_seq_length):
    spec = super().batch_spec(batch_size, max_seq_length)
    if not self.labelled:
      del spec["label"]
    spec["teacher_logits"] = jax.ShapeDtypeStruct((batch_size, self.num_labels), jnp.float32)
    if self.hidden_weight > 0:
      from jbert import weights  # pylint: disable=g-import-not-at-top
      width = weights.describe(self.teacher).config.hidden_size
      spec["teacher_hidden"] = jax.ShapeDtypeStruct((batch_size, len(self.layer_map), width, max_seq_length),
                                                    jnp.dtype(self.teacher_runtime.get("dtype") or "float32"))
    return spec

  def extra_inputs(self, batch):
    return {"output_hidden_states": True} if self.hidden_weight > 0 else {}

  def loss(self, outputs, batch):
    """soft, hard (labelled data), hidden (hidden_weight > 0), accuracy and agreement (module docstring)."""
    rows = rows_of(batch)
    teacher = batch["teacher_logits"]
    if self.regression:
      error = outputs.logits[:, 0].astype(jnp.float32) - teacher[:, 0]
      entries = {"soft": Weighted(jnp.sum(error * error), rows)}
    else:
      entries = {"soft": Weighted(*distill.soft_target_sums(outputs.logits, teacher,
                                                             temperature=self.temperature)),
                 "agreement": Weighted(jnp.sum((jnp.argmax(outputs.logits, -1) == jnp.argmax(teacher, -1))
                                               .astype(jnp.float32)), rows)}
    if self.labelled:
      own = super().loss(outputs, batch)
      entries["hard"] = own.pop("loss")
      entries.update(own)
    if self.hidden_weight > 0:
      mask = batch["attention_mask"]
      fn = distill.cosine_sums if self.hidden_loss == "cosine" else distill.mse_sums
      total, weight = 0.0, 0.0
      for m, student_hidden in enumerate(outputs.hidden_states):  # M + 1 x [B, T, H]
        target = jnp.swapaxes(batch["teacher_hidden"][:, m], 1, 2)  # [B, H, T] -> [B, T, H]
        s, w = fn(student_hidden, target, mask)
        total, weight = total + s, weight + w
      entries["hidden"] = Weighted(total, weight)
    return entries


def _check_same_tokenizer(teacher: str, init_from: str, tokenizer) -> None:
  """The rows are featurised once, with the student's (the run's) tokenizer, for both models: a student whose
  vocabulary is not the teacher's is refused, since the teacher would read other ids than it was trained on."""
  found = tokenizer_lib.find_tokenizer(teacher)
  if found is None:
    return  # the teacher's folder has none: the run's is the only one there is
  theirs = tokenizer_lib.load_tokenizer(found)
  ours_pieces = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
  their_pieces = theirs.convert_ids_to_tokens(range(theirs.vocab_size))
  if ours_pieces != their_pieces:
    raise ValueError(f"init_from={init_from} has another vocabulary than the teacher {teacher} "
                     f"({_vocabulary_difference(ours_pieces, their_pieces)}); the rows are tokenised once for both, "
                     "so distil into a student with the teacher's vocabulary, or start it from the teacher's layers "
                     "(task.student_layers).")


def _vocabulary_difference(ours: list[str], theirs: list[str]) -> str:
  """The counts when they differ, and the ids holding other pieces (equal sizes can still differ in every piece)."""
  differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
  said = [] if len(ours) == len(theirs) else [f"{len(ours):,} pieces, the teacher's {len(theirs):,}"]
  if differ:
    said.append(f"{len(differ):,} of the ids both have hold other pieces, the first id {differ[0]}: "
                f"{ours[differ[0]]!r}, the teacher's {theirs[differ[0]]!r}")
  return "; ".join(said)


def _has_column(path: str, column: str) -> bool:
  """Whether the first row of a local file has `column` (an empty file: the reader says so later)."""
  first = next(iter(files_lib.rows(path, local.FORMATS.get(os.path.splitext(path)[1].lower()))), None)
  return first is None or column in first[1]
