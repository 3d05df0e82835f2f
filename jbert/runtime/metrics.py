"""Training metrics: WORKDIR/metrics.jsonl, TensorBoard events (tensorboardX) and the console lines (progress,
evaluation).

metrics.jsonl holds one JSON object per `write`: {"step": 1200, "train/loss": 6.12, ...}. Local files are
appended to and flushed on every write, so a killed run keeps everything it logged. Remote workdirs
(`gs://...`, through etils.epath) cannot be appended to; the whole file is rewritten on each write.

Resuming: `truncate_after(step)`, called with the step a resumed run restarts from, drops the earlier run's
records with a larger step (they are about to be logged again) and hides its later TensorBoard events
(tensorboardX `purge_step`), so no step appears twice.
"""
from __future__ import annotations

import datetime
import importlib
import json
import os
import threading
import time
from typing import Any, Mapping

import numpy as np

from jbert.runtime import atomic

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


def _is_remote(path: str) -> bool:
  return "://" in path


class _LocalLog:
  """Append-only text file, flushed per line."""

  def __init__(self, path: str):
    self._path = path
    self._file = open(path, "a", encoding="utf-8")

  def append(self, line: str) -> None:
    self._file.write(line + "\n")
    self._file.flush()

  def read(self) -> list[str]:
    with open(self._path, encoding="utf-8") as f:
      return f.read().splitlines()

  def rewrite(self, lines: list[str]) -> None:
    self._file.close()
    with atomic.open_for_write(self._path, encoding="utf-8") as f:  # a crash leaves the old or the new file
      f.writelines(line + "\n" for line in lines)
    self._file = open(self._path, "a", encoding="utf-8")

  def close(self) -> None:
    self._file.close()


class _RemoteLog:
  """Object-store file (no append): kept in memory and rewritten whole."""

  def __init__(self, path: str):
    from etils import epath  # pylint: disable=g-import-not-at-top
    self._path = epath.Path(path)
    self._lines = self._path.read_text().splitlines() if self._path.exists() else []
    self.rewrite(self._lines)

  def append(self, line: str) -> None:
    self._lines.append(line)
    self.rewrite(self._lines)

  def read(self) -> list[str]:
    return list(self._lines)

  def rewrite(self, lines: list[str]) -> None:
    self._lines = list(lines)
    self._path.write_text("".join(line + "\n" for line in self._lines))

  def close(self) -> None:
    pass


def _close_tensorboard(writer, upload: bool = True) -> None:
  """Closes a tensorboardX SummaryWriter. Its gs:// record writer (GCSRecordWriter) uploads the whole events file
  on every close, and closes again when garbage-collected, often at interpreter exit: a second upload of the
  same bytes, which retries for two minutes when the bucket cannot be reached by then. Closed once here, it is
  told not to upload again; with `upload` False (the storage is down) not even once."""
  files = list((writer.all_writers or {}).values())
  record_writers = []
  for file_writer in files:
    events = getattr(getattr(file_writer, "event_writer", None), "_ev_writer", None)
    record_writer = getattr(getattr(events, "_py_recordio_writer", None), "_writer", None)
    if type(record_writer).__name__ == "GCSRecordWriter":
      record_writers.append(record_writer)
  if not upload:
    for record_writer in record_writers:
      record_writer.flush = lambda: None
  writer.close()
  for record_writer in record_writers:
    record_writer.flush = lambda: None


def _tensorboardx_has_gcs() -> bool:
  from tensorboardX import record_writer  # pylint: disable=g-import-not-at-top
  return record_writer.GCS_ENABLED


def _to_python(key: str, value: Any) -> bool | int | float:
  array = np.asarray(value)
  if array.size != 1:
    raise ValueError(f"metric {key!r} has shape {array.shape}; log scalars only (reduce it first).")
  if array.dtype.kind == "b":
    return bool(array)
  if array.dtype.kind in "iu":
    return int(array)
  return float(array)


class MetricWriter:
  """Writes scalars to WORKDIR/metrics.jsonl and WORKDIR/tensorboard/; a no-op when not `enabled`.

  Pass `enabled=jax.process_index() == 0` so that one process writes. Construction fails with a clear error
  when the workdir is not writable, so call it before anything expensive.
  """

  def __init__(self, workdir: str, *, enabled: bool = True):
    self.enabled = enabled
    self.path = os.path.join(os.fspath(workdir), METRICS_FILE)
    self._tb_dir = os.path.join(os.fspath(workdir), TENSORBOARD_DIR)
    self._tb = None  # opened on first write, after truncate_after has chosen its purge step
    self._tb_opened = 0
    self._purge_step = None
    self._log = None
    if not enabled:
      return
    if self.path.startswith("gs://") and not _tensorboardx_has_gcs():
      raise ImportError(
          f"TensorBoard events for {self._tb_dir} need google-cloud-storage (tensorboardX writes gs:// "
          "through it): pip install google-cloud-storage, or use a local --workdir.")
    try:
      if _is_remote(self.path):
        self._log = _RemoteLog(self.path)
      else:
        os.makedirs(self._tb_dir, exist_ok=True)
        self._log = _LocalLog(self.path)
    except (OSError, ImportError) as e:
      raise OSError(
          f"cannot write metrics to {self.path}: {e}. Pass a --workdir this process can create and write "
          "(check the path and its permissions).") from e
    # tensorboardX (and the protobuf it pulls in) takes seconds to import: load it while the first step compiles,
    # not inside the first logged interval, whose rate and ETA it would skew.
    threading.Thread(target=importlib.import_module, args=("tensorboardX",), daemon=True).start()

  def write(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Appends {"step": step, **scalars}; values become Python floats (ints and bools stay so)."""
    if not self.enabled:
      return
    record = {"step": int(step)}
    record.update({k: _to_python(k, v) for k, v in scalars.items()})
    self._log.append(json.dumps(record))
    tb = self._tensorboard()
    for key, value in record.items():
      if key != "step":
        tb.add_scalar(key, float(value), int(step))
    tb.flush()

  def truncate_after(self, step: int) -> None:
    """Drops records with a step > `step` (and unparsable ones, e.g. a line torn by a kill)."""
    if not self.enabled:
      return
    kept = []
    for line in self._log.read():
      try:
        if int(json.loads(line)["step"]) <= step:
          kept.append(line)
      except (ValueError, KeyError, TypeError):
        pass
    self._log.rewrite(kept)
    self._purge_step = step + 1
    if self._tb is not None:  # later events of this writer must be purged too: reopen with the purge step
      _close_tensorboard(self._tb)
      self._tb = None

  def _tensorboard(self):
    if self._tb is None:
      import tensorboardX  # pylint: disable=g-import-not-at-top
      self._tb_opened += 1
      # The suffix keeps two writers opened within one second from sharing a file name.
      self._tb = tensorboardX.SummaryWriter(self._tb_dir, purge_step=self._purge_step,
                                            filename_suffix=f".{os.getpid()}.{self._tb_opened}")
    return self._tb

  def close(self, *, upload: bool = True) -> None:
    """`upload=False`: the storage stopped answering, so the remote events file is not uploaded once more (what
    the last `write` flushed stays; a resume purges and rewrites the steps after its checkpoint)."""
    if self._tb is not None:
      _close_tensorboard(self._tb, upload)
      self._tb = None
    if self._log is not None:
      self._log.close()
      self._log = None
    self.enabled = False

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, *exc) -> None:
    self.close()


# ----------------------------------------------------------------------------------------------------------
# Console lines: training progress and evaluation results.
# ----------------------------------------------------------------------------------------------------------


def _si(x: float) -> str:
  for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
    if abs(x) >= scale:
      return f"{x / scale:.1f}{unit}"
  return f"{x:.1f}"


def _get(scalars: Mapping[str, Any], key: str) -> float | None:
  value = scalars.get(f"train/{key}", scalars.get(key))
  return None if value is None else float(value)


def format_progress(step: int, total_steps: int, scalars: Mapping[str, Any], *,
                    steps_per_sec: float | None = None, eta_s: float | None = None,
                    mfu_label: str | None = None) -> str:
  """E.g. `step 1200/10000 | loss 6.123 | mlm_acc 0.123 | 3.4 steps/s | ETA 0:43:10 | 52.1k tok/s | pad 3.1% |
  MFU 41.2% of measured CPU matmul peak`. Scalars are looked up as `train/<key>` or `<key>`; missing ones are
  left out. Tokens/s and MFU count real tokens; `pad` is the share of the batches' tokens that is padding.
  Every accuracy the task's train step reports follows the loss (`acc` for classification, `start_acc` and
  `end_acc` for SQuAD), so a fine-tuning run shows how it learns, not only its loss.
  """
  parts = [f"step {step}/{total_steps}"]
  names = {k.removeprefix("train/") for k in scalars}
  accuracies = sorted(n for n in names if n.endswith("accuracy") and "/" not in n)
  for key, name, fmt in (("loss", "loss", ".3f"), *((k, k.removesuffix("uracy"), ".3f") for k in accuracies),
                         ("learning_rate", "lr", ".2e")):
    value = _get(scalars, key)
    if value is not None:
      parts.append(f"{name} {value:{fmt}}")
  if steps_per_sec:
    parts.append(f"{steps_per_sec:.3g} steps/s")
  if eta_s is not None:
    parts.append(f"ETA {datetime.timedelta(seconds=round(eta_s))}")
  tokens = _get(scalars, "tokens_per_sec")
  if tokens:
    parts.append(f"{_si(tokens)} tok/s")
  padding = _get(scalars, "padding_fraction")
  if padding is not None:
    parts.append(f"pad {100 * padding:.1f}%")
  mfu = _get(scalars, "mfu")
  if mfu is not None:
    parts.append(f"MFU {100 * mfu:.1f}%" + (f" of {mfu_label}" if mfu_label else ""))
  return " | ".join(parts)


_SHORT_NAMES = {"mlm_accuracy": "mlm_acc", "nsp_accuracy": "nsp_acc"}


def _eval_name(key: str) -> str:
  name = key.removeprefix("eval/")
  head, _, last = name.rpartition("/")
  last = _SHORT_NAMES.get(last, last)
  return f"{head}/{last}" if head else last


def _eval_value(name: str, value: Any) -> str:
  array = np.asarray(value)
  if array.dtype.kind in "biu":
    return str(array.item())
  return f"{float(array):.3f}" if name.endswith("loss") else f"{float(array):.4f}"


def format_eval(step: int, scalars: Mapping[str, Any]) -> str:
  """The console line of an evaluation, e.g. `eval step 1200 | loss 3.210 | mlm_acc 0.4120 | nsp_acc 0.8710`.

  Keys are taken as `eval/<name>` or `<name>` (fine-tuning's `eval/validation_matched/accuracy` reads
  `validation_matched/accuracy`); the overall `loss` comes first, the rest in the given order. Losses get three
  decimals, other metrics (accuracies, F1, correlations) four, integers none.
  """
  names = {_eval_name(k): v for k, v in scalars.items()}
  ordered = sorted(names, key=lambda n: n != "loss")  # stable: only `loss` moves
  return " | ".join([f"eval step {step}", *(f"{n} {_eval_value(n, names[n])}" for n in ordered)])


FIRST_LINE_S = 15.0  # the first progress line by the clock, this long after the first step (compiling) ended
LINE_EVERY_S = 60.0  # then at least this often, whatever log_every_steps says


class Progress:
  """Steps/s over the interval between `update` calls (one per progress line), and the ETA at that rate.

  The first step after start or resume is left out of the rate: its time is mostly compilation (and restoring),
  and counting it made the first ETA after a resume many times too long. The loop calls `start(step)` as soon
  as that step has finished (before any `update`), then `update(step)` at each logged step, and at each step
  for which `due()` says the console has waited long enough: `first_line_s` after `start`, then `line_every_s`
  after the last line. Without `start`, the first interval runs from construction, compilation included.
  Seconds the loop spent waiting for programs compiled in the background (a bucketed run meets a new length)
  are `exclude`d from the interval too: counted, they made a fine-tuning run's first ETA 6 times too long.
  """

  def __init__(self, total_steps: int, start_step: int = 0, clock=time.perf_counter, *,
               first_line_s: float = FIRST_LINE_S, line_every_s: float = LINE_EVERY_S):
    self.total_steps = total_steps
    self._clock = clock
    self._step, self._time = start_step, clock()
    self._excluded = 0.0
    self.steps_per_sec = 0.0
    self.first_line_s, self.line_every_s = first_line_s, line_every_s
    self._lines = 0

  def start(self, step: int) -> float:
    """Starts the clock at `step`, the first step after start or resume, which has just finished; returns the
    seconds since construction (that step's compiling, restoring and running)."""
    now = self._clock()
    elapsed = now - self._time
    self._step, self._time, self._lines, self._excluded = step, now, 0, 0.0
    return elapsed

  def exclude(self, seconds: float) -> None:
    """Leaves `seconds` of the current interval (a wait for a compile) out of its rate."""
    self._excluded += seconds

  def due(self) -> bool:
    """Whether a progress line is owed by the clock (the caller then prints one, calling `update`)."""
    return self._clock() - self._time >= (self.line_every_s if self._lines else self.first_line_s)

  def update(self, step: int) -> float:
    """Marks `step` done now; returns steps/s since `start` or the previous update (0.0 if no time or steps
    passed)."""
    now = self._clock()
    elapsed, steps = now - self._time - self._excluded, step - self._step
    self.steps_per_sec = steps / elapsed if elapsed > 0 and steps > 0 else 0.0
    self._step, self._time, self._excluded = step, now, 0.0
    self._lines += 1
    return self.steps_per_sec

  def eta_s(self, step: int) -> float | None:
    return (self.total_steps - step) / self.steps_per_sec if self.steps_per_sec else None

  def line(self, step: int, scalars: Mapping[str, Any], mfu_label: str | None = None) -> str:
    return format_progress(step, self.total_steps, scalars, steps_per_sec=self.steps_per_sec,
                           eta_s=self.eta_s(step), mfu_label=mfu_label)
