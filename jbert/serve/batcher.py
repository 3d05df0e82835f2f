"""One device loop for every connection: requests queue, the loop takes what is queued (up to
`max_batch_tokens`, waiting at most `max_wait_s` for more once the first arrived), computes each model's share in
one call (packed rows: `jbert.serve.models`; in this process or split over compute workers: `jbert.serve.compute`)
and answers every request with its own outputs, in its order.

The queue is bounded in inputs (`max_queue`, counted until answered): a request that would pass it is refused
at once (503 with Retry-After) instead of growing memory. A request whose client disconnected leaves the queue
and is never computed. `close` stops intake; the loop finishes what was accepted, then ends.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from typing import Any

from jbert.serve import compute as compute_lib
from jbert.serve.metrics import Metrics
from jbert.serve.models import ApiError, Work

log = logging.getLogger("jbert")


@dataclasses.dataclass(eq=False)
class Job:
  model: Any  # models.EmbeddingModel | models.PredictionModel
  work: Work
  future: asyncio.Future
  loop: asyncio.AbstractEventLoop
  queued_at: float = dataclasses.field(default_factory=time.monotonic)
  cancelled: bool = False


class Batcher:

  def __init__(self, *, max_batch_tokens: int, max_wait_s: float, max_queue: int, metrics: Metrics,
               computer: compute_lib.InProcess | compute_lib.Pool | None = None):
    self.max_batch_tokens, self.max_wait_s, self.max_queue = max_batch_tokens, max_wait_s, max_queue
    self.metrics = metrics
    self.computer = computer or compute_lib.InProcess()
    self._cond = threading.Condition()
    self._queue: collections.deque[Job] = collections.deque()
    self._pending = 0  # inputs accepted and not yet answered
    self.closing = False  # set from a signal handler: a plain attribute, no lock
    self._thread = threading.Thread(target=self._loop, name="jbert-serve-device", daemon=True)
    self._thread.start()

  def submit(self, model, work: Work) -> Job:
    """Queues `work`; raises ApiError 503 when closing or full, 413 when it could never fit."""
    if self.closing:
      raise ApiError(503, "the server is shutting down; retry on another replica or after its restart.",
                     retry_after=5)
    if work.inputs > self.max_queue:
      raise ApiError(413, f"the request has {work.inputs} inputs, more than the server queues at once "
                          f"(--max_queue={self.max_queue}); send them in smaller requests.")
    loop = asyncio.get_running_loop()
    job = Job(model, work, loop.create_future(), loop)
    with self._cond:
      if self._pending + work.inputs > self.max_queue:
        self.metrics.rejected.labels("queue_full").inc()
        raise ApiError(503, f"the server is at capacity ({self._pending} inputs queued, --max_queue="
                            f"{self.max_queue}); retry after a second.", retry_after=1)
      self._queue.append(job)
      self._pending += work.inputs
      self.metrics.queue_inputs.set(self._pending)
      self._cond.notify()
    return job

  def cancel(self, job: Job) -> None:
    """The client left: a queued job is dropped (never computed); one in flight is answered to no one."""
    with self._cond:
      job.cancelled = True
      if job in self._queue:
        self._queue.remove(job)
        self._release(job)
        self.metrics.cancelled.inc(job.work.inputs)

  def close(self, timeout: float | None = None) -> None:
    """Stops intake, waits for the loop to answer everything accepted, then stops the computer."""
    with self._cond:
      self.closing = True
      self._cond.notify_all()
    self._thread.join(timeout)
    self.computer.close()

  @property
  def pending(self) -> int:
    return self._pending

  # -- the device loop --

  def _release(self, job: Job) -> None:
    self._pending -= job.work.inputs
    self.metrics.queue_inputs.set(self._pending)

  def _take(self) -> list[Job] | None:
    with self._cond:
      while not self._queue:
        if self.closing:
          return None
        self._cond.wait(0.5)  # wakes to see `closing` even if a signal handler set it without notifying
      deadline = time.monotonic() + self.max_wait_s
      while not self.closing and sum(j.work.tokens for j in self._queue) < self.max_batch_tokens:
        left = deadline - time.monotonic()
        if left <= 0:
          break
        self._cond.wait(left)
      jobs, tokens = [], 0
      while self._queue and (not jobs or tokens + self._queue[0].work.tokens <= self.max_batch_tokens):
        job = self._queue.popleft()
        jobs.append(job)
        tokens += job.work.tokens
      return jobs

  def _loop(self) -> None:
    while (jobs := self._take()) is not None:
      now = time.monotonic()
      for job in jobs:
        self.metrics.queue_wait.observe(now - job.queued_at)
      groups: dict[Any, list[Job]] = collections.defaultdict(list)
      for job in jobs:
        groups[(id(job.model), job.work.group)].append(job)
      for group in groups.values():
        self._run(group)

  def _run(self, jobs: list[Job]) -> None:
    model = jobs[0].model
    compiled = 0
    try:
      results, compiled = self.computer.compute(model, [j.work for j in jobs])
    except Exception as e:  # pylint: disable=broad-except  (a bug must not stop the loop serving the others)
      log.exception("jbert.serve: computing a batch of %s failed", model.name)
      results = [ApiError(500, f"internal error computing the batch: {type(e).__name__}: {e}")] * len(jobs)
    self.metrics.compiles.inc(compiled)
    self.metrics.compute_workers.set(self.computer.ready)
    self._count(model, jobs)
    with self._cond:
      for job, result in zip(jobs, results):
        self._release(job)
    for job, result in zip(jobs, results):
      if not job.cancelled:
        job.loop.call_soon_threadsafe(_resolve, job.future, result)

  def _count(self, model, jobs: list[Job]) -> None:
    tokens = sum(j.work.tokens for j in jobs)
    self.metrics.batch_inputs.observe(sum(j.work.inputs for j in jobs))
    self.metrics.batch_tokens.observe(tokens)
    self.metrics.tokens.inc(tokens)
    layout = self.computer.layout(model, [j.work for j in jobs])
    if layout is not None:
      rows, padding = layout
      self.metrics.batch_rows.observe(rows)
      self.metrics.padding.inc(padding)


def _resolve(future: asyncio.Future, result) -> None:
  if future.done():
    return
  if isinstance(result, BaseException):
    future.set_exception(result)
  else:
    future.set_result(result)
