"""Sliding-window attention in O(T w): the `xla` kernel of a local layer (ModernBERT's) where the window is short
beside the sequence.

The sequence is cut into blocks of w tokens (w: the window's half width), and each query block attends to the keys
of its own block and its two neighbours, the only ones its windows reach: logits [B, N, T/w, w, 3w] instead of
[B, N, T, T], so 8,192 tokens with ModernBERT's window of 64 each side compute 192 logits a query, not 8,192. The
keys each query may attend to are those of `attention.allowed_keys` (its own segment, or the real keys, within
the window), so the function is the same; a query with no such key at all (padding far from every real token,
without segments) averages the values of its three blocks instead of the whole row, an output nothing reads.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Array = jax.Array


def exp_weights(logits: Array) -> tuple[Array, Array]:
  """A softmax's numerators and their sum over the last axis, for attention that divides its output by the sum
  after the second matmul (`attention.xla_attention`). The max shift only keeps exp in range; it cancels in the
  division, so no gradient flows through it."""
  weights = jnp.exp(logits - jax.lax.stop_gradient(logits.max(axis=-1, keepdims=True)))  # [..., S]
  return weights, weights.sum(axis=-1, keepdims=True)  # [..., S], [..., 1]


def worthwhile(length: int, window: int) -> bool:
  """Whether blocks beat the full T x T logits: a query's three blocks are fewer keys than the row."""
  return 3 * window < length


def blocked_attention(q: Array, k: Array, v: Array, mask: Array, segments: Array | None, window: int) -> Array:
  """softmax(q k^T / sqrt(D)) v over the keys within `window` tokens of each query (and of its segment, or real):
  q, k, v [B, T, N, D]; mask bool [B, T]; segments int [B, T] (0 = padding) or None. Returns [B, T, N, D]."""
  b, t, n, d = q.shape
  c = window  # block length: a block's windows reach no further than its neighbours
  blocks = -(-t // c)
  total = blocks * c

  def pad(x, value, before=0, after=0):  # [B, T, ...] -> [B, before + total + after, ...]
    return jnp.pad(x, [(0, 0), (before, total - t + after)] + [(0, 0)] * (x.ndim - 2), constant_values=value)

  def neighbours(x, value):  # [B, T, ...] -> [B, blocks, 3c, ...]: block i-1, i, i+1 side by side
    x = pad(x, value, c, c).reshape(b, blocks + 2, c, *x.shape[2:])
    return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)

  scale = 1 / math.sqrt(d)
  # As einsum_attention: q scaled where that is exact (a power of two) or in float32, else the logits.
  scale_q = math.log2(scale).is_integer() or jnp.dtype(q.dtype) == jnp.float32
  queries = pad(q * jnp.asarray(scale, q.dtype) if scale_q else q, 0).reshape(b, blocks, c, n, d)
  keys, values = neighbours(k, 0), neighbours(v, 0)  # [B, blocks, 3c, N, D]
  # Query a of block i sits at i*c + a, key s of its neighbours at (i-1)*c + s: their distance is c + a - s.
  offsets = c + jnp.arange(c)[:, None] - jnp.arange(3 * c)[None, :]  # [c, 3c]
  near = jnp.abs(offsets) <= window
  if segments is None:
    allowed = neighbours(mask.astype(jnp.int32), 0)[:, :, None, :] > 0  # [B, blocks, 1, 3c]: real keys
  else:
    ids = segments.astype(jnp.int32)
    key_ids = neighbours(ids, -1)  # [B, blocks, 3c]: -1 outside the row
    query_ids = pad(ids, -2).reshape(b, blocks, c)  # [B, blocks, c]
    allowed = query_ids[..., :, None] == key_ids[..., None, :]  # [B, blocks, c, 3c]
  allowed = allowed & near  # [B, blocks, c, 3c]
  logits = jnp.einsum("bicnd,bisnd->bnics", queries, keys, preferred_element_type=jnp.float32)  # [B, N, blocks, c, 3c]
  if not scale_q:
    logits = logits * jnp.float32(scale)
  logits = jnp.where(allowed[:, None], logits, jnp.finfo(jnp.float32).min)
  # Normalised after the second matmul, as `attention.xla_attention`: exp's shift cancels.
  weights, weight_sums = exp_weights(logits)  # [B, N, blocks, c, 3c], [B, N, blocks, c, 1]
  context = jnp.einsum("bnics,bisnd->bnicd", weights.astype(v.dtype), values,
                       preferred_element_type=jnp.float32) / weight_sums
  context = context.astype(v.dtype).transpose(0, 2, 3, 1, 4)  # [B, N, blocks, c, D] -> [B, blocks, c, N, D]
  return context.reshape(b, total, n, d)[:, :t]
