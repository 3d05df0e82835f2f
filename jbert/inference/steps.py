"""A batch computed a few rows at a time inside its one program: for XLA:CPU, whose caches a whole batch outgrows.

On a 2-core Xeon (one thread), a MiniLM-sized model (6 layers, 384 wide) over a packed [32, 256] batch took 148 ms
of CPU time per row, and 102 ms computed 2 rows (512 tokens) a step; [8, 256] 122 against 94, 128 short inputs in
rows of 32 14.4 against 8.7 (bench/serve.py's inputs): attention's [B, N, T, T] scores and the matmuls'
activations of a whole batch outgrow the caches, a step's stay in them. An accelerator wants the whole batch at
once, so only the serving Runner on a CPU computes in steps (`jbert.serve.models`).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import jax

Fn = Callable[[Any, dict[str, jax.Array]], Mapping[str, jax.Array]]


def in_steps(fn: Fn, step_tokens: int, params: Any, batch: dict[str, jax.Array]) -> Mapping[str, jax.Array]:
  """`fn(params, batch)` computed a few rows at a time: the largest divisor of the batch's rows that keeps a step
  within `step_tokens` (at least one row). Each row is computed alone either way, so outputs equal the whole
  batch's within float rounding."""
  rows, length = batch["input_ids"].shape
  per_step = max(d for d in range(1, rows + 1) if rows % d == 0 and (d == 1 or d * length <= step_tokens))
  if per_step == rows:
    return fn(params, batch)
  steps = jax.tree.map(lambda x: x.reshape(rows // per_step, per_step, *x.shape[1:]), batch)
  out = jax.lax.map(lambda step: fn(params, step), steps)
  return jax.tree.map(lambda x: x.reshape(rows, *x.shape[2:]), out)
