"""prepare's worker processes (`run`; `start` also gives jbert.serve its compute workers), and how Ctrl-C and
SIGTERM stop them: at once.

Each worker is a fresh interpreter (`python -m jbert.data.workers`; not forked: the parent may hold gcsfs's event
loop and pyarrow's threads) that takes one job at a time through a socket and sends back its result or its
exception. It runs in its own process group, so a terminal's Ctrl-C, which reaches the whole foreground group,
never interrupts it mid-job (from its first instruction on: a worker that died of it while importing would leave
a traceback, one that died mid-job a parent waiting on a job that never ends). The parent decides instead: on the
first signal it kills its workers (a shard in progress is redone by the rerun anyway; its temporary file is swept
at once), and a second signal ends the process at once. No multiprocessing, so no semaphore for its resource
tracker to warn about, whichever way the parent ends. A worker that dies on its own (out of memory) fails the
run, naming its job, instead of being replaced forever; one whose parent is killed dies with it.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import connection
from typing import Any

from jbert import errors

SIGTERM_STATUS = 128 + signal.SIGTERM  # a shell's status for a command ended by SIGTERM


class Interrupted(KeyboardInterrupt):
  """Ctrl-C or SIGTERM reached the command; `status` is the exit status that says which."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.status = errors.INTERRUPTED_STATUS if signum == signal.SIGINT else SIGTERM_STATUS


@contextlib.contextmanager
def stopped_by_signals(program: str, message: str) -> Iterator[None]:
  """The body of a command that a first Ctrl-C or SIGTERM interrupts (an `Interrupted` raised in the main thread,
  which unwinds through the cleanups) and a second one ends at once; either way `program: message` on stderr."""

  said = []

  def say() -> None:
    if not said:
      said.append(True)
      print(f"{program}: {message}", file=sys.stderr, flush=True)

  def now(signum, unused_frame):
    say()
    os._exit(Interrupted(signum).status)  # pylint: disable=protected-access  (the user asked twice: no cleanup)

  def first(signum, unused_frame):
    signal.signal(signal.SIGINT, now)
    signal.signal(signal.SIGTERM, now)
    raise Interrupted(signum)

  previous = {s: signal.signal(s, first) for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  except KeyboardInterrupt as e:
    if errors.show_traceback():
      raise
    say()
    sys.stdout.flush()
    # Not sys.exit: Python's finalisation restores the default handlers, and a second Ctrl-C meeting it would end
    # the process by the signal instead of with the status. The workers are stopped; nothing else needs unwinding.
    os._exit(e.status if isinstance(e, Interrupted) else errors.INTERRUPTED_STATUS)  # pylint: disable=protected-access
  for s, handler in previous.items():
    signal.signal(s, handler)


def _die_with_parent(parent: int) -> None:
  """A worker must not outlive a killed parent and finish a job behind the back of its rerun."""
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass  # not Linux: the temporary names still keep two writers apart
  if os.getppid() != parent:  # it died before the line above
    os._exit(1)  # pylint: disable=protected-access


def _serve(target: str, fd: int, parent: int) -> None:
  """A worker's loop: jobs in, `(True, result)` or `(False, exception)` out, until None or the parent's end."""
  _die_with_parent(parent)
  module, name = target.split(":")
  function = getattr(importlib.import_module(module), name)
  conn = connection.Connection(fd)
  while True:
    try:
      job = conn.recv()
    except EOFError:  # the parent is gone
      return
    if job is None:
      return
    try:
      conn.send((True, function(job)))
    except Exception as e:  # pylint: disable=broad-except  (the parent raises it)
      try:
        conn.send((False, e))
      except Exception:  # pylint: disable=broad-except  (an exception that does not pickle)
        conn.send((False, RuntimeError(f"{type(e).__name__}: {e}")))


def start(target: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, connection.Connection]:
  """A worker process running `_serve(target)` (`module:function`), `env` added to this process's environment;
  the connection sends it jobs and receives `(ok, result)`. Call from the thread that outlives it: the worker's
  death signal follows the thread that started it."""
  ours, theirs = socket.socketpair()
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where jbert is imported from
  env = {**os.environ, **(env or {}),
         "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
  # process_group=0: its own group, which a terminal's Ctrl-C (sent to the foreground group) never reaches.
  proc = subprocess.Popen([sys.executable, "-m", __name__, target, str(theirs.fileno()), str(os.getpid())],
                          pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, env=env, process_group=0)
  theirs.close()
  return proc, connection.Connection(ours.detach())


def run(function: Callable[[Any], Any], jobs: Sequence[Any], workers: int, done: Callable[[Any], None],
        name: Callable[[Any], str] = str) -> None:
  """`function(job)` (a module-level function) for every job in `workers` processes, `done(result)` in this
  process as each ends. The first exception of a job is raised here, after every worker is stopped; so is an
  interruption."""
  target = f"{function.__module__}:{function.__qualname__}"
  pending, running, procs = list(reversed(jobs)), {}, {}
  try:
    for _ in range(min(workers, len(jobs))):
      proc, conn = start(target)
      procs[conn] = proc
      running[conn] = pending.pop()
      conn.send(running[conn])
    while running:
      for conn in connection.wait(list(running)):
        try:
          ok, result = conn.recv()
        except EOFError:
          status = procs[conn].wait(5)
          raise errors.UserError(f"the worker process for {name(running[conn])} died (exit status {status}; -9 is "
                                 "often the system out of memory); rerun with fewer --workers: the finished work "
                                 "is kept.") from None
        if not ok:
          raise result
        done(result)
        if pending:
          running[conn] = pending.pop()
          conn.send(running[conn])
        else:
          del running[conn]
          conn.send(None)
    for proc in procs.values():
      proc.wait(5)
  finally:
    for proc in procs.values():
      if proc.poll() is None:
        proc.kill()  # a job in progress is redone by the rerun; waiting for it is what Ctrl-C is not for
    for conn, proc in procs.items():
      proc.wait(5)
      conn.close()


if __name__ == "__main__":
  _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
