"""Training streams: each process's rows of every global batch, checkpointable per data shard.

  DataShards      where each process's rows come from: `num_shards` shards, a contiguous block per process
  Stream          the interface the trainer reads (`next`, per-shard JSON states, the bucket lengths ahead)
  FeatureStream   seeded epochs over in-memory features (fine-tuning)
  BucketedStream  the same epochs grouped by length, each global batch cut to a bucket length
  PackedStream    the same global batches, each shard's examples laid end to end in rows (padding-free)
  PretrainBatches one grain iterator per data shard (pretraining)
  eval_batches    evaluation batches in row order, the last one filled with copies of a real row

Epochs (`FeatureStream`): epoch `e` visits the N examples in the order `permutation(N)` seeded by (seed, e); the
epochs are concatenated into one endless sequence and global batch `k` is its rows `[k·B, (k+1)·B)`, so a batch
may span two epochs and no example is dropped or repeated within an epoch. Data shard `s` of `S` takes rows
`[s·B/S, (s+1)·B/S)` of every global batch. The global batches therefore depend only on the seed, never on the
number of processes, and a shard's state is the number of batches it has produced.

Length buckets (`BucketedStream`, as transformers' `group_by_length`): fine-tuning rows are padded to
`max_seq_length`, yet most are far shorter (SST-2's training sentences average 13 tokens, p90 27: at 128, ~90% of
the compute is padding). The endless epoch sequence is cut into chunks of `mega_batch` global batches; each
chunk's rows are sorted by length (longest first, ties in permutation order), cut into global batches, and the
batches of the chunk are shuffled (seeded by the chunk). A chunk holds at most one epoch's worth of rows, so every
epoch still visits each example once; only the chunk that spans an epoch boundary mixes the two epochs' rows. Each
global batch is cut to the smallest bucket (`buckets(max_seq_length)`) that holds its longest row, decided from
the whole global batch by every process alike, so the jitted steps see one shape per bucket, all known up front
(`tpu/aot_compile.py` compiles them ahead). The cut changes nothing a row computes: attention never reads masked
keys (their weights are exactly 0) and positions are absolute.

Packed batches (`PackedStream`, fine-tuning's `data.packing`): global batch `k` holds exactly `FeatureStream`'s
examples (the recipe's batch size keeps its meaning), but each data shard lays its share end to end in rows of
T = `max_seq_length` tokens (`jbert.data.packing`: best-fit decreasing, at most `max_sequences` a row, nothing cut),
each sequence attending to itself only. Per-example labels sit in slots [R, S] beside each row's [CLS] positions and
slot weights (0: an empty slot), per-token labels in the row, so every row is self-contained and rows shard over
devices like any batch. Every shard of a batch takes the same row count R, chosen up front from the run's batches
(`plan(total_steps)`, every shard's, so all processes agree): `usual` for almost all of them and `most` (what the
fullest batch needs) for the few that need more, the pair that minimises the run's rows; a run therefore meets one
or two shapes, all known before the first step, and pads only the last row of each shard and the spare rows.
The state stays the number of batches produced, so a resume and any process count give the same global batches.

Evaluation: global batch `k` holds feature rows `[k·B, (k+1)·B)`; the last one is filled up with copies of its
last real row (an all-padding row could make attention produce NaN, which a mask cannot multiply away) and a
host-side `valid` mask marks the real rows (`jbert.train.evaluation` drops them after the predict step).
"""
from __future__ import annotations

import abc
import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np

from jbert.data import packing

# Global batches sorted together (transformers' group_by_length: 50).
MEGA_BATCH = 50
_SMALLEST = 8


@dataclasses.dataclass(frozen=True)
class DataShards:
  """Where each process's rows come from: `num_shards` data shards, a contiguous block per process."""
  num_shards: int
  shards: tuple[int, ...]
  rows_per_shard: int
  row_multiple: int = 1  # packed rows of a shard come in multiples of it (devices × micro-batches)


class Stream(abc.ABC):
  """This process's share of the training batches; checkpointable by JSON-serialisable per-shard states."""

  @abc.abstractmethod
  def __next__(self) -> dict[str, np.ndarray]:
    """The process-local rows of the next global batch."""

  def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
    return self

  @abc.abstractmethod
  def get_states(self) -> dict[int, Any]:
    """{data shard: state} of the shards this process owns."""

  @abc.abstractmethod
  def set_states(self, states: Mapping[int, Any]) -> None:
    """Continues after the batches that `states` (from `get_states`) had produced."""

  def plan(self, num_batches: int) -> None:
    """The run's length in global batches: a packed stream chooses its row counts from all of them."""
    del num_batches

  def upcoming_lengths(self, n: int) -> list[int] | None:
    """The sequence lengths of the next `n` global batches, in order, without moving the stream (what a
    length-bucketed run compiles ahead); None: every batch has the one length of the batch spec."""
    del n
    return None

  def upcoming_shapes(self, n: int) -> list[tuple[int, int]] | None:
    """(global rows, length) of the next `n` global batches, without moving the stream: the programs a run
    compiles ahead; None: every batch has the batch spec's one shape. Rows are `global_batch_size` except in
    packed streams."""
    lengths = self.upcoming_lengths(n)
    return None if lengths is None else [(self.global_batch_size, length) for length in lengths]


def buckets(max_seq_length: int) -> tuple[int, ...]:
  """The padded lengths of bucketed batches: 8·2^k and 12·2^k below `max_seq_length`, then `max_seq_length`.

  Coarser than the inference Runner's `bucket_lengths`, since each length met costs a compile of the gradient
  program (1–2 s at MiniLM's size on CPU): padding adds at most half a row (17 → 24 tokens), and 128 tokens take
  9 shapes, 512 take 15. Lengths 8 and 12 matter: a third of SST-2's sentences fit in 12 tokens.
  """
  if max_seq_length < 1:
    raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}.")
  lengths, base = [], _SMALLEST
  while base < max_seq_length:
    lengths += [n for n in (base, base * 3 // 2) if n < max_seq_length]
    base *= 2
  return tuple(lengths) + (max_seq_length,)


def bucket_of(length: int, lengths: Sequence[int]) -> int:
  """The smallest of `lengths` (sorted) that holds `length` tokens."""
  index = int(np.searchsorted(lengths, length))
  if index == len(lengths):
    raise ValueError(f"a row of {length} tokens is longer than the largest bucket {lengths[-1]}.")
  return int(lengths[index])


def row_lengths(features: Mapping[str, np.ndarray]) -> np.ndarray:
  """Tokens of each row up to its last attended one, [N]; a row of several sequences ([N, K, T]: multiple choice,
  sentence pairs) takes its longest. An all-padding row counts 1 token."""
  mask = np.asarray(features["attention_mask"]) != 0
  last = np.where(mask.any(-1), mask.shape[-1] - np.argmax(mask[..., ::-1], -1), 1)
  return last.reshape(len(last), -1).max(-1)


def cut(batch: Mapping[str, np.ndarray], length: int, sequence_keys: Sequence[str]) -> dict[str, np.ndarray]:
  """`batch` with the last (sequence) axis of `sequence_keys` cut to `length`; the other keys as they are."""
  return {k: np.ascontiguousarray(v[..., :length]) if k in sequence_keys else v for k, v in batch.items()}


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


class BucketedStream(FeatureStream):
  """`FeatureStream`'s epochs grouped by length; see the module docstring. `sequence_keys` are the features with
  the sequence as their last axis (the model inputs, and per-token labels)."""

  def __init__(self, features: Mapping[str, np.ndarray], keys: Sequence[str], *, global_batch_size: int,
               seed: int, num_shards: int, shards: Sequence[int], lengths: Sequence[int],
               sequence_keys: Sequence[str], mega_batch: int = MEGA_BATCH):
    super().__init__(features, keys, global_batch_size=global_batch_size, seed=seed, num_shards=num_shards,
                     shards=shards)
    self.buckets = tuple(sorted(lengths))
    self.sequence_keys = tuple(sequence_keys)
    self.lengths = row_lengths(self.features)
    # At most one epoch's worth of rows per chunk (an example twice only across an epoch boundary); >= 1 batch.
    self.chunk_batches = max(1, min(mega_batch, self.num_rows // global_batch_size))
    self._chunk = (-1, None)

  def _batches_of_chunk(self, chunk: int) -> np.ndarray:
    """[chunk_batches, B] example indices: the chunk's rows sorted by length, batch order shuffled."""
    if self._chunk[0] != chunk:
      size = self.chunk_batches * self.global_batch_size
      positions = self._positions(chunk * size, (chunk + 1) * size)
      ordered = positions[np.argsort(-self.lengths[positions], kind="stable")]
      batches = ordered.reshape(self.chunk_batches, self.global_batch_size)
      order = np.random.default_rng([self.seed, chunk, 1]).permutation(self.chunk_batches)
      self._chunk = (chunk, batches[order])
    return self._chunk[1]

  def global_rows(self, index: int) -> np.ndarray:
    """Example indices of global batch `index`, longest first."""
    chunk, within = divmod(index, self.chunk_batches)
    return self._batches_of_chunk(chunk)[within]

  def upcoming_lengths(self, n: int) -> list[int]:
    return [bucket_of(int(self.lengths[self.global_rows(i)].max()), self.buckets)
            for i in range(self.batches, self.batches + n)]

  def __next__(self) -> dict[str, np.ndarray]:
    rows = self.global_rows(self.batches)
    length = bucket_of(int(self.lengths[rows].max()), self.buckets)
    n = self.rows_per_shard
    local = np.concatenate([rows[s * n:(s + 1) * n] for s in self.shards])
    self.batches += 1
    return cut({k: v[local] for k, v in self.features.items()}, length, self.sequence_keys)


class PackedStream(FeatureStream):
  """`FeatureStream`'s global batches (the same examples, the same order), each data shard's examples laid end to
  end in rows of the features' length T (`jbert.data.packing`); see the module docstring. `token_keys`: per-token
  labels with their fill value; `example_keys`: per-example labels, laid out per slot. Multiple-choice features
  ([N, C, T]) keep each example's endings together in rows of C·T tokens (`packing.place_choices`)."""

  def __init__(self, features: Mapping[str, np.ndarray], keys: Sequence[str], *, global_batch_size: int,
               seed: int, num_shards: int, shards: Sequence[int], max_sequences: int,
               token_keys: Mapping[str, int] = {}, example_keys: Sequence[str] = (), pad_id: int = 0,
               row_multiple: int = 1, separate_texts: bool = False):
    super().__init__(features, keys, global_batch_size=global_batch_size, seed=seed, num_shards=num_shards,
                     shards=shards)
    self.num_shards, self.max_sequences, self.pad_id = num_shards, max_sequences, pad_id
    self.token_keys, self.example_keys, self.row_multiple = dict(token_keys), tuple(example_keys), row_multiple
    mask = self.features["attention_mask"]
    # [N, K, T]: multiple choice keeps an example's endings in one row; `separate_texts` (bi-encoders) packs each of
    # its K texts on its own, the batch's `text_slots` [n, K] saying where (indices into the global batch's slots).
    self.choices = mask.shape[1] if mask.ndim == 3 and not separate_texts else 0
    self.texts = mask.shape[1] if separate_texts else 0
    if self.texts:
      mask = mask.reshape(-1, mask.shape[-1])
    self.lengths = packing.example_lengths(mask)  # [N], [N, C], or [N·K] (separate texts)
    self.length = int(np.prod(mask.shape[1:]))  # the row's tokens: T, or C·T for multiple choice
    self._planned: np.ndarray | None = None  # `plan`'s; a stream nobody plans plans one epoch when first read

  def _shard_rows(self, index: int, shard: int) -> np.ndarray:
    base = index * self.global_batch_size + shard * self.rows_per_shard
    return self._positions(base, base + self.rows_per_shard)

  def _placement(self, index: int, shard: int) -> packing.Placement:
    return self._place(self._shard_rows(index, shard))[0]

  def _place(self, rows: np.ndarray) -> tuple[packing.Placement, packing.Placement | None]:
    """(examples, endings) placements of the examples at `rows` (endings: multiple choice only)."""
    if self.choices:
      return packing.place_choices(self.lengths[rows], max_tokens=self.length,
                                   max_examples=self.max_sequences)
    if self.texts:  # every text of the examples at `rows`, example by example
      rows = (rows[:, None] * self.texts + np.arange(self.texts)).reshape(-1)
    return packing.place(self.lengths[rows], max_tokens=self.length, max_sequences=self.max_sequences), None

  def _needed(self, index: int) -> int:
    """The rows every data shard of global batch `index` takes: what its fullest shard needs."""
    return max(self._placement(index, s).rows for s in range(self.num_shards))

  def plan(self, num_batches: int) -> None:
    """Chooses the row counts from the run's first `num_batches` global batches (every shard's, so all processes
    agree): `usual` for almost all, `most` for the rest (`packing.row_counts`)."""
    self._planned = np.array([self._needed(i) for i in range(max(1, num_batches))])
    self.usual, self.most = packing.row_counts(self._planned, self.row_multiple)

  def rows_of(self, index: int) -> int:
    """Rows per data shard of global batch `index`: `usual` where it fits, else `most`; a batch past the plan
    that fits neither takes what it needs (a third shape)."""
    if self._planned is None:
      self.plan(math.ceil(self.num_rows / self.global_batch_size))
    needed = int(self._planned[index]) if index < len(self._planned) else self._needed(index)
    if needed <= self.usual:
      return self.usual
    return self.most if needed <= self.most else -(-needed // self.row_multiple) * self.row_multiple

  def upcoming_shapes(self, n: int) -> list[tuple[int, int]]:
    return [(self.rows_of(i) * self.num_shards, self.length) for i in range(self.batches, self.batches + n)]

  def __next__(self) -> dict[str, np.ndarray]:
    rows = self.rows_of(self.batches)
    parts = []
    for s in self.shards:
      index = self._shard_rows(self.batches, s)
      examples, endings = self._place(index)
      features = {k: v[index] for k, v in self.features.items()}
      if self.choices:
        parts.append(packing.pack_choices(features, examples, endings, rows=rows, max_examples=self.max_sequences,
                                          example_keys=self.example_keys, pad_id=self.pad_id))
        continue
      if self.texts:
        parts.append(packing.pack_texts(features, examples, rows=rows, slots=self.max_sequences,
                                        example_keys=self.example_keys, pad_id=self.pad_id,
                                        first_slot=s * rows * self.max_sequences))
        continue
      parts.append(packing.pack_examples(features, examples, rows=rows, slots=self.max_sequences,
                                         token_keys=self.token_keys, example_keys=self.example_keys,
                                         pad_id=self.pad_id))
    self.batches += 1
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


class PretrainBatches(Stream):
  """One iterator per data shard of this process (`make_iterator(shard, num_shards)`: the grain pipeline of
  `jbert.data.loader`); `next()` gives the process-local rows of one global batch."""

  def __init__(self, make_iterator: Callable[[int, int], Any], shards: DataShards):
    self.iterators = {s: make_iterator(s, shards.num_shards) for s in shards.shards}

  def __next__(self) -> dict[str, np.ndarray]:
    parts = [next(it) for it in self.iterators.values()]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def get_states(self) -> dict[int, Any]:
    return {s: it.get_state() for s, it in self.iterators.items()}

  def set_states(self, states: Mapping[int, Any]) -> None:
    for s, it in self.iterators.items():
      it.set_state(states[s])


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
