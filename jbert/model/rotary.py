"""Rotary position embeddings (RoPE, Su et al. 2021) as ModernBERT computes them in transformers.

Each pair of query/key features (i, i + D/2) is rotated by the angle position * theta^(-2i/D), so the logit of a
query and a key depends on their distance only. The angles are computed in float32 from the positions each layer
is given: with packed rows those restart at every sequence (`encoder.segment_positions`), so a sequence's
queries and keys see the positions it has alone.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def inverse_frequencies(head_dim: int, theta: float) -> Array:
  """float32 [D/2]: theta^(-2i/D), transformers' `compute_default_rope_parameters`."""
  exponents = jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim  # [D/2]
  return 1.0 / (jnp.float32(theta) ** exponents)


def rotate(x: Array, positions: Array, theta: float) -> Array:
  """x [B, T, N, D] rotated by its tokens' positions [B | 1, T] (int); computed in float32, returned in x's dtype.

  transformers' layout: the first and the second half of the features form the pairs (`rotate_half`), the
  angles repeat over both halves.
  """
  d = x.shape[-1]
  angles = positions[..., None].astype(jnp.float32) * inverse_frequencies(d, theta)  # [B | 1, T, D/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B | 1, T, 1, D]: shared by the heads
  wide = x.astype(jnp.float32)  # [B, T, N, D]
  half = jnp.concatenate([-wide[..., d // 2:], wide[..., :d // 2]], axis=-1)  # [B, T, N, D]
  return (wide * jnp.cos(angles) + half * jnp.sin(angles)).astype(x.dtype)
