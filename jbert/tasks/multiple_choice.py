"""Multiple choice (SWAG, HellaSwag, or your own files): one score per (context, ending), softmax over endings.

A batch row is one example: `[C, T]` inputs for its C endings, so `batch_size` counts examples (C sequences
each). The loss is transformers' `BertForMultipleChoice` loss, the mean cross-entropy over the batch's
examples; the metric is accuracy.
"""
from __future__ import annotations

import csv
import os

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data.finetune import multiple_choice
from jbert.data.finetune import tasks as finetune_tasks
from jbert.model import BertForMultipleChoice, registry
from jbert.tasks import feeding
from jbert.tasks.base import MODEL_INPUTS, EvalSet, Task, mean_cross_entropy_sums


class MultipleChoice(Task):
  """A `jbert.data.finetune.Task` of kind multiple_choice (TFDS hellaswag), or local files when
  `task.train_file` is set (`swag`, whose data TFDS lacks; `data_task` None: `local` with
  `task.kind=multiple_choice`)."""

  head = registry.head(BertForMultipleChoice)
  exports = True

  def __init__(self, data_task: finetune_tasks.Task | None, config, extra_test_tasks=()):
    del extra_test_tasks  # Only GLUE pairs a task with another's test set.
    cfg = config.task
    if data_task is None or data_task.tfds_name is None or cfg.train_file:
      name = data_task.name if data_task is not None else "local"
      if name == "swag" and not cfg.train_file:
        raise ValueError("task swag: SWAG is not in the TFDS catalogue (hellaswag is: configs/finetune.py:hellaswag)."
                         " Pass the files of github.com/rowanz/swagaf (data/): --config.task.train_file=train.csv "
                         "--config.task.eval_file=val.csv [--config.task.test_file=test.csv].")
      if not cfg.train_file:
        raise ValueError(f"task {name} (multiple choice) reads local files: --config.task.train_file=FILE (JSONL "
                         "with context, endings, label; or SWAG's CSV), and optionally eval_file and test_file.")
      files = finetune_tasks.split_files(name, {"train": cfg.train_file, "validation": cfg.eval_file,
                                                "test": cfg.test_file})
      data_task = finetune_tasks.multiple_choice_files_task(name, files)
    if data_task.kind != "multiple_choice":
      raise ValueError(f"task {data_task.name!r} is {data_task.kind}, not multiple choice.")
    self.data_task, self.name = data_task, data_task.name
    self.max_seq_length = config.data.max_seq_length
    self.data_dir = cfg.tfds_data_dir
    self.num_choices = None  # The training examples' number of endings, known after `prepare`.
    self._train = None
    self._eval: dict[str, dict[str, np.ndarray]] = {}

  @property
  def sequences_per_row(self) -> int:
    return self.num_choices or 1

  # -- data --

  def _load(self, split: str) -> list[dict]:
    task = self.data_task
    if task.tfds_name is None:
      return multiple_choice.read_multiple_choice_file(task.splits[split])
    source = task.load(split, data_dir=self.data_dir)
    where = f"{task.tfds_name} {task.splits[split]}"
    return [{**ex, "where": f"example {i} of {where}"} for i, ex in enumerate(source)]

  def _features(self, examples) -> dict[str, np.ndarray]:
    try:
      return multiple_choice.multiple_choice_features(examples, self.tokenizer, self.max_seq_length,
                                                      num_choices=self.num_choices)
    except ValueError as e:
      raise ValueError(f"task {self.name}: {e}") from None

  def prepare(self, tokenizer) -> None:
    """Reads and featurises every split once, so that a bad file fails before anything compiles; the training
    examples fix the number of endings."""
    self.tokenizer = tokenizer
    if self._train is not None:
      return
    examples = self._load("train")
    if not examples:
      raise ValueError(f"the training split of {self.name} ({self.data_task.splits['train']}) has no examples.")
    train = self._features(examples)
    unlabelled = np.flatnonzero(train["label"] < 0)
    if len(unlabelled):
      raise ValueError(f"task {self.name}: {examples[unlabelled[0]]['where']} has no label; every training "
                       "example needs the index of its right ending.")
    self.num_choices = train["input_ids"].shape[1]
    for split in self.data_task.splits:
      if split != "train":
        self._eval[split] = self._features(self._load(split))
    self._train = train

  def num_train_examples(self):
    return len(self._train["input_ids"]) if self._train is not None else 0

  def batch_spec(self, batch_size, max_seq_length):
    spec = {k: jax.ShapeDtypeStruct((batch_size, self.sequences_per_row, max_seq_length), jnp.int32)
            for k in MODEL_INPUTS}
    spec["label"] = jax.ShapeDtypeStruct((batch_size,), jnp.int32)
    return spec

  def train_stream(self, config, tokenizer, layout):
    self.prepare(tokenizer)
    return feeding.FeatureStream(self._train, (*MODEL_INPUTS, "label"), global_batch_size=config.batch_size,
                                 seed=config.seed, num_shards=layout.num_shards, shards=layout.shards)

  def eval_sets(self, config, tokenizer, *, layout):
    self.prepare(tokenizer)
    sets = []
    for split, features in self._eval.items():
      labelled = bool(len(features["label"])) and bool(np.all(features["label"] >= 0))
      sets.append(EvalSet(split, features, split in self.data_task.eval_splits and labelled))
    return sets

  # -- losses --

  def loss_totals(self, batch):
    return {"examples": jnp.asarray(batch["label"].shape[0], jnp.float32)}

  def loss_sums(self, outputs, batch):
    labels = batch["label"]                                                  # [B]
    nll, correct = mean_cross_entropy_sums(outputs.logits, labels, jnp.ones(labels.shape, jnp.float32))
    return {"nll": nll, "correct": correct, "examples": jnp.asarray(labels.shape[0], jnp.float32)}

  def loss(self, sums, totals):
    return sums["nll"] / totals["examples"]

  def train_metrics(self, sums):
    return {"loss": sums["nll"] / sums["examples"], "accuracy": sums["correct"] / sums["examples"]}

  # -- evaluation --

  def predictions(self, outputs, batch):
    return {"logits": outputs.logits}                                       # [B, C]

  def evaluate(self, eval_set, predictions):
    predicted = np.argmax(np.asarray(predictions["logits"]), -1)
    return {"accuracy": float(np.mean(predicted == eval_set.features["label"]))}

  def write_outputs(self, eval_set, predictions, out_dir):
    """`predictions/<split>.tsv`: index, the predicted ending and each ending's probability."""
    logits = np.asarray(predictions["logits"], np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    path = os.path.join(out_dir, "predictions", f"{eval_set.name}.tsv")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
      out = csv.writer(f, delimiter="\t", lineterminator="\n")
      out.writerow(["index", "prediction", *(f"p_{c}" for c in range(probs.shape[1]))])
      out.writerows([int(i), int(p), *(f"{x:.6f}" for x in row)]
                    for i, p, row in zip(eval_set.features["example_id"], probs.argmax(-1), probs))
    return [path]
