"""A plain-text progress line on stderr: rows done, rate and ETA, redrawn at most twice a second."""
from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

# Set by the inference commands' SIGTERM handler (`jbert.inference.cli`) besides raising KeyboardInterrupt, because
# Python drops an exception a signal handler raises inside a garbage-collector callback (JAX's `_xla_gc_callback`)
# or a `__del__`: it prints "Exception ignored" and the command would carry on and commit its output. Every
# command's loop calls `ProgressLine.update` after each batch, which raises it again.
INTERRUPTED = threading.Event()


def _duration(seconds: float) -> str:
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class ProgressLine:
  """`update(n)` after each batch; `close()` prints the final line. Silent when `enabled` is False."""

  def __init__(self, total: int | None, desc: str = "rows", *, enabled: bool = True, stream: TextIO | None = None,
               interval_s: float = 0.5, clock=time.perf_counter):
    self.total, self.desc, self.enabled = total, desc, enabled
    self.stream = stream or sys.stderr
    self.done = 0
    self._clock, self._interval = clock, interval_s
    self._start = clock()
    self._last_draw = -float("inf")

  def update(self, n: int) -> None:
    if INTERRUPTED.is_set():
      raise KeyboardInterrupt
    self.done += n
    now = self._clock()
    if self.enabled and now - self._last_draw >= self._interval:
      self._last_draw = now
      self.stream.write("\r" + self.line(now))
      self.stream.flush()

  def line(self, now: float | None = None) -> str:
    elapsed = max((self._clock() if now is None else now) - self._start, 1e-9)
    rate = self.done / elapsed
    if self.total:
      eta = (self.total - self.done) / rate if rate > 0 else float("inf")
      eta_text = _duration(eta) if eta != float("inf") else "?"
      return (f"{self.desc}: {self.done:,}/{self.total:,} ({100 * self.done / self.total:.0f}%) "
              f"{rate:,.1f}/s ETA {eta_text}  ")
    return f"{self.desc}: {self.done:,} {rate:,.1f}/s elapsed {_duration(elapsed)}  "

  def close(self) -> None:
    if self.enabled:
      self.stream.write("\r" + self.line() + "\n")
      self.stream.flush()
