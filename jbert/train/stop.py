"""Preemption and Ctrl-C: the loop finishes the current step, saves a checkpoint and exits; a second SIGTERM only
repeats the request, a second Ctrl-C aborts at once."""
from __future__ import annotations

import logging
import signal

import jax
import numpy as np

log = logging.getLogger("jbert")


class StopRequest:
  """SIGTERM (a TPU VM's preemption notice) or Ctrl-C (SIGINT) asks the loop to stop after the current step.

  The first one is a request (`requested`, `reason`); a second SIGTERM only repeats it, a second Ctrl-C raises
  KeyboardInterrupt at once, which run.py reports in one line (exit status 130). A signal the process was started
  ignoring (SIGINT of a job a non-interactive shell put in the background) stays ignored."""
  NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}

  def __init__(self):
    self.requested = False
    self.reason: str | None = None
    self._previous = {s: signal.signal(s, self._handle) for s in self.NAMES if signal.getsignal(s) != signal.SIG_IGN}

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    if self.requested:
      if signum == signal.SIGINT:
        raise KeyboardInterrupt
      return
    # Marked before the message is written: a second signal can land while it is (and runs this handler again).
    self.requested, self.reason = True, self.NAMES[signum]
    again = "; Ctrl-C again aborts at once" if signum == signal.SIGINT else ""
    log.warning("%s: finishing the current step, saving a checkpoint and exiting%s.", self.NAMES[signum], again)

  def acts_alone(self) -> bool:
    """Whether this process has a request it may act on without the others, between steps too (a single-process
    run; several processes stop together, at a step `agreed` names)."""
    return self.requested and jax.process_count() == 1

  def agreed(self) -> bool:
    """All processes must stop at the same step; any one being asked to is enough."""
    if jax.process_count() == 1:
      return self.requested
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return bool(np.any(multihost_utils.process_allgather(np.array(self.requested))))

  def stopped_message(self, step: int, command: str | None) -> str:
    resume = f"resume with: {command}" if command else "rerun the same command to resume."
    return f"stopped at step {step} after {self.reason or 'a stop request of another process'}; {resume}"

  def restore(self):
    for signum, previous in self._previous.items():
      signal.signal(signum, previous)
