r"""`python -m jbert.embed` with its phases timed: the command itself (its `main`, its flags), run under timers.

  python bench/embed_phases.py --phases_json=PATH [jbert.embed's flags]

PATH gets one JSON object: wall seconds of each phase (`imports`: jbert.embed and what it imports; `model`: the
Embedder, i.e. the folder resolved, its weights read and placed on the devices; `tokenize`; `trace`: tracing and
lowering the Runner's function; `programs`: compiling, or loading from the compile cache or as stored programs;
`run`: dispatching the batches and fetching their outputs; `other`: the rest of `main`, reading and writing
included), `process_s` (from the interpreter's start, as the OS counts it, to the end of `main`), the CPU
seconds of the process to then, and how many programs were traced (`traced`) and loaded as stored programs
(`stored`). bench/startup.py times the command's exit around it.
"""
from __future__ import annotations

import json
import os
import sys
import time

_T0 = time.perf_counter()

import jbert.embed as command  # noqa: E402  (timed: the imports are a phase)
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from jbert.inference import embedding, runner  # noqa: E402
from jbert.runtime import stored_programs  # noqa: E402

_IMPORTS = time.perf_counter() - _T0
_PHASES_JSON = flags.DEFINE_string("phases_json", None, "Where the phases' JSON is written.")
_wall: dict[str, float] = {}
_counts = {"traced": 0, "stored": 0}


def _add(name: str, seconds: float) -> None:
  _wall[name] = _wall.get(name, 0.0) + seconds


def _timed(owner, attribute: str, phase: str, count: str | None = None) -> None:
  original = getattr(owner, attribute)

  def timed(*args, **kwargs):
    start = time.perf_counter()
    try:
      result = original(*args, **kwargs)
    finally:
      _add(phase, time.perf_counter() - start)
    if count and result is not None:
      _counts[count] += 1
    return result

  setattr(owner, attribute, timed)


class _TimedJit:
  """The Runner's jitted function, its `lower` (tracing and lowering) timed."""

  def __init__(self, jitted):
    self._jitted = jitted

  def lower(self, *args):
    start = time.perf_counter()
    try:
      return self._jitted.lower(*args)
    finally:
      _add("trace", time.perf_counter() - start)
      _counts["traced"] += 1


def _instrument() -> None:
  _timed(embedding, "Embedder", "model")
  _timed(embedding, "encode_records", "tokenize")
  _timed(stored_programs, "program_key", "programs")
  _timed(stored_programs, "load", "programs", count="stored")
  _timed(stored_programs, "compile_and_store", "programs")
  _timed(runner.Runner, "_collect", "run")
  init = runner.Runner.__init__

  def runner_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self._jitted = _TimedJit(self._jitted)  # pylint: disable=protected-access

  runner.Runner.__init__ = runner_init
  executable = runner.Runner._executable  # pylint: disable=protected-access

  def timed_executable(self, batch):
    exe = executable(self, batch)

    def call(*args):
      start = time.perf_counter()
      try:
        return exe(*args)
      finally:
        _add("run", time.perf_counter() - start)

    return call

  runner.Runner._executable = timed_executable  # pylint: disable=protected-access
  command.Embedder = embedding.Embedder


def _process_seconds() -> float:
  """Seconds since the OS started this process (its start time in /proc, in clock ticks since boot)."""
  with open(f"/proc/{os.getpid()}/stat", encoding="ascii") as f:
    started = int(f.read().rsplit(")", 1)[1].split()[19]) / os.sysconf("SC_CLK_TCK")
  with open("/proc/uptime", encoding="ascii") as f:
    return float(f.read().split()[0]) - started


def main(argv):
  start = time.perf_counter()
  try:
    command.main(argv)
  finally:
    total = time.perf_counter() - start
    phases = {"imports": _IMPORTS, **{k: _wall.get(k, 0.0) for k in ("model", "tokenize", "programs", "trace", "run")}}
    phases["other"] = total - sum(v for k, v in _wall.items())
    usage = os.times()
    report = {"phases_s": {k: round(v, 3) for k, v in phases.items()}, "process_s": round(_process_seconds(), 2),
              "cpu_s": round(usage.user + usage.system, 3), **_counts}
    if _PHASES_JSON.value:
      with open(_PHASES_JSON.value, "w", encoding="utf-8") as f:
        json.dump(report, f)


if __name__ == "__main__":
  _instrument()
  sys.argv[0] = "jbert.embed"
  app.run(main)
