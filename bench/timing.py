"""Timing shared by the benches: frameworks measured in alternating blocks, so a change in the host's load during
a run falls on every framework alike rather than on whichever ran last; the best of repeated calls; one timed
call."""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable


@dataclasses.dataclass
class Blocks:
  """Per runner: wall and CPU seconds (all the process's threads: the work, without the waits for a core) of each
  timed call, and what every call returned, the untimed ones too."""
  seconds: dict[str, list[float]]
  cpu_seconds: dict[str, list[float]]
  returned: dict[str, list[Any]]


def blocks(runners, method: str, timed: int, rounds: int, warmup: int) -> Blocks:
  """`timed` calls of `runner.method()` per runner spread over at most `rounds` blocks that alternate between the
  runners. Each block starts with untimed calls (`warmup` in the first round, where compiles happen, then 1): a
  call right after the other framework's runs slow, which is no one's steady state."""
  rounds = max(1, min(rounds, timed))
  out = Blocks(*({name: [] for name in runners} for _ in range(3)))
  per_round = [timed // rounds + (r < timed % rounds) for r in range(rounds)]
  for r, n in enumerate(per_round):
    for name, runner in runners.items():
      untimed = warmup if r == 0 else 1
      for i in range(untimed + n):
        start, cpu = time.perf_counter(), time.process_time()
        out.returned[name].append(getattr(runner, method)())
        if i >= untimed:
          out.seconds[name].append(time.perf_counter() - start)
          out.cpu_seconds[name].append(time.process_time() - cpu)
  return out


def alternating_blocks(runners, method: str, timed: int, rounds: int, warmup: int) -> dict[str, list[float]]:
  """{name: seconds of each timed call of `runner.method()`} (`blocks`)."""
  return blocks(runners, method, timed, rounds, warmup).seconds


def best_seconds(fn: Callable[[], Any], repeats: int, warmup: int = 0) -> float:
  """The fastest of `repeats` calls of `fn()`, after `warmup` untimed ones (compiles, caches)."""
  for _ in range(warmup):
    fn()
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - start)
  return best


def timed(fn: Callable[..., Any], *args) -> tuple[float, Any]:
  """(seconds, result) of one call `fn(*args)`."""
  start = time.perf_counter()
  out = fn(*args)
  return time.perf_counter() - start, out
