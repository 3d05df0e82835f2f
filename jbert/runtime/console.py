"""Console hygiene: jbert's own lines on the console, the start-up chatter of JAX, Gloo and libtpu left out.

Each of these is harmless and printed on every run of its kind, so it buries the lines that matter:

* `quiet_library_logs`: JAX logs "Unable to initialize backend 'tpu' ... libtpu.so" at INFO on every CPU host,
  and its distributed-service notices; gcsfs a line per file it opens on gs://; TensorFlow's C++ code (TF1
  checkpoints) logs INFO lines too. Only INFO
  goes: warnings and errors of every library still show.
* `drop_gloo_lines`: Gloo, the CPU collectives of multi-process runs, prints "[Gloo] Rank N is connected to M
  peer ranks. Expected number of connected peer ranks is : M" from C++ straight to stdout for every
  communicator it opens. A filter on file descriptor 1 drops exactly those lines and passes everything else.
* `compile_only_host`: on a host without a TPU, AOT compilation loads libtpu, which asks the TPU VM's
  metadata for the accelerator type and the worker hosts and logs E0000 errors when it finds none. Naming them
  in libtpu's environment variables (this host as the only worker) answers the question; the compiled program
  depends only on the topology passed to the compiler.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import sys
import threading
from typing import Iterator

GLOO_CONNECTED = re.compile(rb"^\[Gloo\] Rank \d+ is connected to \d+ peer ranks")
# TPU generation -> (name in accelerator types, TensorCores per chip as those names count them).
_ACCELERATOR_NAMES = {"v4": ("v4", 2), "v5p": ("v5p", 2), "v5e": ("v5litepod", 1), "v6e": ("v6e", 1)}


def quiet_library_logs() -> None:
  """Hides INFO records of JAX (and TensorFlow's C++ INFO lines); call before JAX starts its backends."""
  logging.getLogger("jax").setLevel(logging.WARNING)
  for name in ("gcsfs", "fsspec"):  # a line per file opened on gs:// (its read-ahead cache)
    logging.getLogger(name).setLevel(logging.WARNING)
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")


class LineFilter:
  """File descriptor `fd` redirected through a pipe to a thread that writes on every line not matching
  `pattern`. Works for native code, which writes to the descriptor and never sees `sys.stdout`.

  `close()` (also run at exit) puts the descriptor back and waits for the lines still in the pipe.
  """

  def __init__(self, pattern: re.Pattern[bytes], fd: int = 1):
    self.pattern, self.fd = pattern, fd
    self.dropped = 0
    if fd == 1:
      sys.stdout.flush()
    self._original = os.dup(fd)
    read_end, write_end = os.pipe()
    os.dup2(write_end, fd)
    os.close(write_end)
    self._thread = threading.Thread(target=self._pump, args=(read_end,), name="jbert-line-filter", daemon=True)
    self._thread.start()
    atexit.register(self.close)

  def _pump(self, read_end: int) -> None:
    with os.fdopen(read_end, "rb") as lines:
      for line in lines:
        if self.pattern.search(line):
          self.dropped += 1
          continue
        try:
          view = memoryview(line)
          while view:
            view = view[os.write(self._original, view):]
        except OSError:
          pass  # the original stdout is gone (a closed pipe); keep draining so writers never block

  def close(self, timeout: float = 2.0) -> None:
    if self._original is None:
      return
    if self.fd == 1:
      sys.stdout.flush()
    os.dup2(self._original, self.fd)  # closes the pipe's write end: the thread reads what is left, then EOF
    self._thread.join(timeout)  # child processes that inherited the pipe may keep it open: do not wait for them
    os.close(self._original)
    self._original = None
    atexit.unregister(self.close)


def drop_gloo_lines() -> LineFilter:
  """Drops Gloo's per-communicator connection lines from stdout; for runs with several CPU processes."""
  return LineFilter(GLOO_CONNECTED, fd=1)


def accelerator_type(generation: str, chips: int) -> str:
  """The accelerator type a TPU VM of `chips` chips reports, e.g. ("v4", 4) -> "v4-8", ("v5e", 4) ->
  "v5litepod-4"."""
  if generation not in _ACCELERATOR_NAMES:
    raise ValueError(f"unknown TPU generation {generation!r}; expected one of {sorted(_ACCELERATOR_NAMES)}.")
  name, cores_per_chip = _ACCELERATOR_NAMES[generation]
  return f"{name}-{chips * cores_per_chip}"


@contextlib.contextmanager
def compile_only_host(generation: str, chips: int) -> Iterator[None]:
  """libtpu's TPU_ACCELERATOR_TYPE and TPU_WORKER_HOSTNAMES (unless set) for a host that only compiles for a TPU
  topology, while libtpu loads in the block; never on a TPU VM, whose own values these would hide. They are taken
  back afterwards: libtpu reads them once, and left in the environment they would make the rest of the process (a
  test run, a notebook) look like a TPU VM to `jbert.distributed`."""
  added = {key: value for key, value in (("TPU_ACCELERATOR_TYPE", accelerator_type(generation, chips)),
                                         ("TPU_WORKER_HOSTNAMES", "localhost")) if key not in os.environ}
  os.environ.update(added)
  try:
    yield
  finally:
    for key in added:
      os.environ.pop(key, None)
