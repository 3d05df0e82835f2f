"""Extractive question answering (SQuAD v1.1 / v2.0) with `BertForQuestionAnswering`.

Features are `jbert.data.finetune.squad`'s sliding windows; a training window without the answer points at
[CLS], and one epoch is one pass over the training windows. The loss is transformers'
`BertForQuestionAnswering` loss: the mean of the start and end cross-entropies over the batch, with positions
clamped to [0, T] and a clamped position of T ignored.

Evaluation runs every window through the model, `squad_eval.postprocess` picks each question's answer, and the
metrics are the official evaluation script's for the task's SQuAD version. SQuAD 2.0 adds the script's
`best_exact`, `best_f1` and their thresholds (its search over null_odds.json), computed on the best non-null
spans so that each threshold is scored with the answers it would give; rerun prediction with
`--config.task.null_score_diff_threshold=<best_f1_thresh>` to answer with it.

Data: TFDS `squad/v1.1` / `squad/v2.0`, or SQuAD JSON files: `task.train_file` and `task.eval_file` replace the
TFDS splits, `task.test_file` is predicted (and scored when it has answers).
"""
from __future__ import annotations

import json
import logging
import os

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import finetune
from jbert.data.finetune import squad, squad_eval
from jbert.model import BertForQuestionAnswering, registry
from jbert.tasks import feeding
from jbert.tasks.base import MODEL_INPUTS, EvalSet, Task, mean_cross_entropy_sums

log = logging.getLogger("jbert")

_POSITIONS = ("start_positions", "end_positions")
_FILE_KEYS = {"train": "train_file", "validation": "eval_file", "test": "test_file"}


class QuestionAnswering(Task):
  """A `jbert.data.finetune.Task` of kind squad, trained with start/end logits over the tokens."""

  head = registry.head(BertForQuestionAnswering)
  exports = True

  def __init__(self, data_task: finetune.Task, config, extra_test_tasks: tuple[finetune.Task, ...] = ()):
    if data_task.kind != "squad" or extra_test_tasks:
      raise ValueError(f"task {data_task.name!r} ({data_task.kind}) is not SQuAD question answering on its own.")
    self.data_task, self.name = data_task, data_task.name
    self.version_2 = data_task.version_2_with_negative
    task_cfg = config.task
    self.max_seq_length = config.data.max_seq_length
    self.doc_stride, self.max_query_length = task_cfg.doc_stride, task_cfg.max_query_length
    self.n_best, self.max_answer_length = task_cfg.n_best_size, task_cfg.max_answer_length
    self.threshold = task_cfg.null_score_diff_threshold
    squad.check_lengths(self.max_seq_length, self.max_query_length, self.doc_stride)
    if self.n_best < 1 or self.max_answer_length < 1:
      raise ValueError(f"task.n_best_size={self.n_best} and task.max_answer_length={self.max_answer_length} must "
                       "both be >= 1.")
    self.data_dir = task_cfg.tfds_data_dir
    self.files = {split: task_cfg[key] for split, key in _FILE_KEYS.items() if task_cfg[key]}
    for split, path in self.files.items():
      if not os.path.isfile(path):
        raise FileNotFoundError(f"task {self.name}: the {split} file {path} (--config.task.{_FILE_KEYS[split]}) "
                                "does not exist.")
    self._train = self._eval_sets = None
    self._post = None  # (eval set name, start logits, SquadPredictions) of the last post-processing

  # -- data --

  def _where(self, split: str) -> str:
    return self.files.get(split) or f"TFDS {self.data_task.tfds_name} {split}"

  def _examples(self, split: str) -> list:
    if split in self.files:
      return squad.read_squad_json(self.files[split])
    source = self.data_task.load(split, data_dir=self.data_dir)
    return [source[i] for i in range(len(source))]

  def _features(self, examples, split: str, *, training: bool, require_answers: bool) -> dict[str, np.ndarray]:
    if not examples:
      raise ValueError(f"{self._where(split)} has no questions.")
    report = squad.FeatureReport()
    try:
      features = squad.squad_features(examples, self.tokenizer, self.max_seq_length, doc_stride=self.doc_stride,
                                      max_query_length=self.max_query_length, training=training,
                                      require_answers=require_answers, report=report)
    except (KeyError, ValueError) as e:
      raise ValueError(f"{self._where(split)}: {e.args[0]}") from None
    for line in report.messages(self._where(split), training=training, max_query_length=self.max_query_length):
      log.warning("%s", line)
    if training and not len(features["input_ids"]):
      raise ValueError(f"{self._where(split)}: none of its {report.examples} examples can be trained on ("
                       f"{len(report.empty_contexts)} without context tokens, {len(report.misplaced_answers)} with "
                       "an answer not at its answer_start). Fix the answer_start offsets of the file.")
    return features

  def prepare(self, tokenizer) -> None:
    """Featurises every split once, so that a bad file fails before anything compiles (and the epoch count
    needs the training windows)."""
    self.tokenizer = tokenizer
    if self._train is None:
      self._train = self._features(self._examples("train"), "train", training=True,
                                   require_answers=not self.version_2)
    if self._eval_sets is None:
      self._eval_sets = [self._eval_set(split) for split in ("validation", "test")
                         if split in self.files or split in self.data_task.splits]

  def num_train_examples(self):
    return len(self._train["input_ids"]) if self._train is not None else 0

  def batch_spec(self, batch_size, max_seq_length):
    spec = {k: jax.ShapeDtypeStruct((batch_size, max_seq_length), jnp.int32) for k in MODEL_INPUTS}
    spec.update({k: jax.ShapeDtypeStruct((batch_size,), jnp.int32) for k in _POSITIONS})
    return spec

  def train_stream(self, config, tokenizer, layout):
    self.prepare(tokenizer)
    return feeding.FeatureStream(self._train, (*MODEL_INPUTS, *_POSITIONS), global_batch_size=config.batch_size,
                                 seed=config.seed, num_shards=layout.num_shards, shards=layout.shards)

  def _eval_set(self, split: str) -> EvalSet:
    """`validation` is scored; `test` only when its questions have answers (all of them for SQuAD 1.1)."""
    examples = self._examples(split)
    answered = [not squad.is_impossible(ex) for ex in examples]
    labelled = split == "validation" or (any(answered) if self.version_2 else bool(answered) and all(answered))
    features = self._features(examples, split, training=False, require_answers=labelled and not self.version_2)
    return EvalSet(split, features, labelled, squad.squad_references(examples) if labelled else None)

  def eval_sets(self, config, tokenizer, *, layout):
    self.prepare(tokenizer)
    return self._eval_sets

  # -- losses --

  def _clamped(self, batch):
    """transformers' clamp to [0, T]; a position of T is ignored."""
    length = batch["input_ids"].shape[1]
    return [(p, (p < length).astype(jnp.float32)) for p in (jnp.clip(batch[k], 0, length) for k in _POSITIONS)]

  def loss_totals(self, batch):
    (_, start_weight), (_, end_weight) = self._clamped(batch)
    return {"start_rows": jnp.sum(start_weight), "end_rows": jnp.sum(end_weight)}

  def loss_sums(self, outputs, batch):
    (start, start_weight), (end, end_weight) = self._clamped(batch)
    start_nll, start_correct = mean_cross_entropy_sums(outputs.start_logits, start, start_weight)
    end_nll, end_correct = mean_cross_entropy_sums(outputs.end_logits, end, end_weight)
    return {"start_nll": start_nll, "end_nll": end_nll, "start_correct": start_correct, "end_correct": end_correct,
            "start_rows": jnp.sum(start_weight), "end_rows": jnp.sum(end_weight)}

  def loss(self, sums, totals):
    return 0.5 * (sums["start_nll"] / jnp.maximum(totals["start_rows"], 1.0)
                  + sums["end_nll"] / jnp.maximum(totals["end_rows"], 1.0))

  def train_metrics(self, sums):
    start_rows, end_rows = jnp.maximum(sums["start_rows"], 1.0), jnp.maximum(sums["end_rows"], 1.0)
    return {"loss": self.loss(sums, sums), "start_accuracy": sums["start_correct"] / start_rows,
            "end_accuracy": sums["end_correct"] / end_rows}

  # -- evaluation --

  def predictions(self, outputs, batch):
    return {"start_logits": outputs.start_logits, "end_logits": outputs.end_logits}

  def postprocess(self, eval_set: EvalSet, predictions) -> squad_eval.SquadPredictions:
    """Answers, n-best lists and null odds of one split (computed once per set of predictions)."""
    start = predictions["start_logits"]
    if self._post is None or self._post[0] != eval_set.name or self._post[1] is not start:
      post = squad_eval.postprocess(eval_set.features, start, predictions["end_logits"], n_best=self.n_best,
                                    max_answer_length=self.max_answer_length,
                                    null_score_diff_threshold=self.threshold,
                                    version_2_with_negative=self.version_2)
      self._post = (eval_set.name, start, post)
    return self._post[2]

  def evaluate(self, eval_set, predictions):
    post = self.postprocess(eval_set, predictions)
    references = eval_set.examples
    metrics = squad_eval.squad_metrics(post.answers, references, version_2_with_negative=self.version_2)
    if self.version_2:
      search = squad_eval.squad_metrics(post.best_spans, references, null_odds=post.null_odds)
      metrics.update({k: v for k, v in search.items() if k.startswith("best_")})
    return metrics

  def write_outputs(self, eval_set, predictions, out_dir):
    """`predictions/<split>/predictions.json` (id -> text), `nbest_predictions.json` and, for SQuAD 2.0,
    `null_odds.json`: the files run_squad.py writes, which the official evaluation scripts read."""
    post = self.postprocess(eval_set, predictions)
    directory = os.path.join(out_dir, "predictions", eval_set.name)
    os.makedirs(directory, exist_ok=True)
    files = {"predictions.json": post.answers, "nbest_predictions.json": post.nbest}
    if self.version_2:
      files["null_odds.json"] = post.null_odds
    written = []
    for name, content in files.items():
      path = os.path.join(directory, name)
      with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(content, f, indent=4, ensure_ascii=False)
      os.replace(path + ".tmp", path)
      written.append(path)
    return written
