"""Programs compiled ahead in worker threads (jbert/runtime/ahead.py): a call runs the program compiled for its
key with the caller's context, computes what the jitted function computes, and a key never submitted falls back
to the jitted function. A wait counts only the time the devices idle. A stop gives up a wait for a compile at once, and no compile holds the process's exit.
(A real run.py stopped while it compiles: tests/test_stop.py.)"""
import contextlib
import subprocess
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jbert.runtime import ahead


def test_calls_run_the_programs_compiled_ahead_in_workers_with_the_callers_context():
  jitted = jax.jit(lambda x: jnp.cumsum(x) * 2)
  entered = []

  @contextlib.contextmanager
  def context():
    entered.append(threading.current_thread().name)
    yield

  pool = ahead.pool()
  fn = ahead.Ahead(jitted, lambda x: x.shape, context, pool)
  for n in (4, 8):
    fn.submit((n,), jax.ShapeDtypeStruct((n,), jnp.float32))
  # Arguments known only from another program (as the update's are from the gradient's outputs).
  fn.submit_lazy((3,), lambda: (jax.ShapeDtypeStruct((3,), fn.program((4,)).out_info.dtype),))
  for n in (4, 8, 3):
    x = np.arange(n, dtype=np.float32)
    np.testing.assert_array_equal(fn(x), np.cumsum(x) * 2)
  assert jitted._cache_size() == 0  # every call ran a program compiled ahead
  assert len(entered) == 3 and all(name.startswith("jbert-compile") for name in entered)
  np.testing.assert_array_equal(fn(np.ones(5, np.float32)), np.arange(1, 6) * 2)  # never submitted: the jit
  assert jitted._cache_size() == 1
  pool.shutdown()


def test_a_program_that_fails_to_compile_raises_in_the_caller():
  pool = ahead.pool()
  fn = ahead.Ahead(jax.jit(lambda x: x @ x), lambda x: x.shape, contextlib.nullcontext, pool)
  fn.submit((2, 3), jax.ShapeDtypeStruct((2, 3), jnp.float32))  # [2, 3] @ [2, 3]: no such product
  with pytest.raises(TypeError, match="dot_general"):
    fn(np.ones((2, 3), np.float32))
  pool.shutdown()


def test_a_wait_for_a_compile_is_abandoned_as_soon_as_the_run_stops():
  stopping, release = threading.Event(), threading.Event()
  pool = ahead.pool(interrupted=stopping.is_set)
  fn = ahead.Ahead(jax.jit(lambda x: x + 1), lambda x: x.shape, contextlib.nullcontext, pool)
  fn.submit((4,), jax.ShapeDtypeStruct((4,), jnp.float32))
  np.testing.assert_array_equal(fn(np.zeros(4, np.float32)), np.ones(4))
  fn.submit_lazy((3,), lambda: release.wait() and (jax.ShapeDtypeStruct((3,), jnp.float32),))  # compiles forever
  pool.submit(release.wait)  # the other worker busy too
  queued = pool.submit(time.sleep, 0)  # behind both: never started while they run
  threading.Timer(0.3, stopping.set).start()
  start = time.monotonic()
  with pytest.raises(ahead.Abandoned):
    fn(np.zeros(3, np.float32))
  # The compile never ends: leaving within a second of the stop is leaving at once, on a loaded host too.
  assert 0.3 <= time.monotonic() - start < 1.5
  assert 0.3 <= pool.waited() < 1.5 and pool.waited() == 0.0  # the wait, for the step rate; then reset
  assert ahead.compiling() and pool.busy()
  np.testing.assert_array_equal(fn(np.zeros(4, np.float32)), np.ones(4))  # a ready program still runs
  pool.shutdown()
  assert queued.cancelled()
  release.set()
  deadline = time.monotonic() + 10
  while pool.busy() and time.monotonic() < deadline:
    time.sleep(0.01)
  assert not ahead.compiling()


def test_a_wait_for_a_compile_counts_only_the_idle_time_after_the_steps_dispatched_before(monkeypatch):
  """The trainer leaves `Pool.waited` out of its step rate: the steps still running on the devices when the loop
  meets a program still compiling are waited for first, so their time is not left out with the wait (which made
  the rate, and MFU, count steps in less time than they took). A ready program waits for nothing."""
  release = threading.Event()
  pool = ahead.pool()
  fn = ahead.Ahead(jax.jit(lambda x: x + 1), lambda x: x.shape, contextlib.nullcontext, pool)
  fn.submit((4,), jax.ShapeDtypeStruct((4,), jnp.float32))
  np.testing.assert_array_equal(fn(np.zeros(4, np.float32)), np.ones(4))
  pool.waited()  # that first call may have waited for the compile
  blocked = []

  def steps_before_finish(args):  # the devices still run 0.4 s of earlier steps
    blocked.append(args)
    time.sleep(0.4)
    return args

  monkeypatch.setattr(jax, "block_until_ready", steps_before_finish)
  np.testing.assert_array_equal(fn(np.zeros(4, np.float32)), np.ones(4))
  assert not blocked and pool.waited() == 0.0  # ready: no wait, nothing blocked
  fn.submit_lazy((3,), lambda: release.wait() and (jax.ShapeDtypeStruct((3,), jnp.float32),))
  threading.Timer(0.6, release.set).start()  # the compile ends 0.6 s after the call
  start = time.monotonic()
  np.testing.assert_array_equal(fn(np.zeros(3, np.float32)), np.ones(3))
  assert time.monotonic() - start >= 0.6 and len(blocked) == 1
  assert 0.1 <= pool.waited() <= 0.5  # ~0.2 s idle: the 0.4 s of earlier steps stay in the rate
  pool.shutdown()


EXIT = """
import sys, threading, time
from jbert.runtime import ahead
pool = ahead.pool()
started = threading.Event()
pool.submit(lambda: started.set() or time.sleep(60))  # a compile the process no longer needs
started.wait()
print("leaving", flush=True)
{leave}
"""


@pytest.mark.parametrize("leave, status", [("", 0), ("ahead.leave(3)", 3), ("ahead.leave('a bug')", 1)])
def test_a_compile_still_running_does_not_hold_the_exit(leave, status):
  """concurrent.futures' workers would be joined at exit (60 s here); these are not, and `leave` exits at once
  with the status."""
  start = time.monotonic()
  done = subprocess.run([sys.executable, "-c", EXIT.format(leave=leave)], capture_output=True, text=True, timeout=30)
  assert time.monotonic() - start < 5
  assert (done.returncode, done.stdout) == (status, "leaving\n"), done.stderr
  assert done.stderr == ("a bug\n" if status == 1 else "")
