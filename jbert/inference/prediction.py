"""Predictions of fine-tuned models: label and probabilities, value, answer, word tags or chosen ending per input.

`Predictor(model)` reads what the model folder says about itself (head, label names: `jbert.describe`) and, for
a training workdir or its `export/`, the fine-tuning run's own preprocessing (`data.max_seq_length`, the text
columns, SQuAD's windows and null threshold); explicit arguments override those, and other folders take the
defaults below. Inputs are featurised and post-processed by the trainer's own code (`jbert.data.finetune`:
classification features, NER windows and word mapping, SQuAD windows and `squad_eval.postprocess`, multiple-choice
pairs), so a run's evaluation file gives the predictions the run wrote to WORKDIR/predictions/.

The model runs through `jbert.inference.Runner` rather than the trainer's jitted predict step: inputs are sorted
by length and cut to bucket lengths (a short text never pays for `max_seq_length`), executables are cached per
process, ids are checked on the host, and no optimiser or training state is built. Question answering keeps
full-length windows: SQuAD post-processing ranks the top `n_best_size` logits of every position, padding
included (as `run_squad.py` and the trainer do), so shorter rows could change which spans are candidates.

Outputs, one dict per input in input order:
  classification   {"label": name, "probabilities": {name: p}}
  regression       {"value": x}                          (a one-label sequence classifier)
  cross-encoder    {"score": s, "logit": x}              (one label; s = the recorded activation of x, as
                                                          sentence-transformers' CrossEncoder.predict gives it)
  question answer  {"id", "answer", "score"}             (answer "" for no answer; score: its n-best probability)
  NER              {"tokens": [...], "tags": [...]}
  multiple choice  {"label": index, "probabilities": [...]}
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import math
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jbert import errors, tasks, untrusted
from jbert.inference import examples as examples_lib
from jbert.inference import folder as folder_lib
from jbert.inference import loading, runner as runner_lib
from jbert.inference.loading import LoadedModel
from jbert.tasks import question_answering
from jbert.weights import st_folder

log = logging.getLogger("jbert")

# Without a fine-tuning run's record: the BERT paper's lengths (capped at max_position_embeddings).
DEFAULT_MAX_LENGTH = {"question_answering": 384}
DEFAULT_MAX_LENGTH_OTHERS = 128
QA_DEFAULTS = {**question_answering.config_section(), "version_2_with_negative": False}


@dataclasses.dataclass(frozen=True)
class PredictSettings:
  """What a prediction run uses. `recorded_from` names the fine-tuning record read (None: defaults/arguments)."""
  kind: str  # a `jbert.tasks.KINDS` name: classification, regression, ner, question_answering, multiple_choice
  max_length: int
  label_names: tuple[str, ...] | None
  columns: tuple[str | None, str | None] = (None, None)  # The run's text_a / text_b columns (classification).
  doc_stride: int = QA_DEFAULTS["doc_stride"]
  max_query_length: int = QA_DEFAULTS["max_query_length"]
  n_best_size: int = QA_DEFAULTS["n_best_size"]
  max_answer_length: int = QA_DEFAULTS["max_answer_length"]
  null_score_diff_threshold: float = QA_DEFAULTS["null_score_diff_threshold"]
  version_2_with_negative: bool = QA_DEFAULTS["version_2_with_negative"]
  recorded_from: str | None = None
  activation: str | None = None  # A cross-encoder's score function ("sigmoid", "identity"); None: not one.


def predict_settings(info, config: Mapping[str, Any] | None, recorded_from: str | None = None,
                     activation: str | None = None, **explicit) -> PredictSettings:
  """Settings from explicit values (not None), else the run's `config`, else the defaults.

  Args:
    info: `jbert.describe(model)` (a `ModelInfo`) of a fine-tuned model.
    activation: the score function a sentence-transformers CrossEncoder folder records (`cross_encoder.
      cross_encoder_activation`); a `cross_encoder` run's is sigmoid.
    explicit: max_length and the QA keys of `QA_DEFAULTS`.
  """
  from jbert.data import finetune  # pylint: disable=g-import-not-at-top
  from jbert.data.finetune import squad  # pylint: disable=g-import-not-at-top
  unknown = sorted(set(explicit) - {"max_length", *QA_DEFAULTS})
  if unknown:
    raise TypeError(f"Unknown prediction setting(s) {', '.join(unknown)}; use max_length or "
                    f"{', '.join(QA_DEFAULTS)}.")
  explicit = {k: v for k, v in explicit.items() if v is not None}
  kind = _kind(info.head.architecture)
  if kind == "classification" and info.num_labels == 1:
    kind = "regression"  # As transformers reads a one-label sequence classifier.
  task = dict((config or {}).get("task") or {})
  limit = info.config.max_position_embeddings
  # `is None`, not `or`: an explicit 0 is refused below, not replaced by the default.
  max_length = explicit.get("max_length")
  if max_length is None:
    max_length = ((config or {}).get("data") or {}).get("max_seq_length") or min(
        DEFAULT_MAX_LENGTH.get(kind, DEFAULT_MAX_LENGTH_OTHERS), limit)
  if not 3 <= max_length <= limit:
    raise ValueError(f"max_length={max_length} must lie in [3, max_position_embeddings={limit}].")
  labels = None
  if kind in ("classification", "ner"):
    labels = tuple(info.label_names or (f"LABEL_{i}" for i in range(info.num_labels or 0)))
    if not labels:
      raise ValueError(f"The {info.head.architecture} checkpoint records neither num_labels nor id2label.")
  name = task.get("name")
  columns: tuple[str | None, str | None] = (None, None)
  if kind == "regression" and name == "cross_encoder":
    activation = activation or "sigmoid"
  if kind != "regression":
    activation = None
  if kind in ("classification", "regression") and name in ("local", "cross_encoder"):
    columns = (task.get("text_a"), task.get("text_b"))
  elif kind in ("classification", "regression") and name in finetune.DATASETS:
    keys = finetune.DATASETS[name].text_keys
    columns = (keys[0], keys[1] if len(keys) > 1 else None)
  qa = {}
  for key, default in QA_DEFAULTS.items():
    if key in explicit and kind != "question_answering":
      raise ValueError(f"{key} applies to question answering; this model is a {info.head.architecture}.")
    recorded = task.get(key)
    if key == "version_2_with_negative" and name in finetune.DATASETS:
      recorded = finetune.DATASETS[name].version_2_with_negative
    qa[key] = type(default)(explicit.get(key, default if recorded is None else recorded))
  if kind == "question_answering":
    squad.check_lengths(max_length, qa["max_query_length"], qa["doc_stride"])
    if qa["n_best_size"] < 1 or qa["max_answer_length"] < 1:
      raise ValueError(f"n_best_size={qa['n_best_size']} and max_answer_length={qa['max_answer_length']} must "
                       "both be >= 1.")
    if math.isnan(qa["null_score_diff_threshold"]):  # NaN compares false: "never no answer", silently
      raise ValueError("null_score_diff_threshold is NaN; give a number (0 is the original BERT's).")
  return PredictSettings(kind=kind, max_length=int(max_length), label_names=labels, columns=columns,
                         recorded_from=recorded_from, activation=activation, **qa)


def _kind(architecture: str) -> str:
  """The task kind of a fine-tuned head (a one-label sequence classifier's is refined to regression)."""
  cls = tasks.for_head(architecture)
  return next(k for k, c in tasks.KINDS.items() if c is cls)


class Predictor:
  """A fine-tuned model and its prediction settings; call it on examples (`read` / `examples`) for predictions.

  Everything that can be checked without the weights (head, settings, the input) is checked before they load.
  """

  def __init__(self, model: str | os.PathLike, *, batch_size: int = runner_lib.DEFAULT_BATCH_SIZE,
               dtype: str | None = None, tokenizer: str | None = None, **settings):
    self.path = os.fspath(model)
    if not os.path.exists(self.path) and not os.path.exists(self.path + ".index"):
      raise FileNotFoundError(f"Model path {self.path} does not exist; pass a fine-tuning workdir or a model "
                              "folder (e.g. WORKDIR/export).")
    self.folder = folder_lib.resolve(self.path)  # Follows the path once; reads no weights.
    self.info = self.folder.info
    head = self.info.head
    if head is None or tasks.for_head(head.architecture) is None:
      what = f"a {head.architecture}" if head else "a checkpoint without a recorded head (config.json architectures)"
      heads = dict.fromkeys(c.head.architecture for c in tasks.KINDS.values())
      raise ValueError(f"{self.path} is {what}, not a fine-tuned model; predict needs one of "
                       f"{', '.join(heads)} (use jbert.embed or jbert.fill_mask for the others).")
    activation = st_folder.cross_encoder_activation(self.path) if os.path.isdir(self.path) else None
    self.settings = predict_settings(self.info, self.folder.run_config, self.folder.run_config_from, activation,
                                     **settings)
    self.kind = self.settings.kind
    self.batch_size, self.dtype, self.tokenizer_path = batch_size, dtype, tokenizer
    self._model: LoadedModel | None = None
    self._task = None
    self._runner = None

  # -- inputs --

  def read(self, path: str, column: str | None = None, pair_column: str | None = None,
           pairs: bool = False) -> list[dict[str, Any]]:
    """Examples of an input file; see `jbert.inference.examples`."""
    return examples_lib.read_file(path, self.kind, column=column, pair_column=pair_column, pairs=pairs,
                                  recorded=self.settings.columns)

  def examples(self, records: Sequence[Any]) -> list[dict[str, Any]]:
    return examples_lib.from_records(records, self.kind, recorded=self.settings.columns)

  # -- model --

  @property
  def model(self) -> LoadedModel:
    if self._model is None:
      model = loading.load_model(self.folder, self.info.head.cls, tokenizer=self.tokenizer_path, dtype=self.dtype)
      heads = ("classifier", "qa_outputs")
      untrained = [n for n in model.initialised if n.split("/")[0] in heads]
      if untrained:
        raise ValueError(f"{self.path} holds no trained {self.info.head.architecture} head ({', '.join(untrained)} "
                         "were initialised at random), so its predictions would be random; pass a fine-tuned "
                         "model.")
      self._model = model
    return self._model

  @property
  def task(self) -> tasks.FinetuneTask:
    """The task of the model's head, which featurises inputs and turns outputs into records as training does."""
    if self._task is None:
      s = self.settings
      qa = {k: getattr(s, k) for k in QA_DEFAULTS} if self.kind == "question_answering" else {}
      if s.activation:
        qa["activation"] = s.activation
      self._task = tasks.for_prediction(self.info.head.architecture, label_names=s.label_names,
                                        max_seq_length=s.max_length, tokenizer=self.model.tokenizer, **qa)
    return self._task

  def _run(self, features: Mapping[str, np.ndarray], progress) -> dict[str, np.ndarray]:
    """The task's `predictions` for `features` (leading shape [N] or, multiple choice, [N, C]), each model
    sequence run alone at its bucket length."""
    if self._runner is None:
      model, task, length = self.model, self.task, self.settings.max_length
      mesh = runner_lib.default_mesh()
      params = model.placed_params(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
      key = ("predict", model.config, model.model_cls, self.info.num_labels, self.kind)
      self._runner = runner_lib.Runner(
          task.predict_fn(model.model_cls(model.config, **task.head.model_kwargs(self.info.num_labels))), params,
          key=key, max_length=length, vocab_size=model.config.vocab_size,
          type_vocab_size=model.config.type_vocab_size, batch_size=self.batch_size, mesh=mesh,
          # SQuAD post-processing ranks every position's logits, padding included (as run_squad.py does), so
          # question answering keeps full-length windows.
          buckets=(length,) if self.kind == "question_answering" else None,
          token_outputs=("tags",) if self.kind == "ner" else ())
    length = self.settings.max_length
    lead = features["input_ids"].shape[:-1]
    ids, types = (features[k].reshape(-1, length) for k in ("input_ids", "token_type_ids"))
    used = features["attention_mask"].reshape(-1, length).sum(-1)
    rows = [{"input_ids": i[:n], "token_type_ids": t[:n]} for i, t, n in zip(ids, types, used)]
    outputs = self._runner.run(rows, progress=progress, desc="predict")
    stacked = {}
    for key in outputs[0]:
      if key == "tags":  # per token of each row, up to its length
        value = np.zeros((len(rows), length), np.int32)
        for i, row in enumerate(outputs):
          value[i, :len(row[key])] = row[key]
      else:
        value = np.stack([row[key] for row in outputs])
      stacked[key] = value.reshape(*lead, *value.shape[1:])
    return stacked

  # -- predictions --

  def __call__(self, examples: Sequence[Mapping[str, Any]], progress: bool | None = None) -> list[dict[str, Any]]:
    """One prediction per example (from `read` or `examples`), in order; see the module docstring."""
    examples = list(examples)
    if not examples:
      return []
    if self.kind in ("classification", "regression"):
      self._check_pairs(examples)
    # Multiple-choice features hold one number of endings: one group per number found.
    groups = collections.defaultdict(list)
    for i, ex in enumerate(examples):
      groups[len(ex["endings"]) if self.kind == "multiple_choice" else 0].append(i)
    out: list[dict[str, Any] | None] = [None] * len(examples)
    for indices in groups.values():
      part = [examples[i] for i in indices]
      features = self.task.featurise(part)
      eval_set = tasks.EvalSet("predict", features, labelled=False, examples=part)
      try:
        outputs = self._run(features, progress)
      except runner_lib.NonFiniteOutput as e:
        where = [part[i].get("where", f"input {indices[i]}") for i in _examples_of(features, e.rows)]
        raise ValueError(f"The model's outputs for {runner_lib.describe_rows(where)} are not finite (NaN or inf): "
                         f"{runner_lib.NON_FINITE_FIX}.") from None
      records = self.task.records(eval_set, self.task.decode(eval_set, outputs))
      for i, record in zip(indices, records):
        out[i] = record
    return out

  def _check_pairs(self, examples) -> None:
    paired = ["text_b" in ex for ex in examples]
    if any(paired) and not all(paired):
      raise ValueError(f"{examples[paired.index(False)]['where']} has one text where the others are pairs; give "
                       "every input the same number of texts.")
    if self.settings.columns[1] and not paired[0]:
      raise ValueError(f"The model was fine-tuned on text pairs ({', '.join(self.settings.columns)}); "
                       f"{examples[0]['where']} has a single text (name the second column, or give (text, pair) "
                       "tuples).")


def _examples_of(features: Mapping[str, np.ndarray], rows: Sequence[int]) -> list[int]:
  """The examples (positions in the featurised list) that model sequences `rows` came from: a question
  answering window's example, a multiple-choice ending's question, else the row itself."""
  if "example_id" in features:
    examples = [int(features["example_id"][r]) for r in rows]
  elif features["input_ids"].ndim == 3:
    examples = [r // features["input_ids"].shape[1] for r in rows]
  else:
    examples = list(rows)
  return sorted(set(examples))


def predict(inputs: Any, model: str | os.PathLike, *, batch_size: int = runner_lib.DEFAULT_BATCH_SIZE,
            max_length: int | None = None, dtype: str | None = None, progress: bool | None = None,
            tokenizer: str | None = None, **task_settings) -> list[dict[str, Any]]:
  """Predictions of a fine-tuned model for `inputs`, one dict per input in order (see the module docstring).

  Args:
    inputs: a list of inputs, or one input (a text, a tuple or a dict). Sequence classification: texts,
      (text, pair) tuples, or dicts with the text fields (`text`/`text_b`, or the fine-tuning run's column
      names). NER: texts (split at whitespace), lists or tuples of words, or dicts with `tokens`/`text`. Question
      answering: dicts with `question`, `context` and optionally `id` (default: the input's position), or
      (question, context) tuples. Multiple choice: dicts with `context` and `endings`, or (context, endings)
      tuples.
    model: a fine-tuning workdir, its `export/`, or any model folder with a fine-tuned head (Hugging Face, TF1,
      jbert) and its tokenizer.
    batch_size: model sequences per batch.
    max_length: tokens per sequence, special tokens included; default the fine-tuning run's
      `data.max_seq_length`, else 128 (question answering 384), at most max_position_embeddings.
    dtype: compute dtype, e.g. "bfloat16"; default the checkpoint's.
    progress: a progress line on stderr (default: for large inputs).
    tokenizer: a tokenizer file or folder when the model folder has none.
    task_settings: question answering's doc_stride, max_query_length, n_best_size, max_answer_length,
      null_score_diff_threshold and version_2_with_negative (default: the run's, else `QA_DEFAULTS`).
  """
  predictor = Predictor(model, batch_size=batch_size, dtype=dtype, tokenizer=tokenizer, max_length=max_length,
                        **task_settings)
  single = isinstance(inputs, (str, dict, tuple))
  return predictor(predictor.examples([inputs] if single else inputs), progress=progress)
