"""Tests that need more simulated devices than the suite's process has run in a child pytest that has them.

JAX fixes its device count when it starts, so a process cannot switch between 1 and 8 devices. The suite runs
with one (JBERT_TEST_DEVICES, default 1); a test marked `@pytest.mark.devices(8)` is handed to a child
`python -m pytest` started with 8, together with every other test marked for that many devices (one start-up per
device count, not per file or per test), and reports the child's outcome as its own. Under pytest-xdist the first
worker to reach such a test runs the child under a file lock; the others read the results it left. Run a file with
`JBERT_TEST_DEVICES=8` to debug its mesh tests directly.
"""
from __future__ import annotations

import fcntl
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import pytest

DEVICES = int(os.environ.get("JBERT_TEST_DEVICES", "1"))
_RESULTS = "JBERT_TEST_RESULTS"  # set in a child: where it writes its outcomes
_ROOT = pathlib.Path(__file__).resolve().parents[1]
_outcomes: dict[str, dict] = {}


def xla_flags(devices: int) -> str:
  """XLA_FLAGS for a test process (and the processes it starts) with `devices` simulated CPU devices.

  Compiling dominates the suite's cold time, and most of a compile of these tiny programs is LLVM optimising
  the generated loops: at -O0 a cold fine-tuning run takes about a third less CPU, while its steps (a few dozen
  per test) run somewhat slower. The HLO passes and the matmul library are the same, so every tolerance holds.
  """
  return f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"


def pytest_configure(config):
  config.addinivalue_line("markers", "devices(n): needs n simulated CPU devices (runs in a child pytest that has "
                                     "them when the suite has fewer)")


def _needed(item) -> int:
  marker = item.get_closest_marker("devices")
  return marker.args[0] if marker else 1


def runs_in_child(item) -> bool:
  """Whether the test runs in a child pytest with more simulated devices than this process has."""
  return not os.environ.get(_RESULTS) and _needed(item) > DEVICES


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  if os.environ.get(_RESULTS):
    return
  groups: dict[int, list[str]] = {}
  for item in items:
    if _needed(item) > DEVICES:
      groups.setdefault(_needed(item), []).append(item.nodeid)
  for item in items:
    n = _needed(item)
    if n > DEVICES:
      # No fixtures here: the child sets up its own, and this process must not compile for a mesh it lacks.
      item.setup = lambda: None
      item.runtest = lambda item=item, n=n: _report(item, n, groups[n])
  # First, in a stable order: pytest-xdist hands each worker a first chunk of consecutive tests (worksteal: half of
  # them), so one worker gets them all and starts the child, rather than the other worker waiting on the lock
  # while it runs.
  items.sort(key=lambda item: _needed(item) <= DEVICES)


def _run_dir() -> pathlib.Path:
  # Shared by the xdist workers of one run (same testrunuid), distinct between runs.
  run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
  path = pathlib.Path(tempfile.gettempdir()) / f"jbert-device-children-{run}"
  path.mkdir(exist_ok=True)
  return path


def _child_results(n: int, nodeids) -> dict:
  stem = f"devices-{n}"
  results, log = _run_dir() / f"{stem}.json", _run_dir() / f"{stem}.log"
  with open(_run_dir() / f"{stem}.lock", "w", encoding="utf-8") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not results.exists():
      env = dict(os.environ, JBERT_TEST_DEVICES=str(n), XLA_FLAGS=xla_flags(n),
                 **{_RESULTS: str(results)})
      for name in ("PYTEST_XDIST_WORKER", "PYTEST_XDIST_TESTRUNUID", "PYTEST_XDIST_WORKER_COUNT"):
        env.pop(name, None)
      with open(log, "w", encoding="utf-8") as out:
        subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                        *nodeids], cwd=_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
      if not results.exists():
        results.write_text("{}")
  found = json.loads(results.read_text())
  return found, log


def _report(item, n, nodeids):
  found, log = _child_results(n, nodeids)
  if item.nodeid not in found:
    pytest.fail(f"the {n}-device child pytest reported nothing for this test; its output:\n"
                f"{log.read_text()[-5000:]}", pytrace=False)
  outcome = found[item.nodeid]
  if outcome["outcome"] == "failed":
    pytest.fail(f"in a child pytest with {n} devices ({outcome['when']}):\n{outcome['text']}", pytrace=False)
  if outcome["outcome"] == "skipped":
    pytest.skip(outcome["text"])


def pytest_runtest_logreport(report):
  if not os.environ.get(_RESULTS):
    return
  previous = _outcomes.get(report.nodeid)
  if previous and previous["outcome"] != "passed":
    return  # the first failure or skip of a test is its outcome (a teardown after it adds nothing)
  if report.failed or report.skipped or report.when == "call":
    text = report.longreprtext
    if report.skipped and isinstance(report.longrepr, tuple):
      text = report.longrepr[2]
    _outcomes[report.nodeid] = {"outcome": report.outcome, "when": report.when, "text": text}


def pytest_sessionfinish(session, exitstatus):  # pylint: disable=unused-argument
  if os.environ.get(_RESULTS):
    pathlib.Path(os.environ[_RESULTS]).write_text(json.dumps(_outcomes))
