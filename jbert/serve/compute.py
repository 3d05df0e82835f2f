"""Where the device loop's batches are computed: in the server's process, or split over compute workers.

On a CPU host of several cores the server computes in worker processes, one per core, each with one XLA:CPU
thread. XLA:CPU runs every op of a process on one pool of threads, one per core; two threads that meet at every
op spend a quarter more CPU time on a batch than one thread alone (a MiniLM-sized model, 250-token inputs,
2-core Xeon: 67-87 against 53-63 ms an input, `bench/cpu_threads.py`), and any other work on those cores (HTTP,
tokenising) stalls both. A process runs one program at a time, so one thread a process means a process a core. Each batch is split into
runs of requests of about equal tokens, one a worker, computed at once (data parallel, as the Runner is over
devices); the batch is answered when every part is. Outputs equal the server process's bit for bit where the
same packed shapes run (the same programs, and a one-thread dot sums in the same order).

A worker is `jbert.data.workers`' process: a fresh interpreter that the kernel kills when the server dies, taking
one job at a time. It loads the same folders with the same options and warms up the same shapes (from the compile
cache the server uses). A worker that dies (the system out of memory, kill -9) fails only its part of the batch
it held, each of those requests a 500 saying so; a new one starts at once and joins when it is warm, the others
serving meanwhile.
"""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from typing import Any, Mapping, Sequence

from jbert.data import workers
from jbert.inference import runner as runner_lib
from jbert.runtime import compile_cache, console
from jbert.serve import models as models_lib
from jbert.serve.models import ApiError, Work

log = logging.getLogger("jbert")

# XLA's CPU client sizes its thread pool from NPROC when it is set (else one thread per core).
WORKER_ENV = {"NPROC": "1", "JAX_NUM_CPU_DEVICES": "1"}
# Workers yield the cores to the server's event loop (HTTP, tokenising) whenever it has work: at 32 clients of
# short inputs on 2 cores, p99 latency 294-358 ms at niceness 10 against 657-833 ms at 0, as many inputs/s or more.
WORKER_NICENESS = 10

_served: dict[str, Any] = {}  # a worker's models, by name


def default_workers(platform: str) -> int:
  """Compute workers a server on `platform` starts by default: one per core of a CPU host of several cores,
  none (the server's own process) on an accelerator or one core."""
  cores = len(os.sched_getaffinity(0))
  return cores if platform == "cpu" and cores > 1 else 0


def handle(job: tuple) -> Any:
  """A worker's side of a job: ("load", specs, options, compile cache) -> (the programs warm-up ran, the
  compiles that took: `compile_cache.Compiles`); ("compute", model name, works) -> (the model's results, the
  programs compiled for them)."""
  if job[0] == "load":
    _, specs, options, cache = job
    os.nice(WORKER_NICENESS)
    console.quiet_library_logs()
    compile_cache.enable(cache)
    before = compile_cache.compiles()
    for name, path in specs:
      _served[name] = models_lib.load(name, path, **options)
    return sum(models_lib.warm_up(m) for m in _served.values()), compile_cache.compiles() - before
  _, name, works = job
  before = runner_lib.compiled_count()
  results = _served[name].compute(works)
  return results, runner_lib.compiled_count() - before


def split(works: Sequence[Work], parts: int) -> list[list[Work]]:
  """`works` in at most `parts` runs, in order, of about equal tokens (a work is never cut)."""
  total = sum(w.tokens for w in works)
  runs, current, tokens = [], [], 0
  for work in works:
    current.append(work)
    tokens += work.tokens
    if len(runs) < parts - 1 and tokens * parts >= total * (len(runs) + 1):
      runs.append(current)
      current = []
  return [run for run in runs + [current] if run]


class InProcess:
  """Computes in the server's own process (accelerators, one core, or --compute_workers=0)."""

  ready = 0  # compute workers warm

  def compute(self, model, works: Sequence[Work]) -> tuple[list, int]:
    before = runner_lib.compiled_count()
    results = model.compute(works)
    return results, runner_lib.compiled_count() - before

  def layout(self, model, works: Sequence[Work]) -> tuple[int, int] | None:
    return model.layout(works)

  def close(self) -> None:
    """Nothing to stop: the batch in progress ends with the loop."""


class Pool:
  """Compute workers holding every served model, started from the thread that creates the pool (their death
  signal follows it: the main thread), restarted from the device loop's thread (which lasts as long)."""

  def __init__(self, count: int, specs: Sequence[tuple[str, str]], options: Mapping[str, Any],
               cache: str | None):
    self._load = ("load", list(specs), dict(options), cache)
    self.workers = [_Worker(f"compute worker {i}") for i in range(count)]
    for worker in self.workers:
      worker.start(self._load)

  def wait_ready(self) -> tuple[int, compile_cache.Compiles]:
    """Waits for every worker to load and warm up: (the programs warm-up ran, the compiles the first took)."""
    return [w.wait_ready() for w in self.workers][0]

  @property
  def ready(self) -> int:
    """Compute workers warm."""
    return sum(w.ready for w in self.workers)

  def compute(self, model, works: Sequence[Work]) -> tuple[list, int]:
    """`model.compute` of each run of `split(works)` in a worker of its own, all at once."""
    ready = self._ready_workers()
    runs = split(works, len(ready))
    for worker, run in zip(ready, runs):
      worker.send(("compute", model.name, run))
    results, compiled, failure = [], 0, None
    for worker, run in zip(ready, runs):
      try:
        out, programs = worker.receive("computing a batch")
      except _Died as e:
        out, programs = [ApiError(500, f"the server's {worker.name} died while computing this request's batch "
                                       f"({e}); the request was not answered: retry it.")] * len(run), 0
        worker.start(self._load)
      except Exception as e:  # pylint: disable=broad-except  (raised below, once every worker has answered)
        out, programs, failure = [], 0, failure or e
      results.extend(out)
      compiled += programs
    if failure is not None:
      raise failure
    return results, compiled

  def layout(self, model, works: Sequence[Work]) -> tuple[int, int] | None:
    """(packed rows, padding tokens) summed over the runs the workers computed."""
    parts = [model.layout(run) for run in split(works, max(1, self.ready))]
    return None if None in parts else (sum(p[0] for p in parts), sum(p[1] for p in parts))

  def close(self) -> None:
    for worker in self.workers:
      worker.close()

  def _ready_workers(self) -> list[_Worker]:
    """The warm workers (a restarted one joins once its warm-up reply is there); waits for one if none is."""
    for worker in self.workers:
      if worker.loading and worker.conn.poll():
        self._join(worker)
    if not any(w.ready for w in self.workers):
      for worker in self.workers:
        if worker.loading:
          self._join(worker)
          break
    ready = [w for w in self.workers if w.ready]
    if not ready:
      raise RuntimeError("every compute worker failed to start again; see the log above, and restart the server.")
    return ready

  def _join(self, worker: _Worker) -> None:
    try:
      worker.wait_ready()
      log.warning("jbert.serve: %s started again and warm", worker.name)
    except Exception:  # pylint: disable=broad-except  (the others serve on; the log says why)
      log.exception("jbert.serve: %s failed to start again", worker.name)


class _Died(Exception):
  """A worker's process ended; the message is its exit status."""


class _Worker:
  """One worker process: `start` sends it its models, `wait_ready` takes its warm-up reply."""

  def __init__(self, name: str):
    self.name = name
    self.proc = self.conn = None
    self.loading = self.ready = False

  def start(self, load: tuple) -> None:
    if self.conn is not None:
      self.conn.close()
    self.proc, self.conn = workers.start(f"{__name__}:handle", env=WORKER_ENV)
    self.ready = False
    self.conn.send(load)
    self.loading = True

  def wait_ready(self) -> tuple[int, compile_cache.Compiles]:
    """The warm-up reply; raises what loading raised in the worker, or `_Died`."""
    self.loading = False
    reply = self.receive("loading the models")
    self.ready = True
    return reply

  def send(self, job: tuple) -> None:
    with contextlib.suppress(OSError):  # gone: `receive` says so
      self.conn.send(job)

  def receive(self, what: str) -> Any:
    try:
      ok, result = self.conn.recv()
    except (EOFError, OSError):
      self.ready = False
      status = self.proc.wait(10)
      log.error("jbert.serve: %s died %s (exit status %s; -9 is often the system out of memory)", self.name,
                what, status)
      raise _Died(f"exit status {status}") from None
    if not ok:
      raise result
    return result

  def close(self) -> None:
    """Asks the worker to end and reaps it."""
    with contextlib.suppress(OSError):  # already gone
      self.conn.send(None)
    try:
      self.proc.wait(10)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait(10)
    self.conn.close()
