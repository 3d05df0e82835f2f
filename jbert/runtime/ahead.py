"""Programs compiled ahead, in worker threads, for argument shapes known before they are met.

A length-bucketed run knows from its data which batch lengths it will meet (`BucketedStream.bucket_lengths`,
the evaluation's `plan_batches`), and a jitted function compiles each on first use, one after another, in the
loop's thread. Compiled here instead, XLA works on two programs at once (it releases the GIL; tracing does not,
so only the compiles overlap) while the loop already runs the ones that are ready: on a 2-core host a
fine-tuning run's compiles take about half the wall time.

`Ahead(jitted, key, context, pool)`: `submit(key, *abstract_args)` lowers and compiles the program for those
ShapeDtypeStructs (with shardings) in a worker; calling the `Ahead` with concrete arguments runs the program
of their `key` (waiting for it while it compiles), or the jitted function for a key never submitted. Lowering
reads the thread's mesh and logical axis rules, so `context()` re-enters the caller's in the worker. A
program compiled ahead goes through the persistent compilation cache as any other.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from typing import Any, Callable, Hashable


class Ahead:
  """A jitted function whose programs for submitted keys compile in worker threads (module docstring)."""

  def __init__(self, jitted, key: Callable[..., Hashable], context: Callable[[], contextlib.AbstractContextManager],
               pool: concurrent.futures.Executor):
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
    """The compiled program of a submitted `key`, once it is ready."""
    return self._programs[key].result()

  def __call__(self, *args):
    program = self._programs.get(self._key(*args))
    if program is None:
      return self._jitted(*args)
    return program.result()(*args)  # a failed compile raises here, in the loop, as the jitted call would


def pool(workers: int = 2) -> concurrent.futures.ThreadPoolExecutor:
  """Two workers: each XLA:CPU compile is mostly one thread, and the loop needs the cores as well."""
  return concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="jbert-compile")


def nested(*factories: Callable[[], Any]) -> Callable[[], contextlib.AbstractContextManager]:
  """A context factory entering each of `factories`' contexts, for `Ahead`'s workers."""
  @contextlib.contextmanager
  def enter():
    with contextlib.ExitStack() as stack:
      for factory in factories:
        stack.enter_context(factory())
      yield
  return enter
