"""A run preempted in this process: SIGTERM (what a TPU VM gets before preemption) once a file appears.

The kill -9 path needs its own process and is tested once per trainer path (tests/test_resume.py for
pretraining, tests/tasks/test_finetune_durability.py for fine-tuning); the other tasks' exact resume (their own
data-stream state, outputs and dropout) is checked here without starting an interpreter per run.
"""
import os
import pathlib
import signal
import threading
import time
from typing import Callable

from jbert.train import trainer as train


def train_until_sigterm(config, workdir, when: pathlib.Path | Callable[[], bool], timeout: float = 300.0):
  """train_and_evaluate(config, workdir) sent SIGTERM once `when` exists (or `when()` is true); returns when the
  run has stopped."""
  # A signal that lands after the run restored its handlers meets this no-op, not the default (which would end
  # the test process).
  previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
  done, sent = threading.Event(), threading.Event()

  def watch():
    start = time.time()
    while not done.is_set() and time.time() - start < timeout:
      if when() if callable(when) else when.exists():
        os.kill(os.getpid(), signal.SIGTERM)
        sent.set()
        return
      time.sleep(0.01)

  watcher = threading.Thread(target=watch, daemon=True)
  watcher.start()
  try:
    train.train_and_evaluate(config, str(workdir))
  finally:
    done.set()
    watcher.join()
    signal.signal(signal.SIGTERM, previous)
  assert sent.is_set(), f"{when} never appeared while the run trained"
