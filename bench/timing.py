"""Timing shared by the benches: frameworks measured in alternating blocks, so a change in the host's load during
a run falls on every framework alike rather than on whichever ran last."""
from __future__ import annotations

import time


def alternating_blocks(runners, method: str, timed: int, rounds: int, warmup: int) -> dict[str, list[float]]:
  """{name: seconds of each timed call of `runner.method()`}: `timed` calls per runner spread over `rounds`
  blocks that alternate between the runners; each block starts with untimed calls (`warmup` in the first round,
  where compiles happen, then 1)."""
  times = {name: [] for name in runners}
  per_round = [timed // rounds + (r < timed % rounds) for r in range(rounds)]
  for r, n in enumerate(per_round):
    for name, runner in runners.items():
      untimed = warmup if r == 0 else 1
      for i in range(untimed + n):
        start = time.perf_counter()
        getattr(runner, method)()
        if i >= untimed:
          times[name].append(time.perf_counter() - start)
  return times
