"""Sentence(-pair) classification and regression: every GLUE task and the user's own labelled files.

Losses are transformers' `BertForSequenceClassification` losses: mean cross-entropy over the batch, or mean
squared error of the single logit for a 1-label regressor (STS-B). The cross-encoder (`jbert.tasks.cross_encoder`)
is a subclass: the one-label model with a cross-encoder's loss, scores and export.

Prediction inputs (`read_inputs`): .jsonl/.csv/.tsv with the text column (`column`, else the fine-tuning run's
`text_a` column where the file has it, else `text`) and, for pairs, `pair_column` (else the run's `text_b`, else
`text_b`); .txt: one text per line (`pairs`: `A<TAB>B`). Python inputs: texts, (text, pair) tuples, or dicts with
the text fields.
"""
from __future__ import annotations

import csv
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import files as files_lib
from jbert.data import local
from jbert.model import BertForSequenceClassification, registry
from jbert.runtime import atomic
from jbert.runtime import mirror
from jbert.tasks import inputs, sections
from jbert.tasks.classification import metrics, sources
from jbert.tasks.classification.features import classification_features
from jbert.tasks.sources import Dataset, as_text
from jbert.tasks.base import MODEL_INPUTS, EvalSet, Weighted, mean_cross_entropy_sums, softmax
from jbert.tasks.finetuning import Batching, PredictingTask
from jbert.tasks.registry import register

log = logging.getLogger("jbert")

# GLUE server file names; the server reads class ids for the binary tasks and label names for the NLI ones.
GLUE_FILES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "qnli": "QNLI",
              "rte": "RTE", "wnli": "WNLI", "ax": "AX", "mnli:test_matched": "MNLI-m",
              "mnli:test_mismatched": "MNLI-mm"}
_NAMED_LABELS = ("mnli", "qnli", "rte", "ax")


def local_files(task_cfg) -> dict[str, str]:
  """{split: path} of the user's CSV/TSV/JSONL files (`local`, `cross_encoder`), each checked to exist."""
  name = task_cfg.name
  if not task_cfg.train_file:
    raise ValueError(f"task {name} needs --config.task.train_file=FILE (CSV, TSV or JSONL by suffix).")
  files = {"train": task_cfg.train_file}
  for split, path in (("validation", task_cfg.eval_file), ("test", task_cfg.test_file)):
    if path:
      files[split] = path
  for split, path in files.items():
    if not os.path.isfile(path):
      raise FileNotFoundError(f"task {name}: the {split} file {path} does not exist.")
    if os.path.splitext(path)[1].lower() not in local.FORMATS:
      raise ValueError(f"task {name}: cannot tell the format of {path} from its suffix; name it .csv, .tsv or "
                       ".jsonl.")
  return files


def local_columns(task_cfg, *, pairs: bool = False) -> dict[str, str]:
  """{text_a, [text_b,] label: column} of the user's files; `pairs`: the second text is required."""
  name = task_cfg.name
  if not task_cfg.text_a or not task_cfg.label or (pairs and not task_cfg.text_b):
    raise ValueError(f"task {name} needs --config.task.text_a=COLUMN and --config.task.label=COLUMN "
                     f"(and --config.task.text_b=COLUMN for {'the second text' if pairs else 'sentence pairs'}).")
  columns = {"text_a": task_cfg.text_a, "label": task_cfg.label}
  if task_cfg.text_b:
    columns["text_b"] = task_cfg.text_b
  return columns


def _label_names(task_cfg, train_file: str) -> list[str] | None:
  """The class names in id order, or None for regression: chosen by task.regression or task.label_names, else
  from the training file's labels (integers: classes named by their values; other numbers: regression). The
  choice is said on the console, since a regressor trained on class labels would otherwise go unnoticed."""
  names = [n.strip() for n in (task_cfg.label_names or "").split(",") if n.strip()]
  if task_cfg.get("regression"):
    if names:
      raise ValueError(f"task.regression=True and task.label_names={task_cfg.label_names!r} contradict each other: "
                       "a regressor has no classes; drop one of them.")
    log.info("task local: regression on column %r (task.regression=True).", task_cfg.label)
    return None
  if len(names) == 1:
    raise ValueError(f"task.label_names={task_cfg.label_names!r} names one class; give at least two "
                     "comma-separated names, or set task.regression=True for a numeric target.")
  if names:
    return names
  names = local.label_names_from_values(train_file, task_cfg.label)
  if names is None:
    log.info("task local: the labels of %s are non-integer numbers: training a regressor (say so with "
             "task.regression=True; name classes with task.label_names).", train_file)
  elif len(names) < 2:
    raise ValueError(f"every label of {train_file} is {names[0]}: a classifier needs at least two classes; name "
                     "them with --config.task.label_names, or set task.regression=True.")
  else:
    log.info("task local: %d classes named by their integer labels: %s (name them with task.label_names).",
             len(names), ",".join(names))
  return names



@register
class SequenceClassification(PredictingTask):
  """A dataset of kind classification/regression (`sources.py`: GLUE by name, or the user's files) trained with
  a [CLS] classifier; built without a tokenizer it only predicts (`jbert.predict`) or compiles."""

  kinds = ("classification", "regression")
  kind = "classification"  # the instance's: "regression" for a one-label regressor (set from its data)
  datasets = sources.DATASETS
  local_kind = "classification"
  title = "sequence classification"
  head = registry.head(BertForSequenceClassification)
  label_keys = ("label",)
  packable, reads_cls = True, True  # packed: logits [R, S, L] at each sequence's [CLS], labels [R, S]
  one_sequence_per_input = True  # a text or a pair, cut to max_length

  @property
  def scores_pairs(self) -> bool:  # a one-label regressor (a cross-encoder among them) scores pairs
    return self.regression

  def __init__(self, dataset: Dataset | None = None, *, max_seq_length: int, global_batch_size: int = 32,
               seed: int = 0, tokenizer=None, data_dir: str | None = None, extra_test: tuple[Dataset, ...] = (),
               columns: tuple[str | None, str | None] = (None, None), label_names: tuple[str, ...] | None = None,
               kind: str | None = None, batching: Batching | None = None):
    """`dataset`: what it trains and evaluates on; without one (prediction) a classifier of `label_names`, or a
    regressor where they are None. `kind`: what its model is recorded as (default: its data's)."""
    if dataset is not None and dataset.kind not in ("classification", "regression"):
      raise ValueError(f"task {dataset.name!r} is {dataset.kind}, not sentence classification.")
    super().__init__(dataset.name if dataset else "predict", max_seq_length=max_seq_length,
                     global_batch_size=global_batch_size, seed=seed, batching=batching)
    self.dataset, self.extra_test = dataset, extra_test
    if dataset is not None:
      label_names = dataset.label_names
    self.regression = dataset.kind == "regression" if dataset else label_names is None
    self.num_labels = dataset.num_labels if dataset else 1 if self.regression else len(label_names)
    self.label_names = tuple(label_names) if label_names is not None else None
    self.kind = kind or ("regression" if self.regression else "classification")
    self.tokenizer, self.data_dir = tokenizer, data_dir
    self.columns = columns  # prediction: the fine-tuning run's (text_a, text_b) columns, where known
    if tokenizer is not None:
      if "train" in dataset.splits:
        self._train = self._split(dataset, "train")[1]
        if not len(self._train["input_ids"]):
          raise ValueError(f"the training split of {dataset.name} ({dataset.splits['train']}) has no examples.")
      self._eval_sets = self._read_eval_sets()

  @classmethod
  def config_section(cls, name):
    return {**sections.files(), **sections.columns()}

  @classmethod
  def ignores(cls, task_cfg):
    dataset = cls.datasets.get(task_cfg.name)
    if dataset is None:  # `local` and the subclasses' own names: the user's files
      return {"tfds_data_dir": "its data are local files (task.train_file, ...), not TFDS"}
    why = f"{dataset.name} reads TFDS's {dataset.tfds_name} (your own files train `local`)"
    return {k: why for k in (*sections.files(), *sections.columns()) if k != "tfds_data_dir"}

  @classmethod
  def from_config(cls, config, tokenizer=None) -> "SequenceClassification":
    """A GLUE task (MNLI also predicts the diagnostic set, AX.tsv, as the GLUE server expects), or `local`
    files."""
    dataset = cls.datasets.get(config.task.name)
    if dataset is None:
      files = local_files(config.task)
      dataset = sources.local_dataset("local", files, local_columns(config.task),
                                      _label_names(config.task, files["train"]))
    extra = (sources.DATASETS["ax"],) if dataset.name == "mnli" else ()
    return cls(dataset, max_seq_length=config.data.max_seq_length, global_batch_size=config.batch_size,
               seed=config.seed, tokenizer=tokenizer, data_dir=config.task.tfds_data_dir, extra_test=extra,
               batching=Batching.from_config(config))

  # -- prediction --

  @classmethod
  def recognises(cls, folder):
    return "regression" if folder.info.num_labels == 1 else "classification"  # as transformers reads one label

  @classmethod
  def for_prediction(cls, folder, *, kind, max_length=None, **options) -> "SequenceClassification":
    del options  # none
    labels = None if kind == "regression" else cls.recorded_labels(folder)
    return cls(label_names=labels, max_seq_length=cls.prediction_length(folder, max_length),
               columns=recorded_columns(folder))

  def read_inputs(self, path, *, column=None, pair_column=None, pairs=False):
    inputs.open_input(path)
    if files_lib.input_format(path) == "text":
      if column or pair_column:
        raise ValueError(f"{path} is a text file (one text per line): it has no columns; drop --column / "
                         "--pair_column, or use --pairs for tab-separated pairs.")
      if self.columns[1] and not pairs:
        raise ValueError(f"The model was fine-tuned on text pairs ({self.columns[0]}, {self.columns[1]}): write "
                         f"`A<TAB>B` lines and pass --pairs, or use a .jsonl/.csv/.tsv with both columns.")
      examples = [inputs.text_example(text, f"{path}, line {i + 1}")
                  for i, text in enumerate(files_lib.iter_records(path, pairs=pairs))]
    elif pairs:
      raise ValueError(f"--pairs reads `A<TAB>B` lines of a .txt file; {path} has columns: name the second one "
                       "with --pair_column.")
    else:
      examples = inputs.text_rows(files_lib.iter_rows(path), column, pair_column, self.columns, path)
    return self._check_pairs(examples)

  def inputs_from(self, records):
    records = list(records)
    if records and all(isinstance(r, dict) for r in records):
      return self._check_pairs(inputs.text_rows(((f"input {i}", r) for i, r in enumerate(records)), None, None,
                                                self.columns))
    out = []
    for i, record in enumerate(records):
      if not (isinstance(record, str) or (isinstance(record, (tuple, list)) and len(record) == 2)):
        raise TypeError(f"Input {i} is a {type(record).__name__}; pass texts, (text, pair) tuples, or dicts with "
                        "the text fields (all inputs alike).")
      out.append(inputs.text_example(record, f"input {i}"))
    return self._check_pairs(out)

  def _check_pairs(self, examples):
    paired = ["text_b" in ex for ex in examples]
    if any(paired) and not all(paired):
      raise ValueError(f"{examples[paired.index(False)]['where']} has one text where the others are pairs; give "
                       "every input the same number of texts.")
    if examples and self.columns[1] and not paired[0]:
      raise ValueError(f"The model was fine-tuned on text pairs ({', '.join(self.columns)}); "
                       f"{examples[0]['where']} has a single text (name the second column, or give (text, pair) "
                       "tuples).")
    return examples

  # -- data --

  def _split(self, dataset: Dataset, split: str) -> tuple[list, dict[str, np.ndarray]]:
    """(examples, features) of one split."""
    if dataset.tfds_name is None:
      return self._local_split(dataset, split)
    examples = list(dataset.load(split, data_dir=mirror.local_tfds_dir(self.data_dir, dataset.tfds_name)))
    return examples, dataset.features(examples, self.tokenizer, self.max_seq_length)

  def _local_split(self, dataset: Dataset, split: str) -> tuple[list, dict[str, np.ndarray]]:
    """A local file; evaluation and test files may lack the label column (predictions only)."""
    path, columns = dataset.splits[split], dict(dataset.column_map)
    try:
      examples = local.read_examples(path, columns, dataset.label_names)
    except KeyError as e:
      message = f"task local: {e.args[0]}"  # It names the file, the columns there are and the setting to change.
      if split == "train":
        raise ValueError(message) from e
      del columns["label"]
      try:
        examples = local.read_examples(path, columns)
      except KeyError:
        raise ValueError(message) from e
      log.warning("task local: %s has no %r column; it is predicted, not scored.", path, dataset.column_map["label"])
    return examples, classification_features(examples, self.tokenizer, self.max_seq_length,
                                             text_keys=dataset.text_keys, regression=self.regression,
                                             label_key="label" if "label" in columns else None)

  def _read_eval_sets(self) -> list[EvalSet]:
    """Featurised splits that keep their texts (`EvalSet.examples`: a tuple of text_a[, text_b] per row) for the
    prediction files."""
    sets = []
    for dataset in (self.dataset, *self.extra_test):
      for split in dataset.splits:
        if split == "train" or (dataset is self.dataset and split not in dataset.eval_splits
                                and not split.startswith("test")):
          continue
        examples, features = self._split(dataset, split)
        # GLUE test splits carry label -1 and local files may lack the column; a regressor's targets may be < 0.
        labelled = split in dataset.eval_splits and bool(examples) and dataset.label_key in examples[0] and (
            self.regression or bool(np.all(features["label"] >= 0)))
        name = split if dataset is self.dataset else f"{dataset.name}:{split}"
        texts = [tuple(as_text(ex[k]) for k in dataset.text_keys) for ex in examples]
        sets.append(EvalSet(name, features, labelled, texts))
    return sets

  def batch_spec(self, batch_size, max_seq_length):
    spec = {k: jax.ShapeDtypeStruct((batch_size, max_seq_length), jnp.int32) for k in MODEL_INPUTS}
    spec["label"] = jax.ShapeDtypeStruct((batch_size,), jnp.float32 if self.regression else jnp.int32)
    return spec

  # -- losses --

  def loss(self, outputs, batch):
    """Mean squared error of a regressor's one logit, else mean cross-entropy and accuracy, per sequence (packed:
    per filled slot; logits [B, L] or [R, S, L], labels [B] or [R, S])."""
    weights = self.slot_weights(batch, batch["label"])
    sequences = jnp.sum(weights)
    if self.regression:
      error = outputs.logits[..., 0] - batch["label"].astype(jnp.float32)
      return {"loss": Weighted(jnp.sum(error * error * weights), sequences)}
    nll, correct = mean_cross_entropy_sums(outputs.logits, batch["label"], weights)
    return {"loss": Weighted(nll, sequences), "accuracy": Weighted(correct, sequences)}

  # -- evaluation --

  def predictions(self, outputs, batch):
    return {"logits": outputs.logits}

  def featurise(self, examples):
    """`text_a` (and `text_b`) of each example; a `label` when the dataset has one."""
    labelled = bool(examples) and "label" in examples[0]
    keys = ("text_a", "text_b") if examples and "text_b" in examples[0] else ("text_a",)
    return classification_features(examples, self.tokenizer, self.max_seq_length, text_keys=keys,
                                   label_key="label" if labelled else None, regression=self.regression)

  def records(self, eval_set, predictions) -> list[dict]:
    """One record per row: {"label": name, "probabilities": {name: p}}, or {"value": x} for a regressor; what
    `jbert.predict` returns and the prediction files hold."""
    logits = np.asarray(predictions["logits"])                                # [N, C]
    if self.regression:
      return [{"value": float(x)} for x in logits[:, 0]]
    names = self.label_names
    return [{"label": names[int(k)], "probabilities": dict(zip(names, map(float, p)))}
            for k, p in zip(np.argmax(logits, -1), softmax(logits))]

  def _predicted(self, predictions) -> np.ndarray:
    logits = np.asarray(predictions["logits"])
    return logits[:, 0] if self.regression else np.argmax(logits, -1)

  def evaluate(self, eval_set, predictions):
    """The dataset's metrics (GLUE's), then the evaluation loss and, for classes, precision, recall, F1 (binary:
    of class 1; macro for more) and the confusion matrix [gold][predicted] (not a scalar: results.json only)."""
    gold, logits = eval_set.features["label"], predictions["logits"]
    scores = metrics.classification_metrics(self.dataset.metrics, self._predicted(predictions), gold)
    report = {"loss": metrics.evaluation_loss(logits, gold, regression=self.regression)}
    if not self.regression:
      report.update(metrics.classifier_report(self._predicted(predictions), gold, self.num_labels))
    return {**scores, **{k: v for k, v in report.items() if k not in scores}}

  def write_outputs(self, eval_set, predictions, out_dir):
    """`predictions/<split>.tsv` for every split: index, the input text(s) (text_a[, text_b]), the gold label
    where the split has labels, the prediction and per-class probabilities (p_<name>); plus the GLUE server's
    file (`SST-2.tsv`, `MNLI-m.tsv`, ...) for GLUE test splits."""
    records = self.records(eval_set, predictions)
    ids = eval_set.features["example_id"]
    texts = eval_set.examples or [()] * len(ids)
    header = ["index", *("text_a", "text_b")[:len(texts[0]) if len(texts) else 0]]
    gold = [[]] * len(ids)
    if eval_set.labelled:
      header.append("label")
      gold = [[str(np.float32(y))] if self.regression else [self.label_names[int(y)]]
              for y in eval_set.features["label"]]
    columns, outputs = self._output_columns(records)
    header += columns
    path = os.path.join(out_dir, "predictions", f"{eval_set.name.replace(':', '_')}.tsv")
    with atomic.open_for_write(path, encoding="utf-8", newline="") as f:
      out = csv.writer(f, delimiter="\t", lineterminator="\n")
      out.writerow(header)
      out.writerows([int(i), *t, *g, *o] for i, t, g, o in zip(ids, texts, gold, outputs))
    written = [path]
    task_name, _, split = eval_set.name.rpartition(":")
    task_name = task_name or self.name
    glue_name = GLUE_FILES.get(f"mnli:{split}" if task_name == "mnli" else task_name)
    if glue_name and split.startswith("test") and self.dataset is not None and self.dataset.tfds_name:
      written.append(self._write_glue(os.path.join(out_dir, "glue", f"{glue_name}.tsv"), ids,
                                      self._predicted(predictions), named=task_name in _NAMED_LABELS))
    return written

  def _output_columns(self, records) -> tuple[list[str], list[list[str]]]:
    """(header, values per row) of the predictions in a prediction file."""
    if self.regression:
      return ["prediction"], [[f"{r['value']:.6f}"] for r in records]
    return (["prediction", *(f"p_{n}" for n in self.label_names)],
            [[r["label"], *(f"{r['probabilities'][n]:.6f}" for n in self.label_names)] for r in records])

  def _write_glue(self, path, ids, predicted, *, named: bool) -> str:
    with atomic.open_for_write(path, encoding="utf-8", newline="") as f:
      f.write("index\tprediction\n")
      for i, p in zip(ids, predicted):
        value = f"{p:.3f}" if self.regression else (self.label_names[p] if named else str(int(p)))
        f.write(f"{int(i)}\t{value}\n")
    return path


def recorded_columns(folder) -> tuple[str | None, str | None]:
  """The (text_a, text_b) columns of the run that fine-tuned `folder`'s model: its `local` columns, or its
  dataset's text fields; (None, None) where unknown."""
  task = (folder.run_config or {}).get("task") or {}
  if task.get("text_a"):
    return task.get("text_a"), task.get("text_b")
  if task.get("name") in SequenceClassification.datasets:
    keys = SequenceClassification.datasets[task["name"]].text_keys
    return keys[0], keys[1] if len(keys) > 1 else None
  return None, None
