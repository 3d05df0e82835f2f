"""Extractive question answering (SQuAD v1.1 / v2.0) with `BertForQuestionAnswering`.

Features are `features.py`'s sliding windows; a training window without the answer points at
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

Prediction inputs (`read_inputs`): a SQuAD .json, or .jsonl/.csv/.tsv with `question`, `context` and optionally
`id` (default: the input's position); Python inputs: such dicts or (question, context) tuples. Windows, n-best
search and null threshold are the run's (the settings of `for_prediction` override them), else `OPTIONS`' defaults.
"""
from __future__ import annotations

import json
import logging
import math
import os

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import files as files_lib
from jbert.model import BertForQuestionAnswering, registry
from jbert.runtime import atomic
from jbert.runtime import mirror
from jbert.tasks import inputs, options, sections
from jbert.tasks.base import MODEL_INPUTS, EvalSet, Weighted, mean_cross_entropy_sums
from jbert.tasks.finetuning import Batching, PredictingTask
from jbert.tasks.question_answering import evaluation as squad_eval
from jbert.tasks.question_answering import features as squad
from jbert.tasks.question_answering import sources
from jbert.tasks.registry import register
from jbert.tasks.sources import Dataset

log = logging.getLogger("jbert")

_POSITIONS = ("start_positions", "end_positions")
_FILE_KEYS = {"train": "train_file", "validation": "eval_file", "test": "test_file"}
_NO_ANSWERS = {"text": [], "answer_start": []}  # a prediction input's: nothing is trained on it


# Its settings: the `task` keys of its configs, `for_prediction`'s settings and jbert.predict's flags.
OPTIONS = (
    options.TaskOption("doc_stride", 128, "tokens between the starts of a long context's windows", minimum=1),
    # Longer questions are cut (and counted).
    options.TaskOption("max_query_length", 64, "question tokens kept", minimum=1),
    # Also the entries per question of nbest_predictions.json.
    options.TaskOption("n_best_size", 20, "start/end candidates per window", minimum=1, evaluation_only=True),
    options.TaskOption("max_answer_length", 30, "tokens in the longest answer", minimum=1, evaluation_only=True),
    # The search over null_odds.json suggests a value (best_f1_thresh).
    options.TaskOption("null_score_diff_threshold", 0.0, 'answer "" (no answer, SQuAD 2.0) when the null score '
                       "beats the best span by more", evaluation_only=True),
    # The dataset says (squad_v2); a prediction without a run's record may say so.
    options.TaskOption("version_2_with_negative", False, "questions may have no answer", configured=False,
                       default_help="the run's task, squad_v2; else false"),
)


def config_section() -> dict:
  """The `task` keys of a question-answering config (`OPTIONS`); `jbert.predict` falls back to the same values."""
  return options.config_section(OPTIONS)


SETTINGS = tuple(config_section())
# What `jbert.predict` takes without a fine-tuning run's record.
PREDICTION_DEFAULTS = options.defaults(OPTIONS)


@register
class QuestionAnswering(PredictingTask):
  """A dataset of kind question_answering, trained with start/end logits over the tokens; built without a
  tokenizer it only predicts (`jbert.predict`) or compiles."""

  kinds = ("question_answering",)
  datasets = sources.DATASETS
  title = "question answering"
  declared_options = OPTIONS
  default_max_length = 384  # the BERT paper's SQuAD windows
  head = registry.head(BertForQuestionAnswering)
  label_keys = _POSITIONS
  # Fixed windows (`data.bucketing` does not apply): the sliding windows are max_seq_length long by design (a long
  # context fills every window but its last), and the loss clamps positions to the window length as transformers
  # does; one shape keeps training and scoring those of run_squad.py.
  bucketable = False
  unpackable_reason = "SQuAD windows: every window of a context but its last is full"

  def __init__(self, dataset: Dataset | None = None, *, max_seq_length: int, global_batch_size: int = 32,
               seed: int = 0, tokenizer=None, data_dir: str | None = None, files: dict[str, str] | None = None,
               version_2_with_negative: bool | None = None, batching: Batching | None = None, **settings):
    """`dataset`: the SQuAD version it trains and evaluates on (its splits, unless `files` replace them);
    without one it only predicts, SQuAD 2.0's way where `version_2_with_negative`."""
    if dataset is not None and dataset.kind != "question_answering":
      raise ValueError(f"task {dataset.name!r} ({dataset.kind}) is not SQuAD question answering.")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
      raise TypeError(f"Unknown question-answering setting(s) {', '.join(unknown)}; use {', '.join(SETTINGS)}.")
    super().__init__(dataset.name if dataset is not None else "predict", max_seq_length=max_seq_length,
                     global_batch_size=global_batch_size, seed=seed, batching=batching)
    self.dataset = dataset
    self.version_2 = (bool(dataset and dataset.version_2_with_negative) if version_2_with_negative is None
                      else bool(version_2_with_negative))
    s = {**config_section(), **{k: v for k, v in settings.items() if v is not None}}
    self.doc_stride, self.max_query_length = int(s["doc_stride"]), int(s["max_query_length"])
    self.n_best, self.max_answer_length = int(s["n_best_size"]), int(s["max_answer_length"])
    self.threshold = float(s["null_score_diff_threshold"])
    if math.isnan(self.threshold):  # NaN compares false: "never no answer", silently
      raise ValueError("null_score_diff_threshold is NaN; give a number (0 is the original BERT's).")
    squad.check_lengths(max_seq_length, self.max_query_length, self.doc_stride,
                        len(tokenizer.pair_separator_ids) if tokenizer is not None else 1)
    if self.n_best < 1 or self.max_answer_length < 1:
      raise ValueError(f"n_best_size={self.n_best} and max_answer_length={self.max_answer_length} must both be "
                       ">= 1.")
    self.tokenizer, self.data_dir, self.files = tokenizer, data_dir, dict(files or {})
    if tokenizer is None or dataset is None or not ("train" in self.files or "train" in dataset.splits):
      return
    # Every split is featurised now, so that a bad file fails before anything compiles.
    self._train = self._features(self._examples("train"), "train", training=True,
                                 require_answers=not self.version_2)
    self._eval_sets = [self._eval_set(split) for split in ("validation", "test")
                       if split in self.files or split in dataset.splits]

  @classmethod
  def config_section(cls, name):
    return {**sections.files(), **config_section()}

  @classmethod
  def from_config(cls, config, tokenizer=None) -> "QuestionAnswering":
    """TFDS squad/v1.1, squad/v2.0, or SQuAD JSON files: `task.train_file` and `task.eval_file` replace the
    TFDS splits, `task.test_file` is predicted (and scored when it has answers)."""
    cfg = config.task
    dataset = cls.datasets[cfg.name]
    files = {split: cfg[key] for split, key in _FILE_KEYS.items() if cfg[key]}
    for split, path in files.items():
      if not os.path.isfile(path):
        raise FileNotFoundError(f"task {dataset.name}: the {split} file {path} (--config.task.{_FILE_KEYS[split]}) "
                                "does not exist.")
    return cls(dataset, max_seq_length=config.data.max_seq_length, global_batch_size=config.batch_size,
               seed=config.seed, tokenizer=tokenizer, data_dir=cfg.tfds_data_dir, files=files,
               batching=Batching.from_config(config), **{k: cfg[k] for k in SETTINGS})

  # -- prediction --

  @classmethod
  def for_prediction(cls, folder, *, kind, max_length=None, **options) -> "QuestionAnswering":
    """`options` (`PREDICTION_DEFAULTS`' keys) over the run's settings (its dataset's SQuAD version) over the
    defaults."""
    del kind
    task = (folder.run_config or {}).get("task") or {}
    settings = {}
    for key, default in PREDICTION_DEFAULTS.items():
      recorded = task.get(key)
      if key == "version_2_with_negative" and task.get("name") in cls.datasets:
        recorded = cls.datasets[task["name"]].version_2_with_negative
      settings[key] = type(default)(options.get(key, default if recorded is None else recorded))
    return cls(max_seq_length=cls.prediction_length(folder, max_length), **settings)

  def read_inputs(self, path, *, column=None, pair_column=None, pairs=False):
    del column
    suffix = inputs.open_input(path)
    inputs.only_pairs_for_classification(pair_column, pairs)
    if suffix == ".json":
      return [{**ex, "answers": _NO_ANSWERS, "where": f"question {ex['id']!r} of {path}"}
              for ex in squad.read_squad_json(path)]
    return inputs.unique_ids([_question(row, where, i, path)
                              for i, (where, row) in enumerate(files_lib.iter_rows(path))])

  def inputs_from(self, records):
    out = []
    for i, record in enumerate(records):
      if isinstance(record, (tuple, list)) and len(record) == 2:
        record = {"question": record[0], "context": record[1]}
      out.append(_question(inputs.as_dict(record, f"input {i}", "a dict with question and context"), f"input {i}", i))
    return inputs.unique_ids(out)

  # -- data --

  def _where(self, split: str) -> str:
    return self.files.get(split) or f"TFDS {self.dataset.tfds_name} {split}"

  def _examples(self, split: str) -> list:
    if split in self.files:
      return squad.read_squad_json(self.files[split])
    source = self.dataset.load(split, data_dir=mirror.local_tfds_dir(self.data_dir, self.dataset.tfds_name))
    return [source[i] for i in range(len(source))]

  def featurise(self, examples, *, where: str = "the input"):
    """Prediction windows of SQuAD examples (`id`, `question`, `context`); nothing is trained on them."""
    return self._features(examples, where, training=False, require_answers=False, where=where)

  def _features(self, examples, split: str, *, training: bool, require_answers: bool,
                where: str | None = None) -> dict[str, np.ndarray]:
    where = where or self._where(split)
    if not examples:
      raise ValueError(f"{where} has no questions.")
    report = squad.FeatureReport()
    try:
      features = squad.squad_features(examples, self.tokenizer, self.max_seq_length, doc_stride=self.doc_stride,
                                      max_query_length=self.max_query_length, training=training,
                                      require_answers=require_answers, report=report)
    except (KeyError, ValueError) as e:
      raise ValueError(f"{where}: {e.args[0]}") from None
    for line in report.messages(where, training=training, max_query_length=self.max_query_length):
      log.warning("%s", line)
    if training and not len(features["input_ids"]):
      raise ValueError(f"{where}: none of its {report.examples} examples can be trained on ("
                       f"{len(report.empty_contexts)} without context tokens, {len(report.misplaced_answers)} with "
                       "an answer not at its answer_start). Fix the answer_start offsets of the file.")
    if training:  # An epoch is a pass over the windows, not the questions: say how many there are.
      log.info("%s: %d training windows from %d of its %d questions (max_seq_length %d, doc_stride %d tokens "
               "between window starts, max_query_length %d).", where, len(features["input_ids"]),
               len(np.unique(features["example_id"])), report.examples, self.max_seq_length, self.doc_stride,
               self.max_query_length)
    return features

  def batch_spec(self, batch_size, max_seq_length):
    spec = {k: jax.ShapeDtypeStruct((batch_size, max_seq_length), jnp.int32) for k in MODEL_INPUTS}
    spec.update({k: jax.ShapeDtypeStruct((batch_size,), jnp.int32) for k in _POSITIONS})
    return spec

  def _eval_set(self, split: str) -> EvalSet:
    """`validation` is scored; `test` only when its questions have answers (all of them for SQuAD 1.1)."""
    examples = self._examples(split)
    answered = [not squad.is_impossible(ex) for ex in examples]
    labelled = split == "validation" or (any(answered) if self.version_2 else bool(answered) and all(answered))
    features = self._features(examples, split, training=False, require_answers=labelled and not self.version_2)
    return EvalSet(split, features, labelled, examples)

  # -- losses --

  def _clamped(self, batch):
    """transformers' clamp to [0, T]; a position of T is ignored."""
    length = batch["input_ids"].shape[1]
    return [(p, (p < length).astype(jnp.float32)) for p in (jnp.clip(batch[k], 0, length) for k in _POSITIONS)]

  # transformers' loss: the mean of the start and the end cross-entropy, each over the rows whose position counts.
  objectives = {"start_loss": 0.5, "end_loss": 0.5}

  def loss(self, outputs, batch):
    entries = {}
    for name, (positions, weights), logits in zip(("start", "end"), self._clamped(batch),
                                                  (outputs.start_logits, outputs.end_logits)):
      nll, correct = mean_cross_entropy_sums(logits, positions, weights)
      entries[f"{name}_loss"] = Weighted(nll, jnp.sum(weights))
      entries[f"{name}_accuracy"] = Weighted(correct, jnp.sum(weights))
    return entries

  # -- evaluation --

  def predictions(self, outputs, batch):
    return {"start_logits": outputs.start_logits, "end_logits": outputs.end_logits}

  def decode(self, eval_set, predictions):
    """Adds `post`: each question's answer, n-best list and null odds (`squad_eval.postprocess`)."""
    post = squad_eval.postprocess(eval_set.features, predictions["start_logits"], predictions["end_logits"],
                                  n_best=self.n_best, max_answer_length=self.max_answer_length,
                                  null_score_diff_threshold=self.threshold, version_2_with_negative=self.version_2)
    return {**predictions, "post": post}

  def records(self, eval_set, predictions) -> list[dict]:
    """{"id", "answer", "score"} per question ("" for no answer; score: the answer's n-best probability)."""
    post = predictions["post"]
    out = []
    for ex in eval_set.examples:
      answer = post.answers[ex["id"]]
      score = next((e["probability"] for e in post.nbest[ex["id"]] if e["text"] == answer), 0.0)
      out.append({"id": ex["id"], "answer": answer, "score": float(score)})
    return out

  def evaluate(self, eval_set, predictions):
    post = predictions["post"]
    references = squad.squad_references(eval_set.examples)
    metrics = squad_eval.squad_metrics(post.answers, references, version_2_with_negative=self.version_2)
    if self.version_2:
      search = squad_eval.squad_metrics(post.best_spans, references, null_odds=post.null_odds)
      metrics.update({k: v for k, v in search.items() if k.startswith("best_")})
    return metrics

  def write_outputs(self, eval_set, predictions, out_dir):
    """`predictions/<split>/predictions.json` (id -> text), `nbest_predictions.json` and, for SQuAD 2.0,
    `null_odds.json`: the files run_squad.py writes, which the official evaluation scripts read."""
    post = predictions["post"]
    directory = os.path.join(out_dir, "predictions", eval_set.name)
    os.makedirs(directory, exist_ok=True)
    files = {"predictions.json": post.answers, "nbest_predictions.json": post.nbest}
    if self.version_2:
      files["null_odds.json"] = post.null_odds
    written = []
    for name, content in files.items():
      path = os.path.join(directory, name)
      with atomic.open_for_write(path, encoding="utf-8") as f:
        json.dump(content, f, indent=4, ensure_ascii=False)
      written.append(path)
    return written


def _question(row: dict, where: str, index: int, path: str | None = None) -> dict:
  """A SQuAD example of a prediction input; its `id` defaults to its position."""
  qid = row.get("id")
  if qid is None or qid == "":
    qid = str(index)
  elif not isinstance(qid, (str, int)) or isinstance(qid, bool):
    raise ValueError(f"{where}: field 'id' must be a text or an integer, got {type(qid).__name__}.")
  return {"id": str(qid), "question": inputs.field(row, "question", where, path),
          "context": inputs.field(row, "context", where, path), "answers": _NO_ANSWERS, "where": where}
