"""Is a saved checkpoint step intact, and if not, what exactly is damaged?

Orbax verifies neither array contents nor the presence of every file: a truncated array file fails deep inside
TensorStore with a message that names a key but not the file, and bytes garbled in the middle of a compressed
chunk decode to wrong numbers without any error. So each save records a fingerprint of every array (computed on
the devices, before the write) and a restore recomputes it on what it read back; a mismatch names the array.
`describe` turns whatever a failed restore raised into one line naming the file or array.
"""
from __future__ import annotations

import json
import re
from typing import Any

import jax
import jax.numpy as jnp
from etils import epath
from jax import lax

# Files without which Orbax cannot read an item, relative to the step directory.
REQUIRED = ("state/_METADATA", "state/manifest.ocdbt")


def leaf_name(path) -> str:
  """"opt_state/0/mu/bert/...": Orbax metadata stores namedtuples as dicts and tuples as lists, so paths are
  compared by their plain names."""
  def name(key):
    for attr in ("key", "idx", "name"):
      if hasattr(key, attr):
        return str(getattr(key, attr))
    return str(key)
  return "/".join(name(k) for k in path)


# ----------------------------------------------------------------------------------------------------------
# Fingerprints: one uint32 per array.
# ----------------------------------------------------------------------------------------------------------


def _fingerprint(x: jax.Array) -> jax.Array:
  """sum_i bits_i * (2i + 1) mod 2^32 over the flat index i. An odd weight is invertible mod 2^32, so any change
  of a single element changes the sum; integer sums are exact in any order, so every mesh (and every reduction
  order) gives the same value. The index comes from iotas rather than a reshape, which would gather a sharded
  array."""
  if x.dtype == jnp.bool_ or x.dtype.itemsize == 1:
    bits = x.astype(jnp.uint32)
  elif x.dtype.itemsize == 2:
    bits = lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
  else:  # 4 bytes as they are; 8 bytes become a trailing axis of two words.
    bits = lax.bitcast_convert_type(x, jnp.uint32)
  index, stride = jnp.zeros(bits.shape, jnp.uint32), 1
  for axis in reversed(range(bits.ndim)):
    index = index + lax.broadcasted_iota(jnp.uint32, bits.shape, axis) * jnp.uint32(stride % 2**32)
    stride *= bits.shape[axis]
  return jnp.sum(bits * (2 * index + 1), dtype=jnp.uint32)


_fingerprints = jax.jit(lambda tree: jax.tree.map(_fingerprint, tree))


def fingerprints(tree: Any) -> dict[str, int]:
  """{array name: fingerprint} of a pytree of (possibly sharded) arrays; a collective on multi-process runs."""
  values = jax.device_get(_fingerprints(tree))
  return {leaf_name(p): int(v) for p, v in jax.tree_util.tree_flatten_with_path(values)[0]}


def mismatched(saved: dict[str, int], tree: Any) -> list[str]:
  """Names of the arrays of `tree` whose fingerprint differs from the one saved with them."""
  now = fingerprints(tree)
  return [k for k, v in now.items() if k in saved and saved[k] != v]


# ----------------------------------------------------------------------------------------------------------
# Naming the damage.
# ----------------------------------------------------------------------------------------------------------


def missing_files(step_dir: epath.Path) -> list[str]:
  """Required files absent from a step directory (cheap: a few existence checks, also on GCS)."""
  missing = [f for f in REQUIRED if not (step_dir / f).exists()]
  state = step_dir / "state"
  if state.exists():
    missing += [f"state/{p.name}/manifest.ocdbt" for p in state.iterdir()
                if p.name.startswith("ocdbt.process_") and not (p / "manifest.ocdbt").exists()]
  return missing


def describe(error: BaseException, step_dir: epath.Path, item: str = "state") -> str:
  """One line for a failed read of the arrays in `step_dir/item`: the file (or array) and what is wrong."""
  if isinstance(error, json.JSONDecodeError):
    return f"a file holds invalid JSON ({error.msg} at line {error.lineno} column {error.colno})"
  text = root_message(error, limit=100_000)
  # TensorStore: 'Error reading "KEY" in OCDBT database at local file "DIR": REASON'. The key names the array
  # but not the data file; for a truncated file, the size in REASON finds it.
  read = re.search(r'Error reading "([^"]+)" in OCDBT database at [^"]*"[^"]*": (.*)', text)
  if not read:
    return _shorten(text)
  array, reason = read.group(1).split("/")[0].replace(".", "/"), read.group(2)
  size = re.search(r"value of size (\d+)", reason)
  if size is None:
    return f"array {array} cannot be read from {item}/, a data file there is corrupt ({_shorten(reason, 200)})"
  n = int(size.group(1))
  try:
    files = [p for p in _files(step_dir / item) if p.stat().length == n]
  except (OSError, AttributeError):
    files = []
  where = f"{files[0].relative_to(step_dir)}" if len(files) == 1 else f"a data file under {item}/"
  return f"{where} is truncated ({n} bytes left): array {array} cannot be read"


def _files(directory: epath.Path) -> list[epath.Path]:
  out = []
  for p in directory.iterdir():
    out += _files(p) if p.is_dir() else [p]
  return out


def root_message(error: BaseException, limit: int = 400) -> str:
  """The innermost exception's message, without TensorStore's JSON spec, cut to `limit` characters."""
  while error.__cause__ is not None or (error.__context__ is not None and not error.__suppress_context__):
    error = error.__cause__ or error.__context__
  text = str(error).split(" [tensorstore_spec=")[0].split("\n")[0].strip()
  return _shorten(text or type(error).__name__, limit)


def _shorten(text: str, limit: int = 400) -> str:
  # The cause (an errno text) ends TensorStore's messages: keep both ends.
  return text if len(text) <= limit else f"{text[:limit // 2]} ... {text[-limit // 2:]}"
