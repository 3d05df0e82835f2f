"""Sentence(-pair) classification and regression: every GLUE task and the user's own labelled files.

Losses are transformers' `BertForSequenceClassification` losses: mean cross-entropy over the batch, or mean
squared error of the single logit for a 1-label regressor (STS-B).
"""
from __future__ import annotations

import csv
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import finetune
from jbert.model import BertForSequenceClassification, registry
from jbert.tasks import feeding
from jbert.tasks.base import MODEL_INPUTS, EvalSet, Task, mean_cross_entropy_sums

log = logging.getLogger("jbert")

# GLUE server file names; the server reads class ids for the binary tasks and label names for the NLI ones.
GLUE_FILES = {"cola": "CoLA", "sst2": "SST-2", "mrpc": "MRPC", "qqp": "QQP", "stsb": "STS-B", "qnli": "QNLI",
              "rte": "RTE", "wnli": "WNLI", "ax": "AX", "mnli:test_matched": "MNLI-m",
              "mnli:test_mismatched": "MNLI-mm"}
_NAMED_LABELS = ("mnli", "qnli", "rte", "ax")


class SequenceClassification(Task):
  """A `jbert.data.finetune.Task` of kind classification/regression trained with a [CLS] classifier."""

  head = registry.head(BertForSequenceClassification)
  exports = True

  def __init__(self, data_task: finetune.Task, config, extra_test_tasks: tuple[finetune.Task, ...] = ()):
    if data_task.kind not in ("classification", "regression"):
      raise ValueError(f"task {data_task.name!r} is {data_task.kind}, not sentence classification.")
    self.data_task, self.extra_test_tasks = data_task, extra_test_tasks
    self.name = data_task.name
    self.regression = data_task.kind == "regression"
    self.num_labels = data_task.num_labels
    self.label_names = data_task.label_names
    self.max_seq_length = config.data.max_seq_length
    self.data_dir = config.task.tfds_data_dir
    self._train = None

  # -- data --

  def _features(self, task: finetune.Task, split: str) -> dict[str, np.ndarray]:
    if task.tfds_name is None:
      return self._local_features(task, split)
    examples = task.load(split, data_dir=self.data_dir)
    return task.features(examples, self.tokenizer, self.max_seq_length)

  def _local_features(self, task: finetune.Task, split: str) -> dict[str, np.ndarray]:
    """A local file; evaluation and test files may lack the label column (predictions only)."""
    path, columns = task.splits[split], dict(task.column_map)
    try:
      examples = finetune.read_examples(path, columns, task.label_names)
    except KeyError as e:
      message = f"task local: {e.args[0]} Set --config.task.text_a/text_b/label to columns of {path}."
      if split == "train":
        raise ValueError(message) from e
      del columns["label"]
      try:
        examples = finetune.read_examples(path, columns)
      except KeyError:
        raise ValueError(message) from e
      log.warning("task local: %s has no %r column; it is predicted, not scored.", path, task.column_map["label"])
    return finetune.classification_features(examples, self.tokenizer, self.max_seq_length,
                                            text_keys=task.text_keys, regression=self.regression,
                                            label_key="label" if "label" in columns else None)

  def prepare(self, tokenizer) -> None:
    """Featurises the training split once (needed for the epoch count before anything compiles)."""
    self.tokenizer = tokenizer
    if self._train is None and "train" in self.data_task.splits:
      self._train = self._features(self.data_task, "train")
      if not len(self._train["input_ids"]):
        raise ValueError(f"the training split of {self.name} ({self.data_task.splits['train']}) has no examples.")

  def num_train_examples(self):
    return len(self._train["input_ids"]) if self._train is not None else 0

  def batch_spec(self, batch_size, max_seq_length):
    spec = {k: jax.ShapeDtypeStruct((batch_size, max_seq_length), jnp.int32) for k in MODEL_INPUTS}
    spec["label"] = jax.ShapeDtypeStruct((batch_size,), jnp.float32 if self.regression else jnp.int32)
    return spec

  def train_stream(self, config, tokenizer, layout):
    self.prepare(tokenizer)
    return feeding.FeatureStream(self._train, (*MODEL_INPUTS, "label"), global_batch_size=config.batch_size,
                                 seed=config.seed, num_shards=layout.num_shards, shards=layout.shards)

  def eval_sets(self, config, tokenizer, *, layout):
    self.tokenizer = tokenizer
    sets = []
    for task in (self.data_task, *self.extra_test_tasks):
      for split in task.splits:
        if split == "train" or (task is self.data_task and split not in task.eval_splits
                                and not split.startswith("test")):
          continue
        features = self._features(task, split)
        labelled = split in task.eval_splits and bool(len(features["label"])) and bool(
            np.all(features["label"] >= 0)) and task.label_key is not None
        name = split if task is self.data_task else f"{task.name}:{split}"
        sets.append(EvalSet(name, features, labelled))
    return sets

  # -- losses --

  def loss_totals(self, batch):
    return {"sequences": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  def loss_sums(self, outputs, batch):
    rows = jnp.asarray(batch["input_ids"].shape[0], jnp.float32)
    if self.regression:
      error = outputs.logits[:, 0] - batch["label"].astype(jnp.float32)
      return {"squared_error": jnp.sum(error * error), "sequences": rows}
    nll, correct = mean_cross_entropy_sums(outputs.logits, batch["label"], jnp.ones(batch["label"].shape))
    return {"nll": nll, "correct": correct, "sequences": rows}

  def loss(self, sums, totals):
    return sums["squared_error" if self.regression else "nll"] / totals["sequences"]

  def train_metrics(self, sums):
    if self.regression:
      return {"loss": sums["squared_error"] / sums["sequences"]}
    return {"loss": sums["nll"] / sums["sequences"], "accuracy": sums["correct"] / sums["sequences"]}

  # -- evaluation --

  def predictions(self, outputs, batch):
    return {"logits": outputs.logits}

  def _predicted(self, predictions) -> np.ndarray:
    logits = np.asarray(predictions["logits"])
    return logits[:, 0] if self.regression else np.argmax(logits, -1)

  def evaluate(self, eval_set, predictions):
    return finetune.classification_metrics(self.data_task.metrics, self._predicted(predictions),
                                           eval_set.features["label"])

  def write_outputs(self, eval_set, predictions, out_dir):
    """`predictions/<split>.tsv` (index, prediction, and per-class probabilities or the score) for every split,
    plus the GLUE server's file (`SST-2.tsv`, `MNLI-m.tsv`, ...) for GLUE test splits."""
    predicted = self._predicted(predictions)
    ids = eval_set.features["example_id"]
    written = []
    path = os.path.join(out_dir, "predictions", f"{eval_set.name.replace(':', '_')}.tsv")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
      out = csv.writer(f, delimiter="\t", lineterminator="\n")
      if self.regression:
        out.writerow(["index", "prediction"])
        out.writerows([int(i), f"{p:.6f}"] for i, p in zip(ids, predicted))
      else:
        logits = np.asarray(predictions["logits"], np.float64)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        out.writerow(["index", "prediction", *(f"p_{n}" for n in self.label_names)])
        out.writerows([int(i), self.label_names[p], *(f"{x:.6f}" for x in row)]
                      for i, p, row in zip(ids, predicted, probs))
    written.append(path)
    task_name, _, split = eval_set.name.rpartition(":")
    task_name = task_name or self.name
    glue_name = GLUE_FILES.get(f"mnli:{split}" if task_name == "mnli" else task_name)
    if glue_name and split.startswith("test") and self.data_task.tfds_name:
      written.append(self._write_glue(os.path.join(out_dir, "glue", f"{glue_name}.tsv"), ids, predicted,
                                      named=task_name in _NAMED_LABELS))
    return written

  def _write_glue(self, path, ids, predicted, *, named: bool) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
      f.write("index\tprediction\n")
      for i, p in zip(ids, predicted):
        value = f"{p:.3f}" if self.regression else (self.label_names[p] if named else str(int(p)))
        f.write(f"{int(i)}\t{value}\n")
    return path
