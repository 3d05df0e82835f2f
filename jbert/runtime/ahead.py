"""Programs compiled ahead, in worker threads, for argument shapes known before they are met.

A length-bucketed run knows from its data which batch lengths it will meet (`Stream.upcoming_lengths`,
the evaluation's `plan_batches`), and a jitted function compiles each on first use, one after another, in the
loop's thread. Compiled here instead, XLA works on two programs at once (it releases the GIL; tracing does not,
so only the compiles overlap) while the loop already runs the ones that are ready: on a 2-core host a
fine-tuning run's compiles take about half the wall time.

`Ahead(jitted, key, context, pool)`: `submit(key, *abstract_args)` lowers and compiles the program for those
ShapeDtypeStructs (with shardings) in a worker; calling the `Ahead` with concrete arguments runs the program
of their `key` (waiting for it while it compiles), or the jitted function for a key never submitted. Lowering
reads the thread's mesh and logical axis rules, so `context()` re-enters the caller's in the worker. A
program compiled ahead goes through the persistent compilation cache as any other.

A stopped run must not wait for compiles it no longer needs (a TPU VM's preemption notice gives seconds, and a
second Ctrl-C means now). `Pool(interrupted=...)` therefore gives up a wait as soon as `interrupted()` says so
(raising `Abandoned`), and its workers are daemon threads that no exit hook joins (concurrent.futures'
ThreadPoolExecutor joins its workers at exit, however the pool was shut down); `leave(status)` ends the process
without waiting for a compile still running, since XLA cannot be interrupted. Nor for storage writes a storage
that stopped answering will never finish (`abandon`): Orbax's writer threads are not daemons, and tensorstore
retries for minutes.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import queue
import sys
import threading
import time
import traceback
import weakref
from typing import Any, Callable, Hashable

import jax

from jbert import errors

_POLL_S = 0.05  # how often a wait looks at `interrupted()`
_pools: weakref.WeakSet[Pool] = weakref.WeakSet()
_abandoned: list[str] = []  # background work nothing waits for (`abandon`)


class Abandoned(Exception):
  """A wait for a program still compiling was given up: the pool's `interrupted()` said the run is stopping."""


class Pool:
  """`workers` daemon threads running submitted functions (compiles) in order; see the module docstring."""

  def __init__(self, workers: int = 2, *, interrupted: Callable[[], bool] = lambda: False,
               name: str = "jbert-compile"):
    self._workers, self._interrupted, self._name = workers, interrupted, name
    self._queue: queue.SimpleQueue = queue.SimpleQueue()
    self._threads: list[threading.Thread] = []
    self._lock = threading.Lock()
    self._running = 0
    self._closed = False
    self._waited_s = 0.0
    _pools.add(self)

  def submit(self, fn: Callable[..., Any], *args) -> concurrent.futures.Future:
    future = concurrent.futures.Future()
    with self._lock:
      if self._closed:
        raise RuntimeError("submit after shutdown")
      self._queue.put((future, fn, args))
      if len(self._threads) < self._workers:
        thread = threading.Thread(target=self._work, name=f"{self._name}_{len(self._threads)}", daemon=True)
        thread.start()
        self._threads.append(thread)
    return future

  def _work(self) -> None:
    while True:
      item = self._queue.get()
      if item is None:
        return
      future, fn, args = item
      if not future.set_running_or_notify_cancel():
        continue  # cancelled by shutdown while queued
      with self._lock:
        self._running += 1
      try:
        result = fn(*args)
      except BaseException as e:  # pylint: disable=broad-except  (re-raised in the caller, by `wait`)
        future.set_exception(e)
      else:
        future.set_result(result)
      finally:
        with self._lock:
          self._running -= 1

  def wait(self, future: concurrent.futures.Future) -> Any:
    """`future.result()`, raising `Abandoned` instead once `interrupted()` is true while it is not done."""
    if future.done():
      return future.result()
    start = time.monotonic()
    try:
      while True:
        try:
          return future.result(timeout=_POLL_S)
        except concurrent.futures.TimeoutError:
          if self._interrupted():
            raise Abandoned("stopped while a program was still compiling") from None
    finally:
      with self._lock:
        self._waited_s += time.monotonic() - start

  def waited(self) -> float:
    """Seconds callers spent in `wait` for programs still compiling since the last call (the trainer leaves them
    out of the step rate and the ETA)."""
    with self._lock:
      waited, self._waited_s = self._waited_s, 0.0
    return waited

  def busy(self) -> bool:
    """Whether a worker is running a function now."""
    with self._lock:
      return self._running > 0

  def shutdown(self, wait: bool = False, cancel_futures: bool = True) -> None:
    """No more submissions; queued functions are cancelled (`cancel_futures`); running ones go on, unjoined
    unless `wait`."""
    with self._lock:
      self._closed = True
      threads = list(self._threads)
    if cancel_futures:
      while True:
        try:
          item = self._queue.get_nowait()
        except queue.Empty:
          break
        if item is not None:
          item[0].cancel()
    for _ in threads:
      self._queue.put(None)
    if wait:
      for thread in threads:
        thread.join()


def pool(workers: int = 2, *, interrupted: Callable[[], bool] = lambda: False) -> Pool:
  """Two workers: each XLA:CPU compile is mostly one thread, and the loop needs the cores as well."""
  return Pool(workers, interrupted=interrupted)


def compiling() -> bool:
  """Whether a worker of any pool of this process is compiling now."""
  return any(p.busy() for p in list(_pools))


def abandon(what: str) -> None:
  """Marks background work of this process that nothing will wait for (`what`, e.g. the storage writes of a
  storage that stopped answering): `leave` then ends the process at once, as it does under a compile."""
  _abandoned.append(what)


def leave(status: int | str | None, *, now: bool = False) -> None:
  """Ends the process with `status` (SystemExit's meaning) at once, flushing the logs and the console, when a
  worker is still compiling or work was `abandon`ed (or `now`: an aborted command); returns otherwise. Exiting
  normally would wait for the compile (the interpreter's shutdown cannot stop a thread inside XLA), and tearing
  down XLA's globals under it could crash the process."""
  if not (now or compiling() or _abandoned):
    return
  if isinstance(status, str):
    print(status, file=sys.stderr)
    status = 1
  jax = sys.modules.get("jax")
  if jax is not None:  # JAX's exit hook, skipped below, leaves a multi-process run's coordination service
    with contextlib.suppress(Exception):
      jax.distributed.shutdown()
  logging.shutdown()
  for stream in (sys.stdout, sys.stderr):
    with contextlib.suppress(Exception):
      stream.flush()
  os._exit(status or 0)  # pylint: disable=protected-access


def then_leave(body: Callable[[], Any]) -> None:
  """Runs a command's body, then `leave`s with its exit status: a stopped or failed command ends now, not once
  the compiles it no longer needs are done; an interrupted one (a second Ctrl-C) ends now in any case. A bug
  prints its traceback first."""
  try:
    body()
  except SystemExit as e:
    leave(e.code, now=e.code == errors.INTERRUPTED_STATUS)
    raise
  except BaseException:
    if compiling():
      traceback.print_exc()
      leave(1)
    raise
  leave(0)


class Ahead:
  """A jitted function whose programs for submitted keys compile in worker threads (module docstring)."""

  def __init__(self, jitted, key: Callable[..., Hashable], context: Callable[[], contextlib.AbstractContextManager],
               pool: Pool):  # pylint: disable=redefined-outer-name
    self._jitted, self._key, self._context, self._pool = jitted, key, context, pool
    self._programs: dict[Hashable, concurrent.futures.Future] = {}
    self._lock = threading.Lock()

  def submit(self, key: Hashable, *abstract_args) -> None:
    self.submit_lazy(key, lambda: abstract_args)

  def submit_lazy(self, key: Hashable, abstract_args: Callable[[], tuple]) -> None:
    """As `submit`, with the arguments from `abstract_args()`, called in the worker (it may wait for another
    program, whose outputs are this one's inputs)."""
    with self._lock:
      if key not in self._programs:
        self._programs[key] = self._pool.submit(self._compile, abstract_args)

  def _compile(self, abstract_args):
    args = abstract_args()
    with self._context():
      return self._jitted.lower(*args).compile()

  def program(self, key: Hashable):
    """The compiled program of a submitted `key`, once it is ready (in a worker: never abandoned)."""
    return self._programs[key].result()

  def __call__(self, *args):
    program = self._programs.get(self._key(*args))
    if program is None:
      return self._jitted(*args)
    if not program.done():
      # The steps dispatched before still run on the devices while this program compiles: waited for first, their
      # time stays the steps' own, and the wait the trainer leaves out of its rate (`Pool.waited`) is idle alone.
      # Left in the wait, it made the rate, and MFU, count steps in less time than they took (MFU above 100%).
      jax.block_until_ready(args)
    # A failed compile raises here, in the loop, as the jitted call would; a stop while it compiles, Abandoned.
    return self._pool.wait(program)(*args)


def nested(*factories: Callable[[], Any]) -> Callable[[], contextlib.AbstractContextManager]:
  """A context factory entering each of `factories`' contexts, for `Ahead`'s workers."""
  @contextlib.contextmanager
  def enter():
    with contextlib.ExitStack() as stack:
      for factory in factories:
        stack.enter_context(factory())
      yield
  return enter
