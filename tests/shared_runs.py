"""Expensive fixture results built once per test run, whichever pytest-xdist worker asks first.

A module-scoped fixture is built once per worker that runs one of its tests, and `-n 2` spreads a module's tests
over both workers, so a fine-tuning run or a reference pretraining run was often made twice. `once` builds it
under a file lock in the directory all the workers of a run share (the xdist way to share a session fixture);
the other workers read the pickled result. What it returns must not be changed by the tests (copy a workdir
before training on it).
"""
from __future__ import annotations

import fcntl
import os
import pickle
from typing import Any, Callable


def once(tmp_path_factory, name: str, build: Callable[[Any], Any]) -> Any:
  """build(directory) once per test run for `name`; every caller gets its (pickled) result."""
  root = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    root = root.parent  # the controller's basetemp, shared by every worker of this run
  directory = root / "shared" / name
  directory.parent.mkdir(parents=True, exist_ok=True)
  result = directory.parent / f"{name}.pickle"
  with open(directory.parent / f"{name}.lock", "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not result.exists():
      directory.mkdir()
      value = build(directory)
      result.write_bytes(pickle.dumps(value))
  return pickle.loads(result.read_bytes())
