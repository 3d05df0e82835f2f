"""Batches of in-memory features: the fine-tuning training stream and evaluation batches in example order.

Training: epoch `e` visits the N examples in the order `permutation(N)` seeded by (seed, e); the epochs are
concatenated into one endless sequence and global batch `k` is its rows `[k·B, (k+1)·B)`, so a batch may span
two epochs and no example is dropped or repeated within an epoch. Data shard `s` of `S` takes rows
`[s·B/S, (s+1)·B/S)` of every global batch. The global batches therefore depend only on the seed, never on the
number of processes, and a shard's state is the number of batches it has produced.

Evaluation: global batch `k` holds feature rows `[k·B, (k+1)·B)`; the last one is filled up with copies of its
last real row (an all-padding row could make attention produce NaN, which a mask cannot multiply away) and a
host-side `valid` mask marks the real rows (`jbert.train.evaluation` drops them after the predict step).
"""
from __future__ import annotations

import math
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from jbert.tasks.base import Stream


class FeatureStream(Stream):
  """Seeded epochs over `features`, cut into global batches; this process's rows of each one."""

  def __init__(self, features: Mapping[str, np.ndarray], keys: Sequence[str], *, global_batch_size: int,
               seed: int, num_shards: int, shards: Sequence[int]):
    self.features = {k: np.asarray(features[k]) for k in keys}
    self.num_rows = len(next(iter(self.features.values())))
    if not self.num_rows:
      raise ValueError("the training set has no examples.")
    self.global_batch_size, self.seed = global_batch_size, seed
    self.rows_per_shard = global_batch_size // num_shards
    self.shards = tuple(shards)
    self.batches = 0  # Global batches produced so far: the whole state.
    self._epoch = (-1, None)

  def _order(self, epoch: int) -> np.ndarray:
    if self._epoch[0] != epoch:
      self._epoch = (epoch, np.random.default_rng([self.seed, epoch]).permutation(self.num_rows))
    return self._epoch[1]

  def _positions(self, start: int, stop: int) -> np.ndarray:
    """Example indices at positions [start, stop) of the endless epoch sequence."""
    out = []
    while start < stop:
      epoch, offset = divmod(start, self.num_rows)
      take = min(stop - start, self.num_rows - offset)
      out.append(self._order(epoch)[offset:offset + take])
      start += take
    return np.concatenate(out)

  def __next__(self) -> dict[str, np.ndarray]:
    base = self.batches * self.global_batch_size
    rows = np.concatenate([self._positions(base + s * self.rows_per_shard, base + (s + 1) * self.rows_per_shard)
                           for s in self.shards])
    self.batches += 1
    return {k: v[rows] for k, v in self.features.items()}

  def get_states(self) -> dict[int, Any]:
    return {s: {"batches": self.batches} for s in self.shards}

  def set_states(self, states: Mapping[int, Any]) -> None:
    counts = {int(states[s]["batches"]) for s in self.shards}
    if len(counts) != 1:
      raise ValueError(f"data shards {list(self.shards)} were saved at different positions {sorted(counts)}.")
    self.batches = counts.pop()


def total_steps_for(num_examples: int, global_batch_size: int, num_epochs: float) -> int:
  """Optimiser steps for `num_epochs` passes (the last batch of the run may cross into another epoch)."""
  return max(1, math.ceil(num_examples * num_epochs / global_batch_size))


def eval_batches(features: Mapping[str, np.ndarray], keys: Sequence[str], *,
                 global_batch_size: int) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
  """(global batch k of `keys`, its valid-row mask) for every k; the last batch is filled with copies of its last
  real row."""
  n = len(next(iter(features.values())))
  for start in range(0, n, global_batch_size):
    rows = np.arange(start, start + global_batch_size)
    valid = rows < n
    rows = np.where(valid, rows, min(n, start + global_batch_size) - 1)
    yield {k: np.asarray(features[k])[rows] for k in keys}, valid
