"""Padding-free inference batches: the Runner's inputs laid end to end in rows, each computed alone.

The inputs of one `Runner.run` call are placed best-fit decreasing (`jbert.data.packing.place`, as fine-tuning
packs its evaluation sets) in rows holding at most one sequence per 8 tokens, and the rows are cut into batches of
`batch_size` rows (the last one into the smallest of `runner.batch_sizes` that holds it). The rows are as long as
the call's lengths want (`tiers`): twice the 90th percentile, a bucket length, with the longer inputs in a second
tier of rows of their own; a call too small to fill a batch (a search query, a handful of texts) takes rows just
long enough for it, so a query of 8 tokens is not computed at 512. A batch is `packing.pack_examples`' arrays:
`input_ids, token_type_ids, attention_mask, segment_ids, position_ids` [R, T] and `cls_positions,
sequence_weights` [R, S]; with segment ids the model computes on each sequence what it computes on the sequence
alone. Outputs come back per sequence: per-slot outputs [R, S, ...] at the sequence's (row, slot), token outputs
[R, T, ...] cut from its tokens.

So a call compiles at most four shapes (two tiers, each a full and a partial batch) whatever the lengths of its
inputs, and computes on padding only in the free tokens of a row's tail: what matters on a TPU, where every shape
is a compile, and for a first call on any host, where length-sorted buckets meet a shape per bucket length (27
for botchan.txt's sentences).
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Sequence

import numpy as np

from jbert.data import packing

# The inputs a packed row is made of; a feature with any other key (fill-mask's masked positions, a CRF's chain)
# runs unpacked.
INPUT_KEYS = ("input_ids", "token_type_ids")


def default_slots(row_length: int) -> int:
  """Sequences a row holds at most: one per 8 tokens, as fine-tuning's `data.max_sequences_per_row` default."""
  return -(-row_length // 8)


# A call's rows hold ROW_FACTOR times the ROW_PERCENTILE-th percentile of its lengths: long enough that best fit
# fills them (nine inputs in ten take at most half a row), short enough that attention, whose cost per token grows
# with the row, stays small. Rows of max_length are the wrong choice for sentences: on XLA:CPU, which runs
# attention's batched matmuls on one thread, MiniLM over botchan.txt's sentences (26 tokens on average) in rows of
# 256 ran at 0.65x the length-bucketed rate. The longer inputs (one in ten or fewer) are packed in rows of their own.
ROW_PERCENTILE, ROW_FACTOR = 90, 2


def tiers(lengths: np.ndarray, *, buckets: Sequence[int], batch_rows: int) -> list[tuple[int, np.ndarray]]:
  """(row length, the inputs packed in such rows) for inputs of `lengths` tokens: the inputs up to
  ROW_FACTOR x the ROW_PERCENTILE-th percentile length (a bucket length), then the longer ones; each tier's rows are
  the shortest bucket that holds its longest input and its tokens in `batch_rows` rows, if shorter (a search query
  of 8 tokens is not computed at 128)."""
  buckets = sorted(buckets)

  def bucket(n: float) -> int:
    return next((b for b in buckets if b >= n), buckets[-1])

  if not len(lengths):
    return []
  short = bucket(ROW_FACTOR * np.percentile(lengths, ROW_PERCENTILE))
  out = []
  for members, longest in ((np.flatnonzero(lengths <= short), short), (np.flatnonzero(lengths > short), buckets[-1])):
    if len(members):
      part = lengths[members]
      out.append((min(longest, bucket(max(int(part.max()), -(-int(part.sum()) // batch_rows)))), members))
  return out


@dataclasses.dataclass(frozen=True)
class PackedBatch:
  features: np.ndarray  # [n] positions (into the features given) of the batch's sequences.
  placement: packing.Placement  # Where each of them lies: rows counted from the batch's first.
  size: int  # Rows, padded: one of `runner.batch_sizes`.
  row_length: int  # T, tokens a row.
  slots: int  # S, sequences a row holds at most.


def plan(lengths: Sequence[int], *, batch_sizes: Sequence[int], buckets: Sequence[int],
         slots: int | None = None, fewest_tokens: bool = False) -> list[PackedBatch]:
  """The batches of inputs of `lengths` tokens: per tier (`tiers`), best-fit placement in its rows and `slots`
  sequences a row (default one per 8 tokens), then `batch_sizes[0]` rows a batch; a tier's last batch takes the
  smallest of `batch_sizes` that holds its rows. `fewest_tokens` (for a Runner that computes only its real rows,
  a few at a time: `jbert.inference.steps`) lays each tier in the row length that leaves the fewest tokens to
  compute instead (`fewest_tokens_length`)."""
  lengths = np.asarray(lengths, np.int64)
  if len(lengths) and lengths.max() > max(buckets):
    raise ValueError(f"A row has {lengths.max()} tokens, more than the packed rows' {max(buckets)}; truncate the "
                     "inputs to max_length first.")
  batches = []
  for length, members in tiers(lengths, buckets=buckets, batch_rows=batch_sizes[0]):
    if fewest_tokens:
      length = fewest_tokens_length(lengths[members], buckets, slots)
    batches.extend(_batches(members, lengths[members], length, slots or default_slots(length), batch_sizes))
  return batches


def fewest_tokens_length(lengths: np.ndarray, buckets: Sequence[int], slots: int | None = None) -> int:
  """The bucket whose rows hold `lengths` in the fewest tokens (rows x length), the shorter on a tie: 32 sentences
  of about 20 tokens take 5-6 rows of 128 rather than 20-odd rows of 32 (a third of them padding), while a lone
  query keeps its row of 32. Attention over a longer row costs little beside the matmuls' tokens (a row of 128 in
  a 384-wide model: 5% more)."""
  def tokens(length: int) -> int:
    return packing.place(lengths, max_tokens=length, max_sequences=slots or default_slots(length)).rows * length

  return min((b for b in sorted(buckets) if b >= lengths.max()), key=tokens)


def _batches(members: np.ndarray, lengths: np.ndarray, length: int, slots: int,
             batch_sizes: Sequence[int]) -> list[PackedBatch]:
  placement = packing.place(lengths, max_tokens=length, max_sequences=slots)
  order = np.argsort(placement.row, kind="stable")                          # sequences row by row
  first = np.searchsorted(placement.row[order], np.arange(0, placement.rows + 1))  # [rows + 1] bounds in `order`
  batches = []
  for start in range(0, placement.rows, batch_sizes[0]):
    stop = min(start + batch_sizes[0], placement.rows)
    picked = order[first[start]:first[stop]]
    local = packing.Placement(placement.row[picked] - start, placement.slot[picked], placement.offset[picked],
                              placement.length[picked], stop - start)
    batches.append(PackedBatch(members[picked], local, min(s for s in batch_sizes if s >= stop - start), length,
                               slots))
  return batches


def check_inputs(features: Sequence[Mapping[str, Sequence[int]]], batch: PackedBatch) -> None:
  """Packed rows carry the inputs only: a feature with anything else is refused, naming it."""
  for f in batch.features:
    extra = set(features[f]) - set(INPUT_KEYS)
    if extra:
      raise ValueError(f"packed rows take {' and '.join(INPUT_KEYS)} only; input {f} also has "
                       f"{', '.join(sorted(extra))}: run it unpacked.")


def input_at(batch: PackedBatch, segment_ids: np.ndarray, row: int, position: int) -> int:
  """The input (a position into the features given) whose token lies at (`row`, `position`) of the batch."""
  slot = int(segment_ids[row, position]) - 1
  hit = np.flatnonzero((batch.placement.row == row) & (batch.placement.slot == slot))
  return int(batch.features[hit[0]]) if len(hit) else int(batch.features[0])
