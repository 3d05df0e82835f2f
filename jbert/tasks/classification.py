"""Sentence(-pair) classification and regression: every GLUE task and the user's own labelled files.

Losses are transformers' `BertForSequenceClassification` losses: mean cross-entropy over the batch, or mean
squared error of the single logit for a 1-label regressor (STS-B). The `cross_encoder` task is the one-label
model with a cross-encoder's loss, scores and export (`jbert.tasks.cross_encoder`).
"""
from __future__ import annotations

import csv
import logging
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jbert.data import finetune
from jbert.data.finetune import datasets
from jbert.data.finetune.examples import as_text
from jbert.model import BertForSequenceClassification, registry
from jbert.runtime import atomic
from jbert.tasks import cross_encoder
from jbert.weights import st_folder
from jbert.tasks.base import (MODEL_INPUTS, EvalSet, FinetuneTask, Weighted, mean_cross_entropy_sums, rows_of,
                              softmax)

log = logging.getLogger("jbert")

# GLUE server file names; the server reads class ids for the binary tasks and label names for the NLI ones.
GLUE_FILES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "qnli": "QNLI",
              "rte": "RTE", "wnli": "WNLI", "ax": "AX", "mnli:test_matched": "MNLI-m",
              "mnli:test_mismatched": "MNLI-mm"}
_NAMED_LABELS = ("mnli", "qnli", "rte", "ax")


def config_section() -> dict:
  """The `task` keys of a classification config (also NER's and multiple choice's local files)."""
  optional_str = lambda: ml_collections.FieldReference(None, field_type=str)
  return {
      "text_a": optional_str(),               # column of the first text
      "text_b": optional_str(),               # column of the second text of a pair; None: single texts
      "label": optional_str(),                # column of the label
      "label_names": "",                      # comma-separated class names in id order (integer labels 0..N-1
                                              # are ids into it); empty: integer labels are classes named by
                                              # their values, other numbers a regression target
                                              # (NER: the tag set; empty: the training file's tags)
      "regression": False,                    # local files: True trains a regressor on numeric labels
      "kind": "classification",               # local files: classification | ner | multiple_choice
  }


def _local_dataset(task_cfg) -> datasets.Dataset:
  """`local` classification (or `cross_encoder` pairs): the user's CSV/TSV/JSONL files with the columns the
  config names."""
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
    if os.path.splitext(path)[1].lower() not in datasets.local.FORMATS:
      raise ValueError(f"task {name}: cannot tell the format of {path} from its suffix; name it .csv, .tsv or "
                       ".jsonl.")
  pairs = name == "cross_encoder"
  if not task_cfg.text_a or not task_cfg.label or (pairs and not task_cfg.text_b):
    raise ValueError(f"task {name} needs --config.task.text_a=COLUMN and --config.task.label=COLUMN "
                     f"(and --config.task.text_b=COLUMN for {'the second text' if pairs else 'sentence pairs'}).")
  columns = {"text_a": task_cfg.text_a, "label": task_cfg.label}
  if task_cfg.text_b:
    columns["text_b"] = task_cfg.text_b
  if pairs:
    cross_encoder.check_loss(task_cfg.loss)
    return datasets.local_dataset(name, files, columns, None)
  return datasets.local_dataset("local", files, columns, _label_names(task_cfg, files["train"]))


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
  names = datasets.local.label_names_from_values(train_file, task_cfg.label)
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



class SequenceClassification(FinetuneTask):
  """A dataset of kind classification/regression (`jbert.data.finetune.datasets`) trained with a [CLS]
  classifier; built without a tokenizer it only predicts (`jbert.predict`) or compiles.

  `loss` ("bce" | "mse", a one-label model) trains a cross-encoder; `activation` ("sigmoid" | "identity") makes
  a one-label model's records scores, as sentence-transformers' CrossEncoder applies it (see
  `jbert.tasks.cross_encoder`)."""

  head = registry.head(BertForSequenceClassification)
  label_keys = ("label",)

  def __init__(self, dataset: finetune.Dataset, *, max_seq_length: int, global_batch_size: int = 32, seed: int = 0,
               tokenizer=None, data_dir: str | None = None, extra_test: tuple[finetune.Dataset, ...] = (),
               loss: str | None = None, activation: str | None = None):
    if dataset.kind not in ("classification", "regression"):
      raise ValueError(f"task {dataset.name!r} is {dataset.kind}, not sentence classification.")
    super().__init__(dataset.name, max_seq_length=max_seq_length, global_batch_size=global_batch_size, seed=seed)
    self.dataset, self.extra_test = dataset, extra_test
    self.regression = dataset.kind == "regression"
    self.num_labels = dataset.num_labels
    self.label_names = dataset.label_names
    self.tokenizer, self.data_dir = tokenizer, data_dir
    self.loss_kind, self.activation = loss, activation or ("sigmoid" if loss else None)
    if (loss or activation) and not self.regression:
      raise ValueError(f"task {dataset.name}: a cross-encoder has one output; its labels are numbers in [0, 1].")
    if tokenizer is not None:
      if "train" in dataset.splits:
        self._train = self._split(dataset, "train")[1]
        if not len(self._train["input_ids"]):
          raise ValueError(f"the training split of {dataset.name} ({dataset.splits['train']}) has no examples.")
      self._eval_sets = self._read_eval_sets()
      if loss:
        for split, labels in [("train", self._train["label"])] + [
            (s.name, s.features["label"]) for s in self._eval_sets if s.labelled]:
          cross_encoder.check_labels(labels, dataset.splits[split])

  @classmethod
  def from_config(cls, dataset: finetune.Dataset | None, config, tokenizer) -> "SequenceClassification":
    """A GLUE task (MNLI also predicts the diagnostic set, AX.tsv, as the GLUE server expects), or `local`
    files (`dataset` None)."""
    loss = config.task.loss if config.task.name == "cross_encoder" else None
    dataset = dataset or _local_dataset(config.task)
    extra = (datasets.get_dataset("ax"),) if dataset.name == "mnli" else ()
    return cls(dataset, max_seq_length=config.data.max_seq_length, global_batch_size=config.batch_size,
               seed=config.seed, tokenizer=tokenizer, data_dir=config.task.tfds_data_dir, extra_test=extra, loss=loss)

  @classmethod
  def for_prediction(cls, *, label_names, max_seq_length, tokenizer,
                     activation: str | None = None) -> "SequenceClassification":
    """No label names: a one-label regressor, or with an `activation` a cross-encoder."""
    dataset = datasets.local_dataset("predict", {}, {"text_a": "text_a"}, label_names)
    return cls(dataset, max_seq_length=max_seq_length, tokenizer=tokenizer, activation=activation)

  # -- data --

  def _split(self, dataset: finetune.Dataset, split: str) -> tuple[list, dict[str, np.ndarray]]:
    """(examples, features) of one split."""
    if dataset.tfds_name is None:
      return self._local_split(dataset, split)
    examples = list(dataset.load(split, data_dir=self.data_dir))
    return examples, dataset.features(examples, self.tokenizer, self.max_seq_length)

  def _local_split(self, dataset: finetune.Dataset, split: str) -> tuple[list, dict[str, np.ndarray]]:
    """A local file; evaluation and test files may lack the label column (predictions only)."""
    path, columns = dataset.splits[split], dict(dataset.column_map)
    try:
      examples = finetune.read_examples(path, columns, dataset.label_names)
    except KeyError as e:
      message = f"task local: {e.args[0]}"  # It names the file, the columns there are and the setting to change.
      if split == "train":
        raise ValueError(message) from e
      del columns["label"]
      try:
        examples = finetune.read_examples(path, columns)
      except KeyError:
        raise ValueError(message) from e
      log.warning("task local: %s has no %r column; it is predicted, not scored.", path, dataset.column_map["label"])
    return examples, finetune.classification_features(examples, self.tokenizer, self.max_seq_length,
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
    """Mean squared error of a regressor's one logit, else mean cross-entropy and accuracy, per sequence."""
    rows = rows_of(batch)
    if self.loss_kind:
      return cross_encoder.loss(self.loss_kind, outputs.logits, batch["label"], rows)
    if self.regression:
      error = outputs.logits[:, 0] - batch["label"].astype(jnp.float32)
      return {"loss": Weighted(jnp.sum(error * error), rows)}
    nll, correct = mean_cross_entropy_sums(outputs.logits, batch["label"], jnp.ones(batch["label"].shape))
    return {"loss": Weighted(nll, rows), "accuracy": Weighted(correct, rows)}

  # -- evaluation --

  def predictions(self, outputs, batch):
    return {"logits": outputs.logits}

  def featurise(self, examples):
    """`text_a` (and `text_b`) of each example; a `label` when the dataset has one."""
    labelled = bool(examples) and "label" in examples[0]
    keys = ("text_a", "text_b") if examples and "text_b" in examples[0] else ("text_a",)
    return finetune.classification_features(examples, self.tokenizer, self.max_seq_length, text_keys=keys,
                                            label_key="label" if labelled else None, regression=self.regression)

  def records(self, eval_set, predictions) -> list[dict]:
    """One record per row: {"label": name, "probabilities": {name: p}}, or {"value": x} for a regressor; what
    `jbert.predict` returns and the prediction files hold; a cross-encoder's {"score": s, "logit": x}."""
    logits = np.asarray(predictions["logits"])                                # [N, C]
    if self.activation:
      return [{"score": float(s), "logit": float(x)}
              for s, x in zip(cross_encoder.scores(logits, self.activation), logits[:, 0])]
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
    if self.loss_kind:
      return cross_encoder.evaluate(self.loss_kind, logits, gold)
    metrics = finetune.classification_metrics(self.dataset.metrics, self._predicted(predictions), gold)
    report = {"loss": finetune.evaluation_loss(logits, gold, regression=self.regression)}
    if not self.regression:
      report.update(finetune.classifier_report(self._predicted(predictions), gold, self.num_labels))
    return {**metrics, **{k: v for k, v in report.items() if k not in metrics}}

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
    if self.activation:
      header += ["score", "logit"]
      outputs = [[f"{r['score']:.8f}", f"{r['logit']:.8f}"] for r in records]
    elif self.regression:
      header.append("prediction")
      outputs = [[f"{r['value']:.6f}"] for r in records]
    else:
      header += ["prediction", *(f"p_{n}" for n in self.label_names)]
      outputs = [[r["label"], *(f"{r['probabilities'][n]:.6f}" for n in self.label_names)] for r in records]
    path = os.path.join(out_dir, "predictions", f"{eval_set.name.replace(':', '_')}.tsv")
    with atomic.open_for_write(path, encoding="utf-8", newline="") as f:
      out = csv.writer(f, delimiter="\t", lineterminator="\n")
      out.writerow(header)
      out.writerows([int(i), *t, *g, *o] for i, t, g, o in zip(ids, texts, gold, outputs))
    written = [path]
    task_name, _, split = eval_set.name.rpartition(":")
    task_name = task_name or self.name
    glue_name = GLUE_FILES.get(f"mnli:{split}" if task_name == "mnli" else task_name)
    if glue_name and split.startswith("test") and self.dataset.tfds_name:
      written.append(self._write_glue(os.path.join(out_dir, "glue", f"{glue_name}.tsv"), ids,
                                      self._predicted(predictions), named=task_name in _NAMED_LABELS))
    return written

  def export(self, bert_config, params, out_dir, tokenizer) -> None:
    super().export(bert_config, params, out_dir, tokenizer)
    if self.loss_kind:  # sentence-transformers' CrossEncoder files beside the Hugging Face folder
      st_folder.write_cross_encoder_files(out_dir, self.max_seq_length)

  def _write_glue(self, path, ids, predicted, *, named: bool) -> str:
    with atomic.open_for_write(path, encoding="utf-8", newline="") as f:
      f.write("index\tprediction\n")
      for i, p in zip(ids, predicted):
        value = f"{p:.3f}" if self.regression else (self.label_names[p] if named else str(int(p)))
        f.write(f"{int(i)}\t{value}\n")
    return path
