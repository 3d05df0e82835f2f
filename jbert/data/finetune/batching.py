"""Fixed-shape evaluation batches that cover every example exactly once, across processes.

Every process gets a contiguous share of the examples and the same number of batches, so that collective ops
in a multi-host evaluation step never wait on a process that ran out of data. Rows that only fill the last
batches carry `mask == 0`; they are copies of a real row rather than zeros, because an all-zero attention mask
can make attention produce NaN, and NaN * 0 is still NaN in a masked sum.
"""
from collections.abc import Iterator
import math

import numpy as np

MASK_KEY = "mask"


def num_eval_batches(num_examples: int, batch_size: int, process_count: int = 1) -> int:
  """Batches each process yields for `num_examples` split over `process_count` processes."""
  share = math.ceil(num_examples / process_count)
  return math.ceil(share / batch_size)


def eval_batches(features: dict[str, np.ndarray], batch_size: int, process_index: int = 0,
                 process_count: int = 1) -> Iterator[dict[str, np.ndarray]]:
  """Yields this process's batches of `batch_size` rows (a per-process batch size).

  Args:
    features: arrays that share their leading dimension N (object arrays pass through untouched).
    batch_size: rows per yielded batch.
    process_index: this process, in [0, process_count).
    process_count: number of processes that evaluate together.

  Yields:
    Dicts with the keys of `features` plus `mask` (int32 [batch_size], 1 on real rows). Over all processes
    the real rows are every feature row exactly once.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} is outside [0, {process_count}); pass "
                     "jax.process_index() and jax.process_count().")
  if MASK_KEY in features:
    raise ValueError(f"features already hold a {MASK_KEY!r} array; rename it, eval_batches adds its own.")
  sizes = {k: len(v) for k, v in features.items()}
  if len(set(sizes.values())) > 1:
    raise ValueError(f"features must share their leading dimension, got {sizes}.")
  n = next(iter(sizes.values()), 0)
  share = math.ceil(n / process_count)
  begin, end = min(process_index * share, n), min((process_index + 1) * share, n)
  for start in range(begin, begin + num_eval_batches(n, batch_size, process_count) * batch_size, batch_size):
    rows = np.arange(start, start + batch_size)
    real = rows < end
    # Padding repeats the last real row of this batch (or of all data when this process's share is empty).
    filler = rows[real][-1] if real.any() else n - 1
    rows = np.where(real, rows, filler)
    batch = {k: np.asarray(v)[rows] for k, v in features.items()}
    batch[MASK_KEY] = real.astype(np.int32)
    yield batch
