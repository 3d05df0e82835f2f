"""Distillation's cache of its teacher's outputs (`jbert/tasks/distillation/task.py`): computed once per run by the
teacher's pass (`compute`), over the training rows in example order, when the trainer makes the training stream
(after its finished check: a finished run never runs the teacher).

What is kept is what the losses read, exactly: the logits [N, C] (float32), and with `task.hidden_weight` > 0 the
mapped hidden states of each row's tokens up to its last attended one, laid end to end (`HiddenCache`: [S, K, H],
S = Σ row lengths) in the teacher's compute dtype (`model.dtype`: what its forward produced, so nothing is
rounded). Padding is not stored: SST-2's rows average 13 tokens, so at `max_seq_length` 128 a dense [N, K, H, T]
cache was ~90% zeros. A batch's [B, K, H, T] targets are rebuilt from it at the batch's own length by
`TeacherStream`, which wraps the training stream, reads the example index every row carries (`teacher_row`) and
so keeps the stream's states, resumes and process counts as they are.

The cache is bounded before it is allocated: by `task.teacher_cache_mib` (default 2048) and by half of the memory
available, each refused in one line that gives the size and the ways out.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import streams
from jbert.model import BertForSequenceClassification
from jbert.tasks.base import MODEL_INPUTS

log = logging.getLogger("jbert")

ROW_KEY = "teacher_row"  # the example index each training row carries, popped by TeacherStream
HIDDEN_KEY = "teacher_hidden"
# A cache may take this share of the memory available when the run starts.
MEMORY_SHARE = 0.5
_BATCH = 64  # rows per teacher forward pass


def memory_available() -> int:
  """Bytes of memory available to a new allocation (Linux's MemAvailable; else the physical pages free)."""
  try:
    with open("/proc/meminfo", encoding="ascii") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def size(num_bytes: float) -> str:
  return f"{num_bytes / 2**30:.1f} GiB" if num_bytes >= 2**30 else f"{num_bytes / 2**20:.1f} MiB"


def row_lengths(attention_mask: np.ndarray) -> np.ndarray:
  """Tokens of each row up to its last attended one (at least 1), int64 [N]."""
  return streams.row_lengths({"attention_mask": attention_mask}).astype(np.int64)


def check_size(lengths: np.ndarray, states: int, width: int, dtype: Any, cap_mib: float, *,
               logits_bytes: int = 0) -> int:
  """The bytes of the cache (hidden states of `lengths`' tokens, plus `logits_bytes`); a ValueError naming its size
  and the ways out when it exceeds `task.teacher_cache_mib` or MEMORY_SHARE of the memory available."""
  tokens = int(lengths.sum())
  total = tokens * states * width * np.dtype(dtype).itemsize + logits_bytes
  what = (f"task.hidden_weight>0 caches the teacher's hidden states of the training rows' tokens: {size(total)} "
          f"({len(lengths)} rows, {tokens} tokens x {states} states x {width} {np.dtype(dtype).name})")
  ways = "set task.hidden_weight=0, lower data.max_seq_length or distil on fewer rows"
  if total > cap_mib * 2**20:
    raise ValueError(f"{what}, over task.teacher_cache_mib={cap_mib:g}; raise it (up to {MEMORY_SHARE:.0%} of the "
                     f"{size(memory_available())} available), {ways}.")
  free = memory_available()
  if total > MEMORY_SHARE * free:
    raise ValueError(f"{what}, more than {MEMORY_SHARE:.0%} of the {size(free)} available; {ways}.")
  return total


@dataclasses.dataclass
class HiddenCache:
  """The teacher's K mapped hidden states of every row's tokens, laid end to end: row i is
  `values[offsets[i]:offsets[i + 1]]` [length_i, K, H]."""
  values: np.ndarray   # [S, K, H] in the teacher's dtype
  offsets: np.ndarray  # [N + 1] int64

  @classmethod
  def empty(cls, lengths: np.ndarray, states: int, width: int, dtype: Any) -> "HiddenCache":
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return cls(np.zeros((int(offsets[-1]), states, width), dtype), offsets)

  @property
  def nbytes(self) -> int:
    return self.values.nbytes + self.offsets.nbytes

  def put(self, row: int, hidden: np.ndarray) -> None:
    """Stores row `row` from its [K, H, T'] states (T' at least its length; the rest is padding)."""
    start, stop = self.offsets[row], self.offsets[row + 1]
    self.values[start:stop] = np.moveaxis(hidden[:, :, :stop - start], -1, 0)

  def batch(self, rows: np.ndarray, length: int) -> np.ndarray:
    """[len(rows), K, H, length]: the rows' states, the sequence last as the batch's inputs are cut, 0 past each."""
    out = np.zeros((len(rows), *self.values.shape[1:], length), self.values.dtype)
    for i, row in enumerate(np.asarray(rows)):
      start, stop = self.offsets[row], self.offsets[row + 1]
      if stop - start > length:
        raise ValueError(f"training row {row} has {stop - start} tokens, more than the batch's {length}.")
      out[i, :, :, :stop - start] = np.moveaxis(self.values[start:stop], 0, -1)
    return out


def compute(teacher: str, features: Mapping[str, np.ndarray], *, num_labels: int, layer_map: tuple[int, ...] | None,
            runtime: Mapping[str, Any], cap_mib: float) -> tuple[np.ndarray, HiddenCache | None]:
  """The teacher's pass over the rows of `features`: (logits [N, C] float32 in their order, and with `layer_map`
  the HiddenCache of the teacher's hidden states it lists, refused by `check_size` before it is allocated).
  `runtime`: the student's BertConfig overrides the teacher runs with (dtype, scan_layers)."""
  from jbert import weights  # pylint: disable=g-import-not-at-top  (TF/torch readers only when needed)
  n, length = features["input_ids"].shape
  lengths = row_lengths(features["attention_mask"])
  dtype = jnp.dtype(runtime.get("dtype") or "float32")  # what its forward produces: exact
  logits = np.zeros((n, num_labels), np.float32)
  hidden = None
  if layer_map is not None:
    width = weights.describe(teacher).config.hidden_size
    check_size(lengths, len(layer_map), width, dtype, cap_mib, logits_bytes=logits.nbytes)
    hidden = HiddenCache.empty(lengths, len(layer_map), width, dtype)
  start = time.perf_counter()
  config, params = weights.load_pretrained(teacher, BertForSequenceClassification, num_labels=num_labels,
                                           **runtime)
  model = BertForSequenceClassification(config, num_labels=num_labels)

  @jax.jit
  def forward(params, ids, types, mask):
    out = model.apply({"params": params}, ids, token_type_ids=types, attention_mask=mask, deterministic=True,
                      output_hidden_states=hidden is not None)
    states = None
    if out.hidden_states is not None:
      states = jnp.stack([out.hidden_states[i] for i in layer_map], 1).astype(dtype)  # [B, K, T, H]
      states = jnp.swapaxes(states, 2, 3)  # [B, K, H, T]: the sequence last, as bucketed batches cut it
      # Masked positions hold 0, not what the bucket's padding happened to give (the loss masks them anyway).
      states = states * (mask[:, None, None, :] != 0).astype(dtype)
    return out.logits.astype(jnp.float32), states

  order = np.argsort(lengths, kind="stable")
  bucket_lengths = (*streams.buckets(length), length)
  for first in range(0, n, _BATCH):
    rows = order[first:first + _BATCH]
    cut = next(b for b in bucket_lengths if b >= int(lengths[rows].max()))
    pad = _BATCH - len(rows)  # one shape per bucket length: the last batch is padded with row 0
    take = np.concatenate([rows, np.repeat(rows[:1], pad)])
    inputs = [np.asarray(features[key])[take, :cut] for key in MODEL_INPUTS]
    out_logits, out_hidden = forward(params, *inputs)
    logits[rows] = np.asarray(out_logits)[:len(rows)]
    if hidden is not None:
      out_hidden = np.asarray(out_hidden)
      for i, row in enumerate(rows):
        hidden.put(row, out_hidden[i])
  cached = logits.nbytes + (hidden.nbytes if hidden is not None else 0)
  log.info("task distill: the teacher's outputs of %d rows in %.1f s (%s in memory%s).", n,
           time.perf_counter() - start, f"{cached / 2**20:.1f} MiB",
           f": hidden states of {int(lengths.sum())} tokens in {dtype.name}" if hidden is not None else "")
  return logits, hidden


class TeacherStream(streams.Stream):
  """The training stream with each batch's `teacher_hidden` rebuilt from the cache at the batch's length; every
  other part (states, lengths ahead, planning) is the wrapped stream's."""

  def __init__(self, stream: streams.Stream, cache: HiddenCache):
    self.stream, self.cache = stream, cache

  def __next__(self) -> dict[str, np.ndarray]:
    batch = dict(next(self.stream))
    rows = batch.pop(ROW_KEY)
    batch[HIDDEN_KEY] = self.cache.batch(rows, batch["input_ids"].shape[-1])
    return batch

  def get_states(self) -> dict[int, Any]:
    return self.stream.get_states()

  def set_states(self, states: Mapping[int, Any]) -> None:
    self.stream.set_states(states)

  def plan(self, num_batches: int) -> None:
    self.stream.plan(num_batches)

  def upcoming_lengths(self, n: int) -> list[int] | None:
    return self.stream.upcoming_lengths(n)

  def upcoming_shapes(self, n: int) -> list[tuple[int, int]] | None:
    return self.stream.upcoming_shapes(n)
