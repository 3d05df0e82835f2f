"""Threefry-2x32 random bits written out as elementwise ops, for dropout masks.

`jax.random.bits` lowers Threefry on CPU as a 5-trip while loop (to keep compile times down), and each trip
writes its two uint32 state arrays to memory: ~1.5 ms per layer of a BERT-base train step on a 2-core
host. Written out, the 20 rounds are integer ops on an iota that XLA fuses into the consumer (the
dropout's select), so no random word is ever stored.

For a threefry key and the default `jax_threefry_partitionable`, the bits equal `jax.random.bits(key, shape,
jnp.uint32)`. Counters are the flat element index, so the bits of an element do not depend on how the array
is sharded.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

# Skein's key-schedule parity constant and the Threefry-2x32 rotations (Salmon et al., SC'11).
_PARITY = np.uint32(0x1BD11BDA)
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def random_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """uint32 bits of `shape`; a key of another PRNG implementation falls back to `jax.random.bits`."""
  if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
    if str(jax.random.key_impl(key)) != "threefry2x32":
      return jax.random.bits(key, shape, jnp.uint32)
    key = jax.random.key_data(key)
  if math.prod(shape) >= 2**32:  # The flat index would not fit one uint32 counter word.
    return jax.random.bits(jax.random.wrap_key_data(key, impl="threefry2x32"), shape, jnp.uint32)
  return _threefry2x32(key[0], key[1], _flat_index(shape))


def _flat_index(shape: tuple[int, ...]) -> jax.Array:
  # Built from per-axis iotas (not iota + reshape) so that the SPMD partitioner slices it like any
  # elementwise operand.
  index = jnp.zeros(shape, jnp.uint32)
  for axis, size in enumerate(shape):
    index = index * np.uint32(size) + jax.lax.broadcasted_iota(jnp.uint32, shape, axis)
  return index


def _rotate_left(x: jax.Array, r: int) -> jax.Array:
  return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _threefry2x32(k0: jax.Array, k1: jax.Array, counter: jax.Array) -> jax.Array:
  """Threefry-2x32 (20 rounds) of the 64-bit counters (0, counter); the two output words XOR-ed, as jax."""
  ks = (k0, k1, k0 ^ k1 ^ _PARITY)
  x0, x1 = jnp.broadcast_to(ks[0], counter.shape), counter + ks[1]
  for i in range(5):
    for r in _ROTATIONS[i % 2]:
      x0 = x0 + x1
      x1 = _rotate_left(x1, r) ^ x0
    # Key injection after every four rounds.
    x0 = x0 + ks[(i + 1) % 3]
    x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
  return x0 ^ x1
