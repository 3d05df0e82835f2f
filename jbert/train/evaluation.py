"""The predict path: every row of an evaluation set through the jitted predict step, gathered in order.

Every process holds the whole (featurised) evaluation set, so each global batch is built on the host and each
process hands over just the slices its devices hold (`jax.make_array_from_callback`); outputs come back to every
host across processes (`process_allgather`) in row order. The last batch is filled with copies of a real row and
those rows are dropped again, so every example is scored exactly once whatever the batch size.

With `buckets` (length-bucketed fine-tuning, `jbert.data.streams`) the rows are sorted by length and cut into
global batches, each cut to the bucket of its longest row (the inference Runner's `plan_batches`); outputs go back
to example order, and `token_outputs` (sequence as axis 1) are padded back to the full length with zeros.

With `slots` (packed fine-tuning, `jbert.data.packing`) the whole split is packed once, best-fit, into rows of the
features' length holding at most `slots` sequences, cut into global batches of `global_batch_size` rows (the last
filled with empty rows: with segment ids padding attends to padding only); per-slot outputs [R, S, ...] and
`token_outputs` [R, T, ...] go back to one row per example, in example order, as the unpacked path gives them.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jbert.inference import runner
from jbert.data import packing
from jbert.data import streams
from jbert.tasks.base import MODEL_INPUTS


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
            global_batch_size: int, sharding: jax.sharding.Sharding, buckets: Sequence[int] | None = None,
            token_outputs: Sequence[str] = (), slots: int | None = None, pad_id: int = 0) -> dict[str, np.ndarray]:
  """`predict_fn(params, batch)`'s per-row outputs for every row of `features`, in row order."""
  if slots is not None:
    return _predict_packed(predict_fn, params, features, keys, global_batch_size=global_batch_size,
                           sharding=sharding, slots=slots, token_outputs=token_outputs, pad_id=pad_id)
  if buckets is not None:
    return _predict_bucketed(predict_fn, params, features, keys, global_batch_size=global_batch_size,
                             sharding=sharding, buckets=buckets, token_outputs=token_outputs)
  parts = []
  for batch, valid in streams.eval_batches(features, keys, global_batch_size=global_batch_size):
    out = to_host(predict_fn(params, to_device(batch, sharding)))
    parts.append({k: np.asarray(v)[valid] for k, v in out.items()})
  if not parts:
    return {}
  return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _plan(features, global_batch_size, buckets) -> list[runner.PlannedBatch]:
  # num_devices=global_batch_size: every batch, the last one too, has the global batch size (one shape per
  # bucket); its missing rows repeat its longest row.
  return runner.plan_batches(streams.row_lengths(features), global_batch_size, buckets,
                             num_devices=global_batch_size)


def bucketed_shapes(features: Mapping[str, np.ndarray], keys: Sequence[str], *, global_batch_size: int,
                    buckets: Sequence[int]) -> list[dict[str, jax.ShapeDtypeStruct]]:
  """The shapes of the batches `predict(..., buckets=buckets)` feeds the predict step for `features`, one per
  bucket length it meets, shortest first: what can compile before the evaluation (`jbert.runtime.ahead`)."""
  if not len(features) or not len(features["input_ids"]):
    return []
  lengths = sorted({plan.length for plan in _plan(features, global_batch_size, buckets)})
  first = {k: np.asarray(features[k])[:1] for k in keys}
  return [{k: jax.ShapeDtypeStruct((global_batch_size, *v.shape[1:]), v.dtype)
           for k, v in streams.cut(first, length, MODEL_INPUTS).items()} for length in lengths]


def _predict_bucketed(predict_fn, params, features, keys, *, global_batch_size, sharding, buckets, token_outputs):
  n = len(features["input_ids"]) if len(features) else 0
  if not n:
    return {}
  full = features["input_ids"].shape[-1]
  planned = _plan(features, global_batch_size, buckets)
  results: dict[str, np.ndarray] = {}
  for plan in planned:
    rows = np.concatenate([plan.rows, np.full(plan.size - len(plan.rows), plan.rows[0])])
    batch = streams.cut({k: np.asarray(features[k])[rows] for k in keys}, plan.length, MODEL_INPUTS)
    out = to_host(predict_fn(params, to_device(batch, sharding)))
    for name, value in out.items():
      value = np.asarray(value)[:len(plan.rows)]
      if name in token_outputs:
        value = np.pad(value, [(0, 0), (0, full - value.shape[1])] + [(0, 0)] * (value.ndim - 2))
      if name not in results:
        results[name] = np.zeros((n, *value.shape[1:]), value.dtype)
      results[name][plan.rows] = value
  return results


def packed_shapes(features: Mapping[str, np.ndarray], *, global_batch_size: int,
                  slots: int) -> list[dict[str, jax.ShapeDtypeStruct]]:
  """The one batch shape `predict(..., slots=slots)` feeds the predict step (none for an empty split)."""
  if not len(features) or not len(features["input_ids"]):
    return []
  shape = np.asarray(features["input_ids"]).shape[1:]  # (T,), or (C, T): rows of C·T, C endings an example
  sequences = slots * (shape[0] if len(shape) == 2 else 1)
  shapes = {k: (global_batch_size, int(np.prod(shape))) for k in (*MODEL_INPUTS, "segment_ids", "position_ids")}
  shapes.update({k: (global_batch_size, sequences) for k in packing.EXAMPLE_SLOT_KEYS})
  return [{k: jax.ShapeDtypeStruct(s, np.int32) for k, s in shapes.items()}]


def _predict_packed(predict_fn, params, features, keys, *, global_batch_size, sharding, slots, token_outputs,
                    pad_id):
  n = len(features["input_ids"]) if len(features) else 0
  if not n:
    return {}
  del keys  # the model inputs are what a packed row holds; labels stay on the host
  inputs = {k: np.asarray(features[k]) for k in MODEL_INPUTS}
  shape = inputs["input_ids"].shape[1:]
  t = int(np.prod(shape))
  lengths = packing.example_lengths(inputs["attention_mask"])  # [N], or [N, C]
  if len(shape) == 2:  # multiple choice: an example's endings side by side, one score per ending
    examples, placement = packing.place_choices(lengths, max_tokens=t, max_examples=slots)
    rows = -(-placement.rows // global_batch_size) * global_batch_size
    packed = packing.pack_choices(inputs, examples, placement, rows=rows, max_examples=slots, pad_id=pad_id)
  else:
    placement = packing.place(lengths, max_tokens=t, max_sequences=slots)
    rows = -(-placement.rows // global_batch_size) * global_batch_size
    packed = packing.pack_examples(inputs, placement, rows=rows, slots=slots, token_keys={}, pad_id=pad_id)
  parts = []
  for start in range(0, rows, global_batch_size):
    batch = {k: v[start:start + global_batch_size] for k, v in packed.items()}
    parts.append({k: np.asarray(v) for k, v in to_host(predict_fn(params, to_device(batch, sharding))).items()})
  out = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
  out = packing.unpack_outputs(out, placement, token_outputs=tuple(token_outputs), length=t)
  return {k: v.reshape(n, *shape[:-1], *v.shape[1:]) for k, v in out.items()}  # [N·C, ...] -> [N, C, ...]
