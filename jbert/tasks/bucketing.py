"""Length-bucketed fine-tuning batches: rows of similar length together, padded to a few bucket lengths.

Fine-tuning rows are padded to `max_seq_length`, yet most are far shorter (SST-2's training sentences average 13
tokens, p90 27: at 128, ~90% of the compute is padding). A bucketed global batch is cut to the smallest bucket
that holds its longest row, so the jitted steps see one shape per bucket, all known up front from
`max_seq_length` (`buckets`), which `tpu/aot_compile.py` compiles ahead of time.

Training (`BucketedStream`), as transformers' `group_by_length`: the endless sequence of seeded epoch
permutations (`feeding.FeatureStream`'s) is cut into chunks of `mega_batch` global batches; each chunk's rows are
sorted by length (longest first, ties in permutation order), cut into global batches, and the batches of the chunk
are shuffled (seeded by the chunk). The rows of a chunk's batches are exactly its stretch of the epoch sequence,
so every epoch still visits each example once; only the chunk that spans an epoch boundary mixes the two epochs'
rows (and may hold an example of each, as the unbucketed stream's boundary batch may). A chunk holds at most one
epoch's worth of rows. Global batch k and its bucket are decided from the whole global batch, by every process
alike; data shard s takes rows [s·B/S, (s+1)·B/S) of it. The state stays the number of batches produced.

Evaluation (`jbert.train.evaluation.predict`) sorts the rows by length into bucketed batches too (the inference
Runner's `plan_batches`) and puts the outputs back in example order.

The cut changes nothing a row computes: attention never reads masked keys (their weights are exactly 0), and
positions are absolute, so a row's logits in a bucketed batch equal the padded batch's up to float rounding.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np

from jbert.tasks.feeding import FeatureStream

# Global batches sorted together (transformers' group_by_length: 50).
MEGA_BATCH = 50
_SMALLEST = 8


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
    """The bucket lengths of the next `n` global batches, in order; the stream does not move."""
    return [bucket_of(int(self.lengths[self.global_rows(i)].max()), self.buckets)
            for i in range(self.batches, self.batches + n)]

  def __next__(self) -> dict[str, np.ndarray]:
    rows = self.global_rows(self.batches)
    length = bucket_of(int(self.lengths[rows].max()), self.buckets)
    n = self.rows_per_shard
    local = np.concatenate([rows[s * n:(s + 1) * n] for s in self.shards])
    self.batches += 1
    return cut({k: v[local] for k, v in self.features.items()}, length, self.sequence_keys)
