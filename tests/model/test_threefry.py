"""The fused Threefry bits: a known answer, equality with jax.random.bits, fallbacks, sharding."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from jbert.model import threefry


def test_known_answer():
  # Random123's Threefry-2x32 (20 rounds) vector for key (0, 0) and counter (0, 0): words 0x6b200159 and
  # 0x99ba4efe, which jax XORs into one 32-bit draw.
  bits = threefry.random_bits(jnp.zeros(2, jnp.uint32), (1,))
  np.testing.assert_array_equal(bits, np.uint32([0x6B200159 ^ 0x99BA4EFE]))


@pytest.mark.parametrize("shape", [(), (1,), (7,), (3, 5), (2, 3, 4, 5)])
@pytest.mark.parametrize("typed", [True, False])
def test_equals_jax_random_bits(shape, typed):
  key = jax.random.key(42) if typed else jax.random.PRNGKey(42)
  expected = jax.random.bits(key, shape, jnp.uint32)
  np.testing.assert_array_equal(jax.jit(threefry.random_bits, static_argnums=1)(key, shape), expected)


def test_is_elementwise_without_loops():
  jaxpr = str(jax.make_jaxpr(lambda k: threefry.random_bits(k, (8, 12, 128, 64)))(jax.random.key(0)))
  for primitive in ("while", "threefry2x32", "random_bits"):
    assert primitive not in jaxpr


def test_other_implementations_and_huge_shapes_fall_back():
  rbg = jax.random.key(3, impl="rbg")
  np.testing.assert_array_equal(threefry.random_bits(rbg, (4, 5)), jax.random.bits(rbg, (4, 5), jnp.uint32))
  # 2**32 elements would overflow the uint32 flat index: jax's 64-bit counters take over (traced only).
  jaxpr = str(jax.make_jaxpr(lambda k: threefry.random_bits(k, (2**16, 2**16)))(jax.random.key(0)))
  assert "random_bits" in jaxpr


@pytest.mark.devices(8)
def test_bits_do_not_depend_on_sharding():
  mesh = jax.make_mesh((4, 2), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
  shape = (8, 6, 10)
  key = jax.random.key(7)
  sharded = jax.jit(lambda k: threefry.random_bits(k, shape),
                    out_shardings=NamedSharding(mesh, P("a", None, "b")))(key)
  assert len(sharded.sharding.device_set) == 8
  np.testing.assert_array_equal(sharded, jax.random.bits(key, shape, jnp.uint32))
