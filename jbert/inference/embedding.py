"""Sentence embeddings and hidden-layer features: pooled over the attention mask, optionally unit length.

Poolings: `cls` (the [CLS] vector), `pooler` (BERT's trained tanh pooler on [CLS]), `mean` and `max` over the
real tokens ([CLS] and [SEP] included, as sentence-transformers does), and sentence-transformers' other modes
`mean_sqrt_len_tokens`, `weightedmean`, `lasttoken`. Several poolings are concatenated in the order given.
`layers` picks hidden states (0 = embeddings output, 1..L the layers, negative from the end; default the last)
and `layer_combine` joins them: "concat" (the BERT paper's feature-based approach over the last four) or "mean".
A sentence-transformers folder brings its own pooling, Dense projection, normalisation, maximum length and
lower-casing; explicit arguments override them. The poolings are `jbert.model.pooling`'s, run by the same
`SentenceEncoder` that the bi-encoder tasks train. An empty text embeds `[CLS] [SEP]`. By default the texts are
packed (`jbert.inference.packed`): several a row, each pooled alone, so a call compiles a few shapes whatever its
lengths; `packing=False` pads each length-sorted batch to a bucket length instead.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Iterable, Iterator, Sequence

import jax
import numpy as np

from jbert.inference import folder, loading, runner as runner_lib
from jbert.inference.loading import LoadedModel
from jbert.inference.progress import ProgressLine
from jbert.inference.text import Record, encode_records
from jbert.weights import st_folder
from jbert.model import pooling as pooling_lib
from jbert.model import validation
from jbert.model.sentence import Projection, pooled_width

log = logging.getLogger("jbert")

POOLINGS = pooling_lib.MODES
LAYER_COMBINES = pooling_lib.LAYER_COMBINES
_NO_POOLING = ("{path} is not a sentence-transformers folder with a Pooling module, so it brings no pooling of its "
               f"own: pass pooling= (--pooling=) one of {', '.join(POOLINGS)}.")


@dataclasses.dataclass(frozen=True)
class EmbedSettings:
  pooling: tuple[str, ...]
  normalize: bool
  layers: tuple[int, ...]  # Non-negative hidden-state indices (0 = embeddings output).
  layer_combine: str
  max_length: int
  lowercase: bool
  projection: Projection | None = None  # A sentence-transformers folder's Dense module.


def embedding_settings(model: LoadedModel, pooling: str | Sequence[str] | None = None, normalize: bool | None = None,
                     layers: int | str | Sequence[int] | None = None, layer_combine: str = "concat",
                     max_length: int | None = None) -> EmbedSettings:
  """The settings an embedding run uses: explicit arguments, else the sentence-transformers folder's own."""
  st = model.sentence_transformer
  config = model.config
  if pooling is None:
    if st is None or st.pooling is None:
      raise ValueError(_NO_POOLING.format(path=model.path))
    pooling = st.pooling
  modes = _pooling_modes(pooling)
  _check_layer_combine(layer_combine)
  hidden = parse_layers(layers, config.num_hidden_layers)
  if "pooler" in modes:
    if hidden != (config.num_hidden_layers,):
      raise ValueError("pooling='pooler' reads the last layer's [CLS] through the trained pooler; it cannot "
                       f"combine with layers={list(hidden)}. Use cls/mean/max for other layers.")
    if any("pooler" in n.split("/") for n in model.initialised):
      raise ValueError(f"{model.path} has no trained pooler weights (pooler.dense.*), so pooling='pooler' would "
                       "use random ones; use pooling='cls' or 'mean'.")
  limit = config.max_length  # RoBERTa's first position_offset rows of the table serve padding
  if max_length is None:
    max_length = st.max_length if st is not None and st.max_length else limit
  if not 2 <= max_length <= limit:
    raise ValueError(f"max_length={max_length} must lie in [2, {limit}] ({validation.position_limit(config)}).")
  projection = st.dense if st is not None else None
  if projection is not None and pooled_width(config, modes, hidden, layer_combine) != projection.in_features:
    raise ValueError(f"{model.path} projects {projection.in_features}-wide pooled vectors (its Dense module), but "
                     f"pooling={','.join(modes)} over layers {list(hidden)} gives "
                     f"{pooled_width(config, modes, hidden, layer_combine)}; keep the folder's own pooling.")
  return EmbedSettings(pooling=modes, normalize=st.normalize if normalize is None and st else bool(normalize),
                       layers=hidden, layer_combine=layer_combine, max_length=int(max_length),
                       lowercase=bool(st and st.lowercase), projection=projection)


def _pooling_modes(pooling: str | Sequence[str]) -> tuple[str, ...]:
  modes = tuple(p.strip() for p in pooling.split(",")) if isinstance(pooling, str) else tuple(pooling)
  unknown = [m for m in modes if m not in POOLINGS]
  if unknown or not modes:
    raise ValueError(f"Unknown pooling {', '.join(unknown) or '(none)'}; use one or more of {', '.join(POOLINGS)}.")
  return modes


def _check_layer_combine(layer_combine: str) -> None:
  if layer_combine not in LAYER_COMBINES:
    raise ValueError(f"Unknown layer_combine {layer_combine!r}; use {' or '.join(LAYER_COMBINES)}.")


def _layer_list(layers: int | str | Sequence[int]) -> list[int]:
  if isinstance(layers, str):
    try:
      return [int(x) for x in layers.split(",") if x.strip()]
    except ValueError:
      raise ValueError(f"layers={layers!r}: give comma-separated integers such as -4,-3,-2,-1.") from None
  if isinstance(layers, (int, np.integer)):
    return [int(layers)]
  return [int(i) for i in layers]


def parse_layers(layers: int | str | Sequence[int] | None, num_layers: int) -> tuple[int, ...]:
  """Hidden-state indices as non-negative ints; for 12 layers "-4,-3,-2,-1" -> (9, 10, 11, 12), None -> (12,)."""
  if layers is None:
    return (num_layers,)
  out = []
  for i in _layer_list(layers):
    if not -(num_layers + 1) <= i <= num_layers:
      raise ValueError(f"Layer index {i} is out of range for a {num_layers}-layer model: use 0..{num_layers} "
                       f"(0 = embeddings output) or -{num_layers + 1}..-1.")
    out.append(i % (num_layers + 1))
  if not out:
    raise ValueError("layers is empty; name at least one hidden state, e.g. -1.")
  return tuple(out)


def embedding_dim(config, settings: EmbedSettings) -> int:
  if settings.projection is not None:
    return settings.projection.out_features
  return pooled_width(config, settings.pooling, settings.layers, settings.layer_combine)


@functools.lru_cache(maxsize=64)
def embedding_fn(config, settings: EmbedSettings):
  """fn(params, batch) -> {"embedding": float32 [B, D]} for the Runner (packed rows: [R, S, D], one per slot),
  params {"bert": ..., "dense": ...}; one function object per settings, so the compiled executables are shared by
  every call that uses them."""
  from jbert.model.sentence import SentenceEncoder  # pylint: disable=g-import-not-at-top
  model = SentenceEncoder(config, pooling=settings.pooling, layers=settings.layers,
                          layer_combine=settings.layer_combine, projection=settings.projection,
                          normalize=settings.normalize)

  def fn(params, batch):
    packed = {k: batch[k] for k in ("segment_ids", "position_ids", "cls_positions") if k in batch}
    out = model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                      **packed)
    return {"embedding": out.embeddings}  # [B, D], packed [R, S, D]

  return fn


class Embedder:
  """A model, its settings and a Runner: call it on records (texts or (text, pair) tuples) for [N, D] float32."""

  def __init__(self, model: LoadedModel | str, *, pooling=None, normalize: bool | None = None, layers=None,
               layer_combine: str = "concat", batch_size: int = runner_lib.DEFAULT_BATCH_SIZE,
               max_length: int | None = None, dtype: str | None = None,
               bucket_step: int | None = None, tokenizer: str | None = None, packing: bool = True,
               buckets: Sequence[int] | None = None):
    if not isinstance(model, LoadedModel):
      # Everything that can be checked without the weights is checked before reading them.
      folder.require_exists(model)
      if pooling is None and not st_folder.is_sentence_transformer(model):
        raise ValueError(_NO_POOLING.format(path=model))
      if pooling is not None:
        _pooling_modes(pooling)
      _check_layer_combine(layer_combine)
      if layers is not None:
        _layer_list(layers)
      model = loading.load_model(model, tokenizer=tokenizer)
    config = model.config if dtype is None else model.config.replace(dtype=dtype)
    self.model, self.config = model, config
    self.settings = embedding_settings(model, pooling, normalize, layers, layer_combine, max_length)
    self.dim = embedding_dim(config, self.settings)
    mesh = runner_lib.default_mesh()
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    params = model.placed_params(replicated)
    if "pooler" not in self.settings.pooling and isinstance(params, dict):
      params = {k: v for k, v in params.items() if k != "pooler"}
    params = {"bert": params}  # SentenceEncoder's tree
    if self.settings.projection is not None:
      params["dense"] = jax.device_put(model.dense_params, replicated)
    self.runner = runner_lib.Runner(
        embedding_fn(config, self.settings), params, key=("embed", config, self.settings),
        max_length=self.settings.max_length, vocab_size=config.vocab_size, type_vocab_size=config.type_vocab_size,
        batch_size=batch_size, bucket_step=bucket_step, buckets=buckets, mesh=mesh,
        packing=packing, stored=True)  # the key names the model and the settings by value
    self.truncated = 0

  def __call__(self, records: Sequence[Record], progress: ProgressLine | bool | None = None, *,
               offset: int = 0) -> np.ndarray:
    """Embeddings of `records`; `offset` (the index of the first record in the whole input) names bad rows."""
    records = list(records)
    if not records:
      return np.zeros((0, self.dim), np.float32)
    features, truncated = encode_records(self.model.tokenizer, records, self.settings.max_length,
                                         lowercase=self.settings.lowercase)
    self.truncated += truncated
    try:
      rows = self.runner.run(features, progress=progress, desc="embed")
    except runner_lib.NonFiniteOutput as e:
      raise ValueError(f"The embeddings of inputs {runner_lib.describe_rows([offset + r for r in e.rows])} (0-based, "
                       f"in input order) are not finite (NaN or inf): {runner_lib.NON_FINITE_FIX}.") from None
    return np.stack([r["embedding"] for r in rows]).astype(np.float32, copy=False)

  def stream(self, records: Iterable[Record], chunk_size: int = runner_lib.DEFAULT_CHUNK_SIZE,
             progress: ProgressLine | None = None) -> Iterator[np.ndarray]:
    """Embeddings of consecutive chunks of `records`, in order; memory bounded by the chunk."""
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)) or chunk_size < 1:
      raise ValueError(f"chunk_size must be a positive int (inputs embedded together), got {chunk_size!r}.")
    chunk: list[Record] = []
    offset = 0
    for record in records:
      chunk.append(record)
      if len(chunk) == chunk_size:
        yield self(chunk, progress=progress or False, offset=offset)
        offset += len(chunk)
        chunk = []
    if chunk:
      yield self(chunk, progress=progress or False, offset=offset)

  def report_truncation(self, total: int) -> None:
    if self.truncated:
      log.warning("%d of %d inputs had more than max_length=%d tokens and were truncated.", self.truncated, total,
                  self.settings.max_length)


def embed(texts: Sequence[Record], model: LoadedModel | str, *, pooling: str | Sequence[str] | None = None,
          normalize: bool | None = None, layers: int | str | Sequence[int] | None = None,
          layer_combine: str = "concat", batch_size: int = runner_lib.DEFAULT_BATCH_SIZE,
          max_length: int | None = None, dtype: str | None = None, progress: bool | None = None,
          tokenizer: str | None = None, packing: bool = True) -> np.ndarray:
  """Embeddings `[N, D]` float32 of `texts` (strings, or `(text, pair)` tuples), row i for text i.

  Args:
    texts: the inputs.
    model: a path (sentence-transformers folder, Hugging Face dir, TF1 checkpoint, jbert dir or workdir) or a
      `LoadedModel` from `jbert.inference.load_model` (load once, embed many times).
    pooling: one of `POOLINGS` or several (concatenated); default the sentence-transformers folder's own.
    normalize: unit-length rows; default the folder's (a Normalize module), else False.
    layers: hidden states to pool, e.g. -1 (default), "-4,-3,-2,-1" or [9, 10, 11, 12].
    layer_combine: "concat" or "mean" of the chosen layers.
    batch_size: rows per batch (packed: rows of up to max_length tokens, several texts each); max_length: tokens per
      input, special tokens included (default the folder's, else the model's `max_length`); longer inputs are
      truncated and counted in one warning.
    dtype: compute dtype, e.g. "bfloat16"; the embeddings are float32 either way.
    progress: a progress line on stderr (default: for large inputs).
    tokenizer: a tokenizer file or folder when the model folder has none.
    packing: several texts a row, each pooled alone (default); False: each text a row of its own, padded to a
      bucket length. The embeddings agree to float32 rounding (about 1e-6).
  """
  embedder = Embedder(model, pooling=pooling, normalize=normalize, layers=layers, layer_combine=layer_combine,
                      batch_size=batch_size, max_length=max_length, dtype=dtype, tokenizer=tokenizer,
                      packing=packing)
  out = embedder(texts, progress=progress)
  embedder.report_truncation(len(out))
  return out
