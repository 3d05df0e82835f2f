"""The predict path: every row of an evaluation set through the jitted predict step, gathered in order.

Every process holds the whole (featurised) evaluation set, so each global batch is built on the host and each
process hands over just the slices its devices hold (`jax.make_array_from_callback`); outputs come back to every
host across processes (`process_allgather`) in row order. The last batch is filled with copies of a real row and
those rows are dropped again, so every example is scored exactly once whatever the batch size.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jbert.tasks import feeding


def to_device(batch: Mapping[str, np.ndarray], sharding: jax.sharding.Sharding) -> dict[str, jax.Array]:
  """A global batch that every process holds whole, as arrays laid out by `sharding`."""
  return {k: jax.make_array_from_callback(v.shape, sharding, lambda index, v=v: v[index])
          for k, v in batch.items()}


def to_host(tree: Any) -> Any:
  """Global arrays as numpy on every process."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return multihost_utils.process_allgather(tree, tiled=True)


def predict(predict_fn: Callable[..., Any], params, features: Mapping[str, np.ndarray], keys: Sequence[str], *,
            global_batch_size: int, sharding: jax.sharding.Sharding) -> dict[str, np.ndarray]:
  """`predict_fn(params, batch)`'s per-row outputs for every row of `features`, in row order."""
  parts = []
  for batch, valid in feeding.eval_batches(features, keys, global_batch_size=global_batch_size):
    out = to_host(predict_fn(params, to_device(batch, sharding)))
    parts.append({k: np.asarray(v)[valid] for k, v in out.items()})
  if not parts:
    return {}
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
