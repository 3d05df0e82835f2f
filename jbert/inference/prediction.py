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
  question answer  {"id", "answer", "score"}             (answer "" for no answer; score: its n-best probability)
  NER              {"tokens": [...], "tags": [...]}
  multiple choice  {"label": index, "probabilities": [...]}
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import os
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jbert.inference import examples as examples_lib
from jbert.inference import loading, runner as runner_lib
from jbert.inference.loading import LoadedModel

log = logging.getLogger("jbert")

# config.json `architectures` entry -> what is predicted.
HEAD_KINDS = {"BertForSequenceClassification": "classification", "BertForTokenClassification": "ner",
              "BertForQuestionAnswering": "qa", "BertForMultipleChoice": "multiple_choice"}
# Without a fine-tuning run's record: the BERT paper's lengths (capped at max_position_embeddings) and
# `configs/finetune.py`'s SQuAD settings.
DEFAULT_MAX_LENGTH = {"qa": 384}
DEFAULT_MAX_LENGTH_OTHERS = 128
QA_DEFAULTS = {"doc_stride": 128, "max_query_length": 64, "n_best_size": 20, "max_answer_length": 30,
               "null_score_diff_threshold": 0.0, "version_2_with_negative": False}
_MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


@dataclasses.dataclass(frozen=True)
class PredictSettings:
  """What a prediction run uses. `recorded_from` names the fine-tuning record read (None: defaults/arguments)."""
  kind: str  # classification, regression, ner, qa, multiple_choice
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


def recorded_config(path: str) -> tuple[dict[str, Any] | None, str | None]:
  """(training config, where it was read) of the fine-tuning run that wrote `path`: a workdir's latest
  checkpoint, or for its exported model (WORKDIR/export) the run's results.json; (None, None) otherwise."""
  from jbert.checkpoint import manager as checkpoint  # pylint: disable=g-import-not-at-top
  if not os.path.isdir(path):
    return None, None
  directory = checkpoint.find_checkpoint_dir(path)
  if directory is not None:
    ckpt = checkpoint.open_for_reading(directory)
    try:
      step = ckpt.latest_step()
      return (ckpt.read_json(step, "config"), f"{directory}/{step}") if step is not None else (None, None)
    except checkpoint.CheckpointError as e:
      raise ValueError(f"{e} Predict from the run's export/ folder instead.") from None
    finally:
      ckpt.close()
  results = os.path.join(os.path.dirname(os.path.abspath(path)), "results.json")
  try:
    with open(results, encoding="utf-8") as f:
      summary = json.load(f)
  except (OSError, ValueError):
    return None, None
  export = summary.get("export") if isinstance(summary, dict) else None
  same = isinstance(export, str) and os.path.basename(os.path.normpath(export)) == os.path.basename(
      os.path.abspath(path))
  return (summary["config"], results) if same and isinstance(summary.get("config"), dict) else (None, None)


def resolve_settings(info, config: Mapping[str, Any] | None, recorded_from: str | None = None,
                     **explicit) -> PredictSettings:
  """Settings from explicit values (not None), else the run's `config`, else the defaults.

  Args:
    info: `jbert.describe(model)` (a `ModelInfo`) of a fine-tuned model.
    explicit: max_length and the QA keys of `QA_DEFAULTS`.
  """
  from jbert.data import finetune  # pylint: disable=g-import-not-at-top
  from jbert.data.finetune import squad  # pylint: disable=g-import-not-at-top
  unknown = sorted(set(explicit) - {"max_length", *QA_DEFAULTS})
  if unknown:
    raise TypeError(f"Unknown prediction setting(s) {', '.join(unknown)}; use max_length or "
                    f"{', '.join(QA_DEFAULTS)}.")
  explicit = {k: v for k, v in explicit.items() if v is not None}
  kind = HEAD_KINDS[info.head.architecture]
  if kind == "classification" and info.num_labels == 1:
    kind = "regression"  # As transformers reads a one-label sequence classifier.
  task = dict((config or {}).get("task") or {})
  limit = info.config.max_position_embeddings
  max_length = explicit.get("max_length") or ((config or {}).get("data") or {}).get("max_seq_length") or min(
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
  if kind in ("classification", "regression") and name == "local":
    columns = (task.get("text_a"), task.get("text_b"))
  elif kind in ("classification", "regression") and name in finetune.TASKS:
    keys = finetune.TASKS[name].text_keys
    columns = (keys[0], keys[1] if len(keys) > 1 else None)
  qa = {}
  for key, default in QA_DEFAULTS.items():
    if key in explicit and kind != "qa":
      raise ValueError(f"{key} applies to question answering; this model is a {info.head.architecture}.")
    recorded = task.get(key)
    if key == "version_2_with_negative" and name in finetune.TASKS:
      recorded = finetune.TASKS[name].version_2_with_negative
    qa[key] = type(default)(explicit.get(key, default if recorded is None else recorded))
  if kind == "qa":
    squad.check_lengths(max_length, qa["max_query_length"], qa["doc_stride"])
    if qa["n_best_size"] < 1 or qa["max_answer_length"] < 1:
      raise ValueError(f"n_best_size={qa['n_best_size']} and max_answer_length={qa['max_answer_length']} must "
                       "both be >= 1.")
  return PredictSettings(kind=kind, max_length=int(max_length), label_names=labels, columns=columns,
                         recorded_from=recorded_from, **qa)


@functools.lru_cache(maxsize=16)
def _head_fn(config, model_cls: type, num_labels: int | None, kind: str):
  """fn(params, batch) for the Runner: what the trainer's task `predictions` return, per row."""
  from jbert.model import registry  # pylint: disable=g-import-not-at-top
  model = model_cls(config, **registry.head(model_cls).model_kwargs(num_labels))

  def fn(params, batch):
    inputs = [batch[k] for k in _MODEL_INPUTS]
    if kind == "multiple_choice":  # A row is one (context, ending) pair: an example of one choice.
      inputs = [x[:, None, :] for x in inputs]
    out = model.apply({"params": params}, *inputs, deterministic=True)
    if kind == "qa":
      return {"start_logits": out.start_logits, "end_logits": out.end_logits}
    if kind == "ner":
      return {"tags": jnp.argmax(out.logits, -1).astype(jnp.int32)}
    return {"logits": out.logits}

  return fn


class Predictor:
  """A fine-tuned model and its prediction settings; call it on examples (`read` / `examples`) for predictions.

  Everything that can be checked without the weights (head, settings, the input) is checked before they load.
  """

  def __init__(self, model: str | os.PathLike, *, batch_size: int = runner_lib.DEFAULT_BATCH_SIZE,
               dtype: str | None = None, tokenizer: str | None = None, **settings):
    from jbert import weights  # pylint: disable=g-import-not-at-top
    self.path = os.fspath(model)
    if not os.path.exists(self.path) and not os.path.exists(self.path + ".index"):
      raise FileNotFoundError(f"Model path {self.path} does not exist; pass a fine-tuning workdir or a model "
                              "folder (e.g. WORKDIR/export).")
    self.info = weights.describe(self.path)
    head = self.info.head
    if head is None or head.architecture not in HEAD_KINDS:
      what = f"a {head.architecture}" if head else "a checkpoint without a recorded head (config.json architectures)"
      raise ValueError(f"{self.path} is {what}, not a fine-tuned model; predict needs one of "
                       f"{', '.join(HEAD_KINDS)} (use jbert.embed or jbert.fill_mask for the others).")
    self.settings = resolve_settings(self.info, *recorded_config(self.path), **settings)
    self.kind = self.settings.kind
    self.batch_size, self.dtype, self.tokenizer_path = batch_size, dtype, tokenizer
    self._model: LoadedModel | None = None
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
      model = loading.load_model(self.path, self.info.head.cls, tokenizer=self.tokenizer_path, dtype=self.dtype)
      heads = ("classifier", "qa_outputs")
      untrained = [n for n in model.initialised if n.split("/")[0] in heads]
      if untrained:
        raise ValueError(f"{self.path} holds no trained {self.info.head.architecture} head ({', '.join(untrained)} "
                         "were initialised at random), so its predictions would be random; pass a fine-tuned "
                         "model.")
      self._model = model
    return self._model

  def _run(self, features: Mapping[str, np.ndarray], progress) -> list[dict[str, np.ndarray]]:
    """Runner outputs per model sequence of `features` (multiple choice: per (example, ending))."""
    if self._runner is None:
      model, kind = self.model, self.kind
      mesh = runner_lib.default_mesh()
      params = model.placed_params(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
      key = ("predict", model.config, model.model_cls, self.info.num_labels, kind)
      self._runner = runner_lib.Runner(
          _head_fn(model.config, model.model_cls, self.info.num_labels, kind), params, key=key,
          max_length=self.settings.max_length, vocab_size=model.config.vocab_size,
          type_vocab_size=model.config.type_vocab_size, batch_size=self.batch_size, mesh=mesh,
          buckets=(self.settings.max_length,) if kind == "qa" else None,
          token_outputs=("tags",) if kind == "ner" else ())
    length = self.settings.max_length
    ids, types = (features[k].reshape(-1, length) for k in _MODEL_INPUTS[:2])
    used = features["attention_mask"].reshape(-1, length).sum(-1)
    rows = [{"input_ids": i[:n], "token_type_ids": t[:n]} for i, t, n in zip(ids, types, used)]
    return self._runner.run(rows, progress=progress, desc="predict")

  # -- predictions --

  def __call__(self, examples: Sequence[Mapping[str, Any]], progress: bool | None = None) -> list[dict[str, Any]]:
    """One prediction per example (from `read` or `examples`), in order; see the module docstring."""
    examples = list(examples)
    if not examples:
      return []
    predict = {"classification": self._classify, "regression": self._classify, "ner": self._tag,
               "qa": self._answer, "multiple_choice": self._choose}[self.kind]
    return predict(examples, progress)

  def _classify(self, examples, progress):
    from jbert.data import finetune  # pylint: disable=g-import-not-at-top
    paired = ["text_b" in ex for ex in examples]
    if any(paired) and not all(paired):
      raise ValueError(f"{examples[paired.index(False)]['where']} has one text where the others are pairs; give "
                       "every input the same number of texts.")
    if self.settings.columns[1] and not paired[0]:
      raise ValueError(f"The model was fine-tuned on text pairs ({', '.join(self.settings.columns)}); "
                       f"{examples[0]['where']} has a single text (name the second column, or give (text, pair) tuples).")
    keys = ("text_a", "text_b") if paired[0] else ("text_a",)
    features = finetune.classification_features(examples, self.model.tokenizer, self.settings.max_length,
                                                text_keys=keys, label_key=None,
                                                regression=self.kind == "regression")
    logits = np.stack([row["logits"] for row in self._run(features, progress)])  # [N, C]
    if self.kind == "regression":
      return [{"value": float(x[0])} for x in logits]
    names = self.settings.label_names
    probabilities = softmax(logits)  # As SequenceClassification.write_outputs: float64 softmax of the logits.
    return [{"label": names[int(k)], "probabilities": dict(zip(names, map(float, p)))}
            for k, p in zip(np.argmax(logits, -1), probabilities)]

  def _tag(self, examples, progress):
    from jbert.data.finetune import ner  # pylint: disable=g-import-not-at-top
    features = ner.ner_features(examples, self.model.tokenizer, self.settings.max_length, tokens_key="tokens",
                                tags_key="tags")
    tags = np.zeros(features["input_ids"].shape, np.int32)
    for i, row in enumerate(self._run(features, progress)):
      tags[i, :len(row["tags"])] = row["tags"]
    names = self.settings.label_names
    return [{"tokens": list(ex["tokens"]), "tags": [names[t] for t in words]}
            for ex, words in zip(examples, ner.word_predictions(tags, features))]

  def _answer(self, examples, progress):
    from jbert.data.finetune import squad, squad_eval  # pylint: disable=g-import-not-at-top
    s = self.settings
    report = squad.FeatureReport()
    try:
      features = squad.squad_features(examples, self.model.tokenizer, s.max_length, doc_stride=s.doc_stride,
                                      max_query_length=s.max_query_length, training=False, report=report)
    except KeyError as e:
      raise ValueError(e.args[0]) from None
    for line in report.messages("the input", training=False, max_query_length=s.max_query_length):
      log.warning("%s", line)
    rows = self._run(features, progress)
    post = squad_eval.postprocess(
        features, np.stack([r["start_logits"] for r in rows]), np.stack([r["end_logits"] for r in rows]),
        n_best=s.n_best_size, max_answer_length=s.max_answer_length,
        null_score_diff_threshold=s.null_score_diff_threshold, version_2_with_negative=s.version_2_with_negative)
    out = []
    for ex in examples:
      answer = post.answers[ex["id"]]
      score = next((e["probability"] for e in post.nbest[ex["id"]] if e["text"] == answer), 0.0)
      out.append({"id": ex["id"], "answer": answer, "score": float(score)})
    return out

  def _choose(self, examples, progress):
    from jbert.data.finetune import multiple_choice  # pylint: disable=g-import-not-at-top
    # The trainer's features need one number of endings per call: one call per number found.
    by_count = collections.defaultdict(list)
    for i, ex in enumerate(examples):
      by_count[len(ex["endings"])].append(i)
    parts, order = [], []
    for count, indices in by_count.items():
      parts.append(multiple_choice.multiple_choice_features(
          [examples[i] for i in indices], self.model.tokenizer, self.settings.max_length, num_choices=count))
      order += indices
    scores = [float(row["logits"][0]) for part in parts for row in self._run(part, progress)]
    out: list[dict[str, Any] | None] = [None] * len(examples)
    start = 0
    for i in order:
      count = len(examples[i]["endings"])
      # As MultipleChoice.write_outputs: the most probable ending of the float64 softmax.
      p = softmax(np.asarray(scores[start:start + count])[None])[0]
      out[i] = {"label": int(p.argmax()), "probabilities": [float(x) for x in p]}
      start += count
    return out


def softmax(logits: np.ndarray) -> np.ndarray:
  """float64 softmax over the last axis, as the tasks' prediction files compute it."""
  logits = np.asarray(logits, np.float64)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  return p / p.sum(-1, keepdims=True)


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
