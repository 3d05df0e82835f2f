"""Token vectors -> one sentence vector: the poolings of sentence-transformers, shared by training and serving.

Modes: `cls` (the first token), `max` and `mean` over the real tokens ([CLS] and [SEP] included, as
sentence-transformers counts them), `mean_sqrt_len_tokens` (the sum over sqrt(length)), `weightedmean` (token i
weighted by its position i + 1), `lasttoken` (the last real token), and jbert's `pooler` (BERT's trained tanh
pooler on [CLS], which the caller computes). Several modes are concatenated in the order given, as
sentence-transformers' Pooling module concatenates them. Hidden states of several layers are joined first
(`combine_layers`). Pure jnp: `jbert.model.sentence.SentenceEncoder` and `jbert.inference.embedding` call it.
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp

# sentence-transformers' Pooling modes, in the order its legacy `pooling_mode_*` booleans list them.
ST_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
MODES = ("cls", "pooler", "mean", "max") + tuple(m for m in ST_MODES if m not in ("cls", "max", "mean"))
LAYER_COMBINES = ("concat", "mean")
# torch.nn.functional.normalize's eps: a zero vector stays zero rather than becoming NaN.
NORMALIZE_EPS = 1e-12


def pool(mode: str, x: jax.Array, mask: jax.Array, pooled: jax.Array | None = None) -> jax.Array:
  """x: float32 [B, T, H]; mask: float32 [B, T] (1 = real token); pooled: [B, H] for `pooler`. Returns [B, H]."""
  m = mask[..., None]  # [B, T, 1]
  if mode == "cls":
    return x[:, 0]
  if mode == "pooler":
    if pooled is None:
      raise ValueError("pooling 'pooler' needs BERT's pooler output; build the model with its pooler.")
    return pooled
  if mode == "max":
    return jnp.max(jnp.where(m > 0, x, -jnp.inf), axis=1)
  if mode in ("mean", "mean_sqrt_len_tokens"):
    count = jnp.maximum(jnp.sum(m, axis=1), 1e-9)  # [B, 1]
    return jnp.sum(x * m, axis=1) / (count if mode == "mean" else jnp.sqrt(count))
  if mode == "weightedmean":
    w = m * jnp.arange(1, x.shape[1] + 1, dtype=x.dtype)[None, :, None]  # [B, T, 1]: position 1..T
    return jnp.sum(x * w, axis=1) / jnp.maximum(jnp.sum(w, axis=1), 1e-9)
  if mode == "lasttoken":
    last = jnp.sum(mask, axis=1).astype(jnp.int32) - 1  # [B]
    return jnp.take_along_axis(x, last[:, None, None], axis=1)[:, 0]
  raise ValueError(f"Unknown pooling {mode!r}; use one or more of {', '.join(MODES)}.")


def pool_all(modes: Sequence[str], x: jax.Array, mask: jax.Array, pooled: jax.Array | None = None) -> jax.Array:
  """The modes' vectors concatenated: [B, len(modes) * H]."""
  return jnp.concatenate([pool(mode, x, mask, pooled) for mode in modes], -1)


def pool_all_segments(modes: Sequence[str], x: jax.Array, segment_ids: jax.Array, cls_positions: jax.Array,
                      pooled: jax.Array | None = None) -> jax.Array:
  """Packed rows: the modes' vectors of each sequence concatenated, [R, S, len(modes) * H]."""
  return jnp.concatenate([pool_segments(mode, x, segment_ids, cls_positions, pooled) for mode in modes], -1)


def combine_layers(hidden_states: Sequence[jax.Array], layers: Sequence[int], combine: str) -> jax.Array:
  """The chosen hidden states (0 = embeddings output) as float32 [B, T, H'] (`concat`: H' = len(layers) * H;
  `mean`: H' = H)."""
  picked = [hidden_states[i].astype(jnp.float32) for i in layers]  # n x [B, T, H]
  if combine == "concat":
    return jnp.concatenate(picked, -1)
  if combine == "mean":
    return sum(picked) / len(picked)
  raise ValueError(f"Unknown layer_combine {combine!r}; use {' or '.join(LAYER_COMBINES)}.")


def normalize(e: jax.Array) -> jax.Array:
  """Unit-length rows [..., D], as sentence-transformers' Normalize module (torch's normalize)."""
  return e / jnp.maximum(jnp.linalg.norm(e, axis=-1, keepdims=True), NORMALIZE_EPS)


def pool_segments(mode: str, x: jax.Array, segment_ids: jax.Array, cls_positions: jax.Array,
                  pooled: jax.Array | None = None) -> jax.Array:
  """`pool` of each sequence of packed rows: x float32 [R, T, H]; segment_ids [R, T] (slot s is segment s + 1);
  cls_positions [R, S] (each sequence's first token); pooled [R, S, H] for `pooler`. Returns [R, S, H], what each
  sequence pools to alone (an empty slot gives zeros, or the first token for cls/lasttoken)."""
  if mode in ("cls", "pooler"):
    if mode == "pooler":
      return pool(mode, x, segment_ids, pooled)
    return jnp.take_along_axis(x, cls_positions[..., None], axis=1)                       # [R, S, H]
  s = cls_positions.shape[1]
  m = (segment_ids[:, None, :] == jnp.arange(1, s + 1)[None, :, None]).astype(x.dtype)   # [R, S, T]
  count = jnp.sum(m, axis=-1, keepdims=True)                                               # [R, S, 1]
  if mode == "max":  # an empty slot's -inf would turn into NaN gradients downstream: 0 instead
    def slot_max(segment):  # a slot at a time: [R, T, H] live, not [R, S, T, H] (BERT-base, 32 x 512: 3.2 GB)
      return jnp.max(jnp.where((segment_ids == segment)[..., None], x, -jnp.inf), axis=1)  # [R, H]
    top = jnp.moveaxis(jax.lax.map(slot_max, jnp.arange(1, s + 1)), 0, 1)                # [R, S, H]
    return jnp.where(count > 0, top, 0.0)
  if mode in ("mean", "mean_sqrt_len_tokens"):
    total = jnp.einsum("rst,rth->rsh", m, x)                                               # [R, S, H]
    count = jnp.maximum(count, 1e-9)
    return total / (count if mode == "mean" else jnp.sqrt(count))
  if mode == "weightedmean":  # token i of its sequence weighs i + 1
    first = cls_positions[..., None].astype(x.dtype)                                       # [R, S, 1]
    w = m * (jnp.arange(x.shape[1], dtype=x.dtype)[None, None, :] - first + 1)             # [R, S, T]
    return jnp.einsum("rst,rth->rsh", w, x) / jnp.maximum(jnp.sum(w, -1, keepdims=True), 1e-9)
  if mode == "lasttoken":
    last = cls_positions + jnp.maximum(count[..., 0].astype(jnp.int32), 1) - 1              # [R, S]
    return jnp.take_along_axis(x, last[..., None], axis=1)                                 # [R, S, H]
  raise ValueError(f"Unknown pooling {mode!r}; use one or more of {', '.join(MODES)}.")
