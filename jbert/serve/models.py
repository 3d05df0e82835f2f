"""The models a server holds, each with its Runner fixed to a few packed shapes that warm-up compiles.

A folder is served as what it is: a fine-tuned head (`jbert.tasks.for_model`: classifier, regressor, cross-encoder,
NER, question answering, multiple choice) through `jbert.predict`'s Predictor; a sentence-transformers folder, or
a plain encoder given `--pooling`, through `jbert.embed`'s Embedder. Requests are checked and tokenised on the
event loop's side (`embedding_work`, `prediction_work`); the device loop calls `compute` on the works of many
requests at once and hands each its own outputs, computed exactly as the batch commands compute them.

Shapes: rows of `row_lengths(max_length)` tokens, `max_batch_tokens // max_length` rows a batch and its halvings
(`runner.batch_sizes`), so whatever the requests' lengths the Runner meets only the shapes `warm_up` compiled
(each sequence of a packed row is computed alone, so what shares a row never changes an output). On a CPU a
batch's packed rows are computed `CPU_STEP_TOKENS` of them a call, the last call taking the rows left, in rows of
the length that leaves the fewest tokens to compute (`jbert.inference.steps`); warm-up compiles every row count a
call can have.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any, Hashable, Sequence

import numpy as np

from jbert import tasks
from jbert.inference import embedding, loading, runner as runner_lib
from jbert.inference.prediction import Predictor
from jbert.weights import st_folder

log = logging.getLogger("jbert")


class ApiError(Exception):
  """A request refused or failed: the HTTP status and the message its JSON body carries."""

  def __init__(self, status: int, message: str, *, retry_after: int | None = None):
    super().__init__(message)
    self.status, self.message, self.retry_after = status, message, retry_after

  def __reduce__(self):  # a compute worker's answers cross a process boundary (`jbert.serve.compute`)
    return type(self), (self.status, self.message), self.__dict__


def row_lengths(max_length: int) -> tuple[int, ...]:
  """Packed rows' lengths: 32 (a query alone), 128 (sentences several a row), 256 (a paragraph) and max_length
  (long inputs); the Runner stretches rows towards max_length when a batch holds many inputs (`packed.tiers`).
  Without 256 a 240-token input of a 512-token model would take a row of 512: 2x the tokens, 4x the attention."""
  return tuple(sorted({min(n, max_length) for n in (32, 128, 256)} | {max_length}))


# On a CPU a batch is computed 512 tokens a call (`jbert.inference.steps`): 1.5x less CPU time per long input than
# whole [32, 256] batches of a MiniLM-sized model. Long inputs ran within 2% at 512 and 1,024 tokens a call (2 and 4
# rows of 256); short ones in rows of 128 ran 11% faster at 512 than at 256.
CPU_STEP_TOKENS = 512


@dataclasses.dataclass
class Work:
  """One request's share of a batch: what `compute` reads, its inputs, its tokens (after truncation)."""
  payload: Any
  inputs: int
  tokens: int
  group: Hashable = None  # works of one group are computed in one call


class EmbeddingModel:
  """A sentence-transformers folder, or a plain encoder with explicit pooling: `jbert.embed`'s outputs."""
  kind = "embedding"

  def __init__(self, name: str, path: str, *, max_batch_tokens: int, dtype: str | None, pooling: str | None,
               normalize: bool | None):
    if pooling is None and not st_folder.is_sentence_transformer(path):
      raise ValueError(f"--model={path} is an encoder without a pooling of its own (not a sentence-transformers "
                       "folder, not a fine-tuned head): pass --pooling=mean (or cls, max, ...) to serve it.")
    model = loading.load_model(path)
    settings = embedding.embedding_settings(model, pooling, normalize)
    self.name, self.path, self.max_length = name, path, settings.max_length
    self.embedder = embedding.Embedder(model, pooling=pooling, normalize=normalize, dtype=dtype,
                                       batch_size=max(1, max_batch_tokens // self.max_length),
                                       buckets=row_lengths(self.max_length))
    self.tokenizer = model.tokenizer
    self.dim, self.normalize = self.embedder.dim, self.embedder.settings.normalize
    self.runners = (self.embedder.runner,)

  def describe(self) -> dict[str, Any]:
    return {"kind": self.kind, "dimensions": self.dim, "normalized": self.normalize, "max_length": self.max_length,
            "endpoints": ["/v1/embeddings", "/rerank"]}

  def features(self, inputs: Sequence[str | list[int]], *, max_input_tokens: int, truncate: bool,
               what: str = "input") -> list[dict[str, list[int]]]:
    """`jbert.embed`'s features of texts or token-id lists (the text's ids, [CLS] and [SEP] added here); an
    input longer than `max_input_tokens` is a 413 unless `truncate`."""
    lowercase = self.embedder.settings.lowercase
    texts = [i for i, x in enumerate(inputs) if isinstance(x, str)]
    ids: list[list[int] | None] = [None] * len(inputs)
    if texts:
      for i, tokens in zip(texts, self.tokenizer.batch_ids([inputs[i].lower() if lowercase else inputs[i]
                                                            for i in texts])):
        ids[i] = tokens
    vocab = self.embedder.config.vocab_size
    out = []
    for i, x in enumerate(inputs):
      tokens = ids[i] if ids[i] is not None else x
      if ids[i] is None and any(t < 0 or t >= vocab for t in tokens):
        raise ApiError(400, f"{what} {i} holds token ids outside [0, {vocab}), the model's vocabulary.")
      if len(tokens) + 2 > max_input_tokens and not truncate:
        raise ApiError(413, f"{what} {i} has {len(tokens) + 2} tokens, more than --max_input_tokens="
                            f"{max_input_tokens}; shorten it, or send \"truncate\": true to cut it to "
                            f"{min(max_input_tokens, self.max_length)}.")
      built = self.tokenizer.build_inputs(list(tokens), None, max_length=min(max_input_tokens, self.max_length))
      out.append({"input_ids": built["input_ids"], "token_type_ids": built["token_type_ids"]})
    return out

  def work(self, features: list[dict[str, list[int]]]) -> Work:
    return Work(features, len(features), sum(len(f["input_ids"]) for f in features), group="embed")

  def compute(self, works: Sequence[Work]) -> list[np.ndarray | ApiError]:
    """[n, D] float32 embeddings per work; a work whose outputs are not finite gets a 500 naming its inputs, and
    the others are computed again without it (a NaN spreads through its packed row)."""
    features = [f for w in works for f in w.payload]
    bounds = np.cumsum([0] + [w.inputs for w in works])
    try:
      rows = self.embedder.runner.run(features, progress=False)
    except runner_lib.NonFiniteOutput as e:
      owner = np.searchsorted(bounds, e.rows, side="right") - 1
      bad = {int(k): [int(r - bounds[k]) for r, o in zip(e.rows, owner) if o == k] for k in set(owner.tolist())}
      rest = [k for k in range(len(works)) if k not in bad]
      again = iter(self.compute([works[k] for k in rest]) if rest else [])
      return [ApiError(500, f"the model's outputs for inputs {runner_lib.describe_rows(bad[k])} (0-based) are not "
                            f"finite (NaN or inf): {runner_lib.NON_FINITE_FIX}.") if k in bad else next(again)
              for k in range(len(works))]
    vectors = np.stack([r["embedding"] for r in rows]).astype(np.float32, copy=False)
    return [vectors[bounds[k]:bounds[k + 1]] for k in range(len(works))]

  def layout(self, works: Sequence[Work]) -> tuple[int, int]:
    """(packed rows, padding tokens) of the batch `compute` ran: the plan the Runner made of these lengths."""
    lengths = [len(f["input_ids"]) for w in works for f in w.payload]
    batches = self.embedder.runner.computed(lengths)
    return sum(rows for rows, _ in batches), int(sum(rows * length for rows, length in batches) - sum(lengths))


class PredictionModel:
  """A fine-tuned head through `jbert.predict`'s Predictor: the records `jbert.predict` writes."""
  kind = "prediction"

  def __init__(self, name: str, path: str, *, max_batch_tokens: int, dtype: str | None):
    self.name, self.path = name, path
    self.predictor = Predictor(path, dtype=dtype)
    self.max_length = self.predictor.max_length
    # Set before the Runner is built (on first use): the server's shapes.
    self.predictor.batch_size = max(1, max_batch_tokens // self.max_length)
    self.predictor.buckets = row_lengths(self.max_length)
    self.task = self.predictor.task
    self.runners = (self.predictor.runner,)  # loads the weights
    self.tokenizer = self.predictor.model.tokenizer
    # Where each input is one model sequence (a text or a pair), --max_input_tokens applies; the other tasks
    # window or cut their inputs as jbert.predict does.
    self.counted = self.task.one_sequence_per_input
    self.scores_pairs = self.task.scores_pairs

  def describe(self) -> dict[str, Any]:
    endpoints = ["/predict"] + (["/rerank"] if self.scores_pairs else [])
    return {"kind": self.kind, "task": self.predictor.kind, "architecture": self.predictor.info.head.architecture,
            "max_length": self.max_length, "endpoints": endpoints}

  def examples(self, inputs: Sequence[Any], *, max_input_tokens: int, truncate: bool) -> tuple[list[dict], int]:
    """(the task's examples of `inputs`, their tokens); bad inputs are a 400 naming them."""
    try:
      examples = self.predictor.examples(list(inputs))
    except (TypeError, ValueError) as e:
      raise ApiError(400, str(e)) from None
    lengths = self._lengths(examples)
    for i, n in enumerate(lengths):
      if self.counted and n > max_input_tokens and not truncate:
        raise ApiError(413, f"input {i} has {n} tokens, more than --max_input_tokens={max_input_tokens}; shorten "
                            f"it, or send \"truncate\": true to cut it to {self.max_length} as jbert.predict does.")
    return examples, sum(min(n, self.max_length) if self.counted else n for n in lengths)

  def _lengths(self, examples: Sequence[dict]) -> list[int]:
    """Tokens of each example: its texts' word pieces and the special tokens ([CLS], a [SEP] per text)."""
    texts = [[v for k, v in sorted(ex.items()) if k != "where" and isinstance(v, str)]
             + [t for v in ex.values() if isinstance(v, (list, tuple)) for t in v if isinstance(t, str)]
             for ex in examples]
    flat = self.tokenizer.batch_ids([t for group in texts for t in group]) if any(texts) else []
    out, k = [], 0
    for group in texts:
      out.append(1 + sum(len(ids) + 1 for ids in flat[k:k + len(group)]))
      k += len(group)
    return out

  def work(self, examples: list[dict], tokens: int) -> Work:
    # Examples featurised together must be alike (a pair or not, the same fields): one call per kind.
    return Work(examples, len(examples), tokens, group=tuple(sorted(set(examples[0]) - {"where"})))

  def compute(self, works: Sequence[Work]) -> list[list[dict] | ApiError]:
    """The records of each work's examples. A failure of the whole call (non-finite outputs name the failing
    inputs) runs each work alone, so only the requests whose own inputs fail get the 500, naming their inputs."""
    examples = [ex for w in works for ex in w.payload]
    try:
      records = self.predictor(examples, progress=False)
    except ValueError as e:
      if len(works) == 1:
        return [ApiError(500, str(e))]
      return [out for w in works for out in self.compute([w])]
    bounds = np.cumsum([0] + [w.inputs for w in works])
    return [records[bounds[k]:bounds[k + 1]] for k in range(len(works))]

  def layout(self, works: Sequence[Work]) -> None:
    del works  # the Predictor featurises inside its call (windows, endings): rows and padding are not counted


def load(name: str, path: str, *, max_batch_tokens: int, dtype: str | None, pooling: str | None,
         normalize: bool | None) -> EmbeddingModel | PredictionModel:
  """The served model of folder `path`: a fine-tuned head is predicted with, anything else embedded."""
  from jbert.inference import folder as folder_lib  # pylint: disable=g-import-not-at-top
  folder_lib.require_exists(path)
  if tasks.for_model(folder_lib.resolve(path)) is not None:
    model = PredictionModel(name, path, max_batch_tokens=max_batch_tokens, dtype=dtype)
  else:
    model = EmbeddingModel(name, path, max_batch_tokens=max_batch_tokens, dtype=dtype, pooling=pooling,
                           normalize=normalize)
  for runner in model.runners:
    if runner.mesh.devices.flat[0].platform == "cpu":
      runner.step_tokens = CPU_STEP_TOKENS
  return model


def warm_up(model: EmbeddingModel | PredictionModel) -> int:
  """Runs every (row length, batch size) the model's Runner can meet once, so requests compile nothing (from
  the compile cache where it holds them); returns the programs compiled or loaded."""
  before = runner_lib.compiled_count()
  tokenizer = model.tokenizer
  extra = [k for k in getattr(getattr(model, "task", None), "predict_keys", ()) if k not in tasks.MODEL_INPUTS]
  for runner in model.runners:
    for length in runner.buckets:
      ids = [tokenizer.cls_id] + [tokenizer.unk_id] * (length - 2) + [tokenizer.sep_id]
      # An extra input (the CRF's word positions) is padded to the next power of two of the batch's longest
      # (`runner.extra_widths`), at most the row's length: each of those widths is a program of its own.
      widths = [1 << i for i in range((length - 1).bit_length() + 1)] if extra else [length]
      for width in widths:
        feature = {"input_ids": ids, "token_type_ids": [0] * length, **{k: [1] * width for k in extra}}
        # `size` inputs of `length` tokens fill `size` rows of `length`: one batch (or step) of that shape.
        for size in runner.row_counts(length):
          try:
            runner.run([feature] * size, progress=False)
          except runner_lib.NonFiniteOutput:
            pass  # compiled all the same; an input that overflows is refused when a request sends it
  return runner_lib.compiled_count() - before


def model_name(spec: str) -> tuple[str, str]:
  """(name, path) of a --model value: `NAME=PATH`, or a path served under its folder's name."""
  head, sep, tail = spec.partition("=")
  if sep and head and os.sep not in head and not os.path.exists(spec):
    return head, tail
  return os.path.basename(os.path.normpath(spec)), spec
