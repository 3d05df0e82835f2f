"""A batch computed a few rows a call: for XLA:CPU, whose caches a whole batch outgrows.

On a 2-core Xeon (one XLA:CPU device), a MiniLM-sized model (6 layers, 384 wide) over a packed [32, 256] batch of
long inputs (216-249 tokens) took 149 ms of CPU time an input whole, 121 ms computed 2 rows a step inside its one
program (`lax.map`), and 99 ms as 16 calls of a [2, 256] program; 128 short inputs in [32, 128]: 17.2, 12.4 and
11.3 ms (`bench/serve.py`'s inputs, the three interleaved in one process). Attention's [B, N, T, T] scores and
the matmuls' activations of a whole batch outgrow the caches, a step's stay in them; and the loop of one program
costs more than its steps dispatched back to back as calls. Steps also skip the padding rows a partial batch is
padded with to a compiled batch size (17 rows to 32): at 32 clients of long inputs a fifth to a third of the rows
the server computed were such. An accelerator wants the whole batch at once, so only the serving Runner on a CPU
calls in steps (`jbert.serve.models`).
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def rows_a_step(rows: int, length: int, step_tokens: int) -> int:
  """The largest divisor of `rows` that keeps a step within `step_tokens` (at least one row): one program shape
  a batch."""
  return max(d for d in range(1, rows + 1) if rows % d == 0 and (d == 1 or d * length <= step_tokens))


def split(batch: Mapping[str, np.ndarray], step_tokens: int) -> list[dict[str, np.ndarray] | None]:
  """`batch` ([R, ...] arrays, R rows of T tokens) cut along its rows into steps of `rows_a_step` rows; a step
  whose rows are all padding (a partial batch is padded to a batch size: 17 rows to 32) is None, not computed."""
  rows, length = batch["input_ids"].shape
  per_step = rows_a_step(rows, length, step_tokens)
  real = batch["attention_mask"].any(axis=1)  # [R]
  return [{k: v[i:i + per_step] for k, v in batch.items()} if real[i:i + per_step].any() else None
          for i in range(0, rows, per_step)]


def join(outputs: Sequence[Mapping[str, np.ndarray] | None]) -> Mapping[str, np.ndarray]:
  """The steps' outputs (each with a leading row axis) as the whole batch's; a step not computed gives zeros
  (padding rows, which no input reads)."""
  if len(outputs) == 1:
    return outputs[0]
  shapes = next(o for o in outputs if o is not None)
  return {k: np.concatenate([np.zeros_like(shapes[k]) if o is None else o[k] for o in outputs]) for k in shapes}
