"""The shapes bench/device_check.py times, which its three processes' modules all follow: device_check (the
command), device_parts (jbert's side) and device_torch (PyTorch's, in a process of its own). They live here so
that each of those imports this one and none imports another (device_check runs device_parts)."""
from __future__ import annotations

import numpy as np


def batch_for_memory(seq: int, memory_bytes: float) -> int:
  """The largest power of two of BERT-base rows whose step fits ~70% of the device: per row ~0.11 GiB at
  sequence 128 (XLA's TPU compile of the same step: 6.8 GiB of temporaries for 64 rows), scaled with the length."""
  per_row = 0.11 * 2**30 * seq / 128
  rows = max(1, int(0.7 * memory_bytes / per_row))
  return 1 << (rows.bit_length() - 1)


def sequence_lengths(rng, count: int, seq: int):
  """Lengths of `count` sequences, uniform over [seq / 8, seq]: about 44% of padded rows is padding."""
  return rng.integers(max(seq // 8, 4), seq + 1, count)


def row_lengths(seq: int, count: int):
  """The lengths both frameworks' batches of `seq` tokens take (the first `batch` of them for padded rows)."""
  return sequence_lengths(np.random.default_rng(seq), count, seq)


def pack(lengths, seq: int) -> list[list[int]]:
  """First-fit rows of sequence indices whose lengths sum to at most `seq`."""
  rows, room = [], []
  for i, n in enumerate(lengths):
    j = next((j for j, r in enumerate(room) if r >= n), None)
    if j is None:
      rows.append([i])
      room.append(seq - n)
    else:
      rows[j].append(i)
      room[j] -= n
  return rows
