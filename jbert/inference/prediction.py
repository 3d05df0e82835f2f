"""Predictions of fine-tuned models: label and probabilities, value, answer, word tags or chosen ending per input.

`Predictor(model)` resolves the model folder (head, label names, the kind of task that trained it: `jbert.describe`)
and asks the task registry which task serves it (`jbert.tasks.for_model`: the kind jbert recorded with the model,
else the head's architecture, for transformers' and sentence-transformers' folders). That task, built from what
the folder records (`for_prediction`: for a training workdir or its `export/`, the fine-tuning run's own
preprocessing, `data.max_seq_length`, text columns, SQuAD's windows and null threshold; explicit arguments
override those, and other folders take the task's defaults), reads the inputs, featurises them and turns outputs
into records with the trainer's own code, so a run's evaluation file gives the predictions the run wrote to
WORKDIR/predictions/.

The model runs through `jbert.inference.Runner` rather than the trainer's jitted predict step: where the task
packs (`packable`: classification, regression, cross-encoders, NER, multiple choice) the inputs are packed several
a row (`jbert.inference.packed`), a few compiled shapes whatever their lengths;
otherwise they are sorted by length and cut to bucket lengths where the task allows it (`bucketable`: question
answering keeps full-length windows, since SQuAD post-processing ranks the top `n_best_size` logits of every
position, padding included, as `run_squad.py` and the trainer do; a CRF's chain reads `predict_mask` per row).
Executables are cached per process, ids are checked on the host, and no optimiser or training state is built.

Outputs, one dict per input in input order (each task's `records`):
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
import os
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jbert import tasks
from jbert.inference import folder as folder_lib
from jbert.inference import loading, runner as runner_lib
from jbert.inference.loading import LoadedModel
from jbert.tasks import options as task_options


def check_options(options: Mapping[str, Any], served: type[tasks.PredictingTask], architecture: str) -> None:
  """Refuses a setting no task knows (a TypeError, as for any unknown keyword) or one of another task."""
  known = {name: owners[0] for name, (_, owners) in
           task_options.collect(cls for cls in tasks.TASKS.classes() if cls.predicts).items()}
  unknown = sorted(set(options) - {"max_length", *known})
  if unknown:
    raise TypeError(f"Unknown prediction setting(s) {', '.join(unknown)}; use max_length or "
                    f"{', '.join(known)}.")
  for name, value in options.items():
    if value is not None and name != "max_length" and name not in task_options.names(served):
      raise ValueError(f"{name} applies to {known[name].title}; this model is a {architecture}.")


class Predictor:
  """A fine-tuned model and its prediction settings; call it on examples (`read` / `examples`) for predictions.

  Everything that can be checked without the weights (head, settings, the input) is checked before they load.
  """

  def __init__(self, model: str | os.PathLike, *, batch_size: int = runner_lib.DEFAULT_BATCH_SIZE,
               dtype: str | None = None, tokenizer: str | None = None, packing: bool = True,
               buckets: Sequence[int] | None = None, **settings):
    from jbert.weights import remote  # pylint: disable=g-import-not-at-top
    self.path = os.fspath(model)
    if not remote.exists(self.path):
      raise FileNotFoundError(f"Model path {self.path} does not exist; pass a fine-tuning workdir or a model "
                              "folder (e.g. WORKDIR/export).")
    self.folder = folder_lib.resolve(self.path)  # Follows the path once; reads no weights.
    self.info = self.folder.info
    served = tasks.for_model(self.folder)
    if served is None:
      head = self.info.head
      what = f"a {head.architecture}" if head else "a checkpoint without a recorded head (config.json architectures)"
      heads = dict.fromkeys(c.head.architecture for c in tasks.TASKS.classes() if c.predicts)
      raise ValueError(f"{self.path} is {what}, not a fine-tuned model; predict needs one of "
                       f"{', '.join(heads)} (use jbert.embed or jbert.fill_mask for the others).")
    cls, self.kind = served
    check_options(settings, cls, self.info.head.architecture)
    options = {k: v for k, v in settings.items() if v is not None and k != "max_length"}
    # The task that serves the model: its settings are checked here, before any weight loads.
    self.task = cls.for_prediction(self.folder, kind=self.kind, max_length=settings.get("max_length"), **options)
    self.max_length = self.task.max_seq_length
    self.recorded_from = self.folder.run_config_from  # the fine-tuning run's record read, or None
    self.batch_size, self.dtype, self.tokenizer_path = batch_size, dtype, tokenizer
    # Row lengths the Runner may use (a server fixes them so that warm-up compiles every shape); default its own.
    self.buckets = tuple(buckets) if buckets else None
    # Packed rows carry the model inputs only: a task whose predictions read more (a CRF's chain) runs unpacked.
    self.packing = packing and self.task.packable and set(self.task.predict_keys) <= set(tasks.MODEL_INPUTS)
    self._model: LoadedModel | None = None
    self._runner = None

  # -- inputs --

  def read(self, path: str, column: str | None = None, pair_column: str | None = None,
           pairs: bool = False) -> list[dict[str, Any]]:
    """Examples of an input file, as the task reads them (its `read_inputs`)."""
    return self.task.read_inputs(path, column=column, pair_column=pair_column, pairs=pairs)

  def examples(self, records: Sequence[Any]) -> list[dict[str, Any]]:
    """Examples of Python inputs, as the task reads them (its `inputs_from`)."""
    return self.task.inputs_from(records)

  # -- model --

  @property
  def model(self) -> LoadedModel:
    if self._model is None:
      model = loading.load_model(self.folder, self.info.head.cls, tokenizer=self.tokenizer_path, dtype=self.dtype)
      heads = {w.path[0] for w in self.info.head.linear_weights}
      untrained = [n for n in model.initialised if n.split("/")[0] in heads]
      if untrained:
        raise ValueError(f"{self.path} holds no trained {self.info.head.architecture} head ({', '.join(untrained)} "
                         "were initialised at random), so its predictions would be random; pass a fine-tuned "
                         "model.")
      self._model = model
      self.task.tokenizer = model.tokenizer
    return self._model

  @property
  def runner(self) -> runner_lib.Runner:
    """The Runner the model's sequences go through (built on first use)."""
    if self._runner is None:
      model, task, length = self.model, self.task, self.max_length
      mesh = runner_lib.default_mesh()
      replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
      params = task.prediction_params(model.params, self.folder)  # the task's own beside the head's, if any
      params = model.placed_params(replicated) if params is model.params else jax.device_put(params, replicated)
      module = task.model(model.config)
      key = ("predict", model.config, type(module), self.info.num_labels, self.kind)
      self._runner = runner_lib.Runner(
          task.predict_fn(module), params,
          key=key, max_length=length, vocab_size=model.config.vocab_size,
          type_vocab_size=model.config.type_vocab_size, batch_size=self.batch_size, mesh=mesh,
          buckets=self.buckets if task.bucketable else (length,), token_outputs=task.token_outputs,
          packing=self.packing)
    return self._runner

  def _run(self, features: Mapping[str, np.ndarray], progress) -> dict[str, np.ndarray]:
    """The task's `predictions` for `features` (leading shape [N] or, multiple choice, [N, C]), each model
    sequence run alone at its bucket length."""
    length = self.max_length
    lead = features["input_ids"].shape[:-1]
    ids, types = (features[k].reshape(-1, length) for k in ("input_ids", "token_type_ids"))
    used = features["attention_mask"].reshape(-1, length).sum(-1)
    # Per-token features the task's predictions read besides the model inputs (a CRF's chain: `predict_mask`).
    extra = {k: features[k].reshape(-1, length) for k in self.task.predict_keys if k not in tasks.MODEL_INPUTS}
    rows = [{"input_ids": i[:n], "token_type_ids": t[:n], **{k: v[r, :n] for k, v in extra.items()}}
            for r, (i, t, n) in enumerate(zip(ids, types, used))]
    outputs = self.runner.run(rows, progress=progress, desc="predict")
    stacked = {}
    for key in outputs[0]:
      if key in self.task.token_outputs:  # per token of each row, up to its length
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
    self.model  # pylint: disable=pointless-statement  (the task featurises with the model's tokenizer)
    groups = collections.defaultdict(list)  # examples featurised together (multiple choice: one ending count)
    for i, ex in enumerate(examples):
      groups[self.task.group_key(ex)].append(i)
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
            tokenizer: str | None = None, packing: bool = True, **task_settings) -> list[dict[str, Any]]:
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
    batch_size: model sequences per batch (packed: rows of up to max_length tokens, several sequences each).
    max_length: tokens per sequence, special tokens included; default the fine-tuning run's
      `data.max_seq_length`, else 128 (question answering 384), at most max_position_embeddings.
    dtype: compute dtype, e.g. "bfloat16"; default the checkpoint's.
    progress: a progress line on stderr (default: for large inputs).
    tokenizer: a tokenizer file or folder when the model folder has none.
    packing: several sequences a row where the task allows it (default); False: one a row, length-bucketed.
      The predictions agree to float32 rounding.
    task_settings: the serving task's `declared_options` (`jbert.tasks.options`; `python -m jbert.predict --help`
      lists them as flags), as question answering's windows and n-best search (default: the run's, else the
      declared defaults).
  """
  predictor = Predictor(model, batch_size=batch_size, dtype=dtype, tokenizer=tokenizer, max_length=max_length,
                        packing=packing, **task_settings)
  single = isinstance(inputs, (str, dict, tuple))
  return predictor(predictor.examples([inputs] if single else inputs), progress=progress)
