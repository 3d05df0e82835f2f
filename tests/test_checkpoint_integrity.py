"""Array fingerprints: a numpy reference, every single-element change detected, the same on every mesh."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jbert.checkpoint import integrity
from jbert.runtime import sharding


def _reference(x: np.ndarray) -> int:
  """sum_i bits_i * (2i + 1) mod 2^32 over the C-order flat index, in Python integers."""
  x = np.asarray(x)
  if x.dtype.itemsize == 2:
    bits = x.view(np.uint16).astype(np.uint64)
  elif x.dtype.itemsize == 4:
    bits = x.view(np.uint32).astype(np.uint64)
  else:
    bits = x.astype(np.uint64)
  weights = 2 * np.arange(bits.size, dtype=np.uint64) + 1
  return int(sum(int(b) * int(w) for b, w in zip(bits.ravel(), weights)) % 2**32)


@pytest.mark.parametrize("dtype", [np.float32, np.int32, jnp.bfloat16, np.bool_])
def test_fingerprints_match_a_numpy_reference(dtype):
  rng = np.random.default_rng(0)
  x = (rng.normal(size=(3, 5, 7)) * 100).astype(dtype)
  assert integrity.fingerprints({"x": x})["x"] == _reference(x)


def test_every_single_element_change_is_detected_and_names_the_array():
  x = np.random.default_rng(1).normal(size=(4, 6)).astype(np.float32)
  tree = {"params": {"a": x, "b": np.arange(5, dtype=np.int32)}}
  saved = integrity.fingerprints(tree)
  for i in range(x.size):
    changed = x.copy()
    changed.flat[i] = np.nextafter(changed.flat[i], np.float32(np.inf))  # the smallest possible change
    assert integrity.mismatched(saved, {"params": {"a": changed, "b": tree["params"]["b"]}}) == ["params/a"]
  assert integrity.mismatched(saved, tree) == []


@pytest.mark.devices(8)
def test_a_sharded_array_has_the_fingerprint_of_its_host_copy():
  mesh = sharding.make_mesh(2, 2, 2)
  x = np.random.default_rng(2).normal(size=(8, 12)).astype(np.float32)
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp"), "tensor"))
  sharded = jax.device_put(x, spec)
  assert integrity.fingerprints({"x": sharded}) == integrity.fingerprints({"x": x}) == {"x": _reference(x)}
