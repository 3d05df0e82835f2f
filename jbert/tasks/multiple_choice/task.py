"""Multiple choice (SWAG, HellaSwag, or your own files): one score per (context, ending), softmax over endings.

A batch row is one example: `[C, T]` inputs for its C endings, so `batch_size` counts examples (C sequences
each). The loss is transformers' `BertForMultipleChoice` loss, the mean cross-entropy over the batch's
examples; the metric is accuracy.

Prediction inputs (`read_inputs`): .jsonl with `context` and `endings`, or SWAG's .csv (`sent1`, `sent2`,
`ending0`, ...); Python inputs: such dicts or (context, endings) tuples. Examples with another number of endings
than training's are scored too, in groups of one count (`group_key`).
"""
from __future__ import annotations

import csv
import os

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import packing
from jbert.model import BertForMultipleChoice, registry
from jbert.runtime import atomic
from jbert.runtime import mirror
from jbert.tasks import inputs, sections
from jbert.tasks.base import MODEL_INPUTS, PACKED_INPUTS, EvalSet, Weighted, mean_cross_entropy_sums, softmax
from jbert.tasks.finetuning import Batching, PredictingTask
from jbert.tasks.multiple_choice import features as multiple_choice
from jbert.tasks.multiple_choice import sources
from jbert.tasks.registry import register
from jbert.tasks.sources import Dataset, split_files


@register
class MultipleChoice(PredictingTask):
  """A dataset of kind multiple_choice: TFDS hellaswag, or local files when `task.train_file` is set (`swag`,
  whose data TFDS lacks; `local` with `task.kind=multiple_choice`); built without a tokenizer it only predicts
  (`jbert.predict`) or compiles."""

  kinds = ("multiple_choice",)
  datasets = sources.DATASETS
  local_kind = "multiple_choice"
  title = "multiple choice"
  head = registry.head(BertForMultipleChoice)
  label_keys = ("label",)
  # Packed: an example's endings side by side in one row of C·T tokens (`packing.place_choices`), logits [R, E·C]
  # at their [CLS] tokens, labels [R, E] for E examples a row.
  packable, reads_cls = True, True

  def __init__(self, dataset: Dataset | None = None, *, max_seq_length: int, global_batch_size: int = 32,
               seed: int = 0, tokenizer=None, data_dir: str | None = None, batching: Batching | None = None):
    """`dataset`: what it trains and evaluates on; without one it only predicts (endings are chosen by index)."""
    if dataset is not None and dataset.kind != "multiple_choice":
      raise ValueError(f"task {dataset.name!r} is {dataset.kind}, not multiple choice.")
    super().__init__(dataset.name if dataset is not None else "predict", max_seq_length=max_seq_length,
                     global_batch_size=global_batch_size, seed=seed, batching=batching)
    self.dataset, self.tokenizer, self.data_dir = dataset, tokenizer, data_dir
    self.num_choices = None  # The training examples' number of endings.
    if tokenizer is None or dataset is None or "train" not in dataset.splits:
      return
    # Every split is read and featurised now, so that a bad file fails before anything compiles; the training
    # examples fix the number of endings.
    examples = self._load("train")
    if not examples:
      raise ValueError(f"the training split of {self.name} ({dataset.splits['train']}) has no examples.")
    train = self.featurise(examples)
    unlabelled = np.flatnonzero(train["label"] < 0)
    if len(unlabelled):
      raise ValueError(f"task {self.name}: {examples[unlabelled[0]]['where']} has no label; every training "
                       "example needs the index of its right ending.")
    self.num_choices = train["input_ids"].shape[1]
    for split in dataset.splits:
      if split != "train":
        features = self.featurise(self._load(split))
        labelled = bool(len(features["label"])) and bool(np.all(features["label"] >= 0))
        self._eval_sets.append(EvalSet(split, features, split in dataset.eval_splits and labelled))
    self._train = train

  @classmethod
  def config_section(cls, name):
    return {**sections.files(), **sections.columns()}  # `local` picks multiple choice with task.kind

  @classmethod
  def ignores(cls, task_cfg):
    why = {k: "multiple choice reads `context`, `endings` and `label` (JSONL) or SWAG's columns, named by no key"
           for k in ("text_a", "text_b", "label", "label_names", "regression")}
    return {**why, **sections.files_ignored(cls.datasets, task_cfg)}

  @classmethod
  def from_config(cls, config, tokenizer=None) -> "MultipleChoice":
    cfg = config.task
    dataset = cls.datasets.get(cfg.name)
    if dataset is None or dataset.tfds_name is None or cfg.train_file:
      name = dataset.name if dataset is not None else "local"
      if name == "swag" and not cfg.train_file:
        raise ValueError("task swag: SWAG is not in the TFDS catalogue (hellaswag is: configs/finetune.py:hellaswag)."
                         " Pass the files of github.com/rowanz/swagaf (data/): --config.task.train_file=train.csv "
                         "--config.task.eval_file=val.csv [--config.task.test_file=test.csv].")
      if not cfg.train_file:
        raise ValueError(f"task {name} (multiple choice) reads local files: --config.task.train_file=FILE (JSONL "
                         "with context, endings, label; or SWAG's CSV), and optionally eval_file and test_file.")
      files = split_files(name, {"train": cfg.train_file, "validation": cfg.eval_file, "test": cfg.test_file})
      dataset = sources.multiple_choice_files_dataset(name, files)
    return cls(dataset, max_seq_length=config.data.max_seq_length, global_batch_size=config.batch_size,
               seed=config.seed, tokenizer=tokenizer, data_dir=cfg.tfds_data_dir, batching=Batching.from_config(config))

  # -- prediction --

  @classmethod
  def for_prediction(cls, folder, *, kind, max_length=None, **options) -> "MultipleChoice":
    del kind, options  # Endings are chosen by index.
    return cls(max_seq_length=cls.prediction_length(folder, max_length))

  def read_inputs(self, path, *, column=None, pair_column=None, pairs=False):
    del column
    suffix = inputs.open_input(path)
    inputs.only_pairs_for_classification(pair_column, pairs)
    if suffix not in multiple_choice.FORMATS:
      raise ValueError(f"Cannot read multiple-choice inputs from {path}: use .jsonl (context, endings) or SWAG's "
                       ".csv (sent1, sent2, ending0, ...).")
    return [_choices(ex["context"], ex["endings"], ex["where"])
            for ex in multiple_choice.read_multiple_choice_file(path)]

  def inputs_from(self, records):
    out = []
    for i, record in enumerate(records):
      where = f"input {i}"
      if isinstance(record, (tuple, list)) and len(record) == 2:
        record = {"context": record[0], "endings": record[1]}
      record = inputs.as_dict(record, where, "a dict with context and endings")
      context, endings = inputs.field(record, "context", where), record.get("endings")
      if not isinstance(endings, (list, tuple)) or not all(isinstance(e, str) for e in endings):
        raise ValueError(f"{where}: needs `endings`, a list of texts.")
      out.append(_choices(context, list(endings), where))
    return out

  def group_key(self, example):
    return len(example["endings"])

  @property
  def sequences_per_row(self) -> int:
    return self.num_choices or 1

  # -- data --

  def _load(self, split: str) -> list[dict]:
    dataset = self.dataset
    if dataset.tfds_name is None:
      return multiple_choice.read_multiple_choice_file(dataset.splits[split])
    source = dataset.load(split, data_dir=mirror.local_tfds_dir(self.data_dir, dataset.tfds_name))
    where = f"{dataset.tfds_name} {dataset.splits[split]}"
    return [{**ex, "where": f"example {i} of {where}"} for i, ex in enumerate(source)]

  def featurise(self, examples):
    """[N, C, T] inputs of examples with `context` and C `endings` each (C: the training examples' count)."""
    try:
      return multiple_choice.multiple_choice_features(examples, self.tokenizer, self.max_seq_length,
                                                      num_choices=self.num_choices)
    except ValueError as e:
      raise ValueError(f"task {self.name}: {e}") from None

  def batch_spec(self, batch_size, max_seq_length):
    spec = {k: jax.ShapeDtypeStruct((batch_size, self.sequences_per_row, max_seq_length), jnp.int32)
            for k in MODEL_INPUTS}
    spec["label"] = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
    return spec

  def train_spec(self, rows, length):
    """Packed: rows of `length` = C·T tokens, E = `max_sequences` examples of C endings a row."""
    if self.packed_slots() is None:
      return self.batch_spec(rows, length)
    e, c = self.packed_slots(), self.sequences_per_row
    spec = {k: jax.ShapeDtypeStruct((rows, length), jnp.int32) for k in (*MODEL_INPUTS, *PACKED_INPUTS[:2])}
    spec.update({k: jax.ShapeDtypeStruct((rows, e * c), jnp.int32) for k in packing.EXAMPLE_SLOT_KEYS})
    spec["label"] = jax.ShapeDtypeStruct((rows, e), jnp.int32)
    return spec

  # -- losses --

  def loss(self, outputs, batch):
    """Cross-entropy over the endings and accuracy, per example (packed: per filled example slot)."""
    labels = batch["label"]                                                  # [B], packed [R, E]
    logits = outputs.logits                                                  # [B, C], packed [R, E·C]
    if "sequence_weights" in batch:
      r, e = labels.shape
      logits = logits.reshape(r, e, -1)                                      # [R, E, C]
      weights = batch["sequence_weights"].reshape(r, e, -1)[..., 0].astype(jnp.float32)  # [R, E]
    else:
      weights = jnp.ones(labels.shape, jnp.float32)
    nll, correct = mean_cross_entropy_sums(logits, labels, weights)
    examples = jnp.sum(weights)
    return {"loss": Weighted(nll, examples), "accuracy": Weighted(correct, examples)}

  # -- evaluation --

  def predictions(self, outputs, batch):
    return {"logits": outputs.logits}                                       # [B, C]

  def predict_fn(self, model):
    """One (context, ending) pair per [B, T] row: a one-ending example, whose single logit is the row's score;
    packed rows [R, T] hold pairs as sequences of their own, one score per slot [R, S]."""
    packed = super().predict_fn(model)                                       # logits [R, S]

    def fn(params, batch):
      if "segment_ids" in batch:
        return packed(params, batch)
      outputs = model.apply({"params": params}, *(batch[k][:, None, :] for k in MODEL_INPUTS), deterministic=True)
      return {"logits": outputs.logits[:, 0]}                                # [B]
    return fn

  def records(self, eval_set, predictions) -> list[dict]:
    """{"label": the chosen ending's index, "probabilities": per ending}."""
    probs = softmax(predictions["logits"])                                   # [N, C]
    return [{"label": int(p.argmax()), "probabilities": [float(x) for x in p]} for p in probs]

  def evaluate(self, eval_set, predictions):
    predicted = np.argmax(np.asarray(predictions["logits"]), -1)
    return {"accuracy": float(np.mean(predicted == eval_set.features["label"]))}

  def write_outputs(self, eval_set, predictions, out_dir):
    """`predictions/<split>.tsv`: index, the predicted ending and each ending's probability."""
    records = self.records(eval_set, predictions)
    path = os.path.join(out_dir, "predictions", f"{eval_set.name}.tsv")
    with atomic.open_for_write(path, encoding="utf-8", newline="") as f:
      out = csv.writer(f, delimiter="\t", lineterminator="\n")
      choices = len(records[0]["probabilities"]) if records else 0
      out.writerow(["index", "prediction", *(f"p_{c}" for c in range(choices))])
      out.writerows([int(i), r["label"], *(f"{x:.6f}" for x in r["probabilities"])]
                    for i, r in zip(eval_set.features["example_id"], records))
    return [path]


def _choices(context: str, endings: list[str], where: str) -> dict:
  if not endings:
    raise ValueError(f"{where}: `endings` is empty; give the candidate endings to choose from.")
  return {"context": context, "endings": list(endings), "where": where}
