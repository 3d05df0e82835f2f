"""A batch computed a few rows a call: for XLA:CPU, whose caches a whole batch outgrows.

On a 2-core Xeon (one XLA:CPU device), a MiniLM-sized model (6 layers, 384 wide) over a packed [32, 256] batch of
long inputs (216-249 tokens) took 149 ms of CPU time an input whole, 121 ms computed 2 rows a step inside its one
program (`lax.map`), and 99 ms as 16 calls of a [2, 256] program; 128 short inputs in [32, 128]: 17.2, 12.4 and
11.3 ms (`bench/serve.py`'s inputs, the three interleaved in one process). Attention's [B, N, T, T] scores and
the matmuls' activations of a whole batch outgrow the caches, a step's stay in them; and the loop of one program
costs more than its steps dispatched back to back as calls. The steps cover a batch's real rows only, the last
step taking the rows left, so none of the rows a partial batch is padded with (17 rows to 32) is computed: at 32
clients of long inputs a fifth to a third of a server's rows were such. An accelerator wants the whole batch at
once, so only the serving Runner on a CPU calls in steps (`jbert.serve.models`), with rows laid for the fewest
tokens (`packed.fewest_tokens_length`) since padding rows no longer pad its shapes.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np


def rows_a_step(length: int, step_tokens: int) -> int:
  """Rows of `length` tokens a step takes: as many as `step_tokens` holds, at least one."""
  return max(1, step_tokens // length)


def split(batch: Mapping[str, np.ndarray], step_tokens: int) -> list[dict[str, np.ndarray]]:
  """The real rows of `batch` ([R, ...] arrays, R rows of T tokens) in steps of `rows_a_step` rows, the last one
  taking what is left; the padding rows after the last real one (a partial batch padded to a batch size) are not
  in any step."""
  rows, length = batch["input_ids"].shape
  real = np.flatnonzero(batch["attention_mask"].any(axis=1))
  used = int(real[-1]) + 1 if len(real) else 1
  if used == rows and rows <= rows_a_step(length, step_tokens):
    return [dict(batch)]
  per_step = rows_a_step(length, step_tokens)
  return [{k: v[i:min(i + per_step, used)] for k, v in batch.items()} for i in range(0, used, per_step)]


def join(outputs: Sequence[Mapping[str, np.ndarray]], rows: int) -> Mapping[str, np.ndarray]:
  """The steps' outputs (each with a leading row axis) as the whole batch's `rows`; the rows no step computed
  (padding, which no input reads) are zeros."""
  if len(outputs) == 1 and all(len(v) == rows for v in outputs[0].values()):
    return outputs[0]
  out = {}
  for k in outputs[0]:
    computed = np.concatenate([o[k] for o in outputs]) if len(outputs) > 1 else outputs[0][k]
    pad = np.zeros((rows - len(computed), *computed.shape[1:]), computed.dtype)
    out[k] = np.concatenate([computed, pad]) if len(pad) else computed
  return out
