"""Keeping the best parameters by an evaluation metric (`keep_best`), as transformers' `load_best_model_at_end`.

At each evaluation whose metric improves on the best so far, the parameters are written to WORKDIR/best/ (a model
directory as export/ is: transformers' format, label names, tokenizer) with `best.json` (metric, mode, value, step)
beside them; a resumed run reads that record and goes on comparing against it. The end of the run evaluates,
predicts and exports these parameters instead of the last step's. A new best is written to `best.tmp/` and swapped
in by renames, so a kill leaves the old one whole. In a bucket (no renames) `best.tmp/` is uploaded whole, then
copied over `best/` inside the store, `best.json` last: a kill during that copy leaves `best/` without its record
and `best.tmp/` complete, and the next start finishes the copy (`recover`).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import shutil
import tempfile
from typing import Any

import jax
from etils import epath

from jbert.runtime import mirror
from jbert.runtime import storage
from jbert.train import evaluation

log = logging.getLogger("jbert")

BEST_DIR = "best"
RECORD = "best.json"
MODES = ("max", "min")
# Metrics that are better lower when keep_best_mode is None; every other metric is better higher.
_LOWER_IS_BETTER = ("loss", "error", "mse", "perplexity")


def infer_mode(metric: str) -> str:
  name = metric.rsplit("/", 1)[-1]
  return "min" if any(word in name for word in _LOWER_IS_BETTER) else "max"


@dataclasses.dataclass
class BestKeeper:
  """The best evaluation so far of one run and where its parameters live.

  Attributes:
    directory: WORKDIR/best.
    metric: the evaluation metric as logged without `eval/` (`accuracy`; `validation_matched/accuracy` when a
      task has several evaluation splits).
    mode: "max" or "min".
    value, step: the best value and its step; None before the first evaluation.
  """
  directory: str
  metric: str
  mode: str
  value: float | None = None
  step: int | None = None

  @classmethod
  def from_config(cls, config, workdir: str) -> "BestKeeper | None":
    """None when `keep_best` is off; else the keeper, with the record of an earlier run of this workdir. Reads
    only: call `recover` once the workdir is locked."""
    metric = config.get("keep_best")
    if not metric:
      return None
    mode = config.get("keep_best_mode") or infer_mode(metric)
    keeper = cls(os.path.join(workdir, BEST_DIR), metric.removeprefix("eval/"), mode)
    # A kill between the two renames of `save` leaves the last complete best in best.old (in a bucket: during
    # the copy, in best.tmp).
    spare = f"{keeper.directory}.{'tmp' if storage.is_remote(workdir) else 'old'}"
    for directory in (keeper.directory, spare):
      path = epath.Path(directory) / RECORD
      if path.is_file():
        try:
          record = json.loads(path.read_text(encoding="utf-8"))
          record = {k: record[k] for k in ("metric", "mode", "value", "step")}
        except (ValueError, KeyError, TypeError) as e:
          raise ValueError(f"{path} cannot be read ({e!r}); remove {directory} to start keeping the best anew "
                           "(the run then keeps the best of the evaluations still to come).") from None
        if (record["metric"], record["mode"]) != (keeper.metric, keeper.mode):
          raise ValueError(f"{path} keeps the best by {record['metric']} ({record['mode']}), but this run asks for "
                           f"keep_best={keeper.metric} ({keeper.mode}); set --config.keep_best={record['metric']}, "
                           f"or remove {keeper.directory} to start keeping anew.")
        keeper.value, keeper.step = record["value"], record["step"]
        break
    return keeper

  @staticmethod
  def check_config(config, task, shards) -> None:
    """Refuses, before anything is written, settings that cannot keep a best."""
    metric, mode = config.get("keep_best"), config.get("keep_best_mode")
    if mode is not None and mode not in MODES:
      raise ValueError(f"keep_best_mode={mode!r} must be one of {list(MODES)} (or None: min for losses, max "
                       "otherwise).")
    if not metric:
      return
    if not task.exports:
      raise ValueError(f"keep_best={metric!r}: task {task.name} exports no model; keep_best is for fine-tuning.")
    if not any(s.labelled for s in task.eval_sets(shards)):
      raise ValueError(f"keep_best={metric!r} needs a labelled evaluation split; set --config.task.eval_file to "
                       "a file with labels, or --config.keep_best=None.")

  def improves(self, scalars: dict[str, float]) -> bool:
    """Whether this evaluation's `eval/<metric>` beats the best so far (ties keep the earlier step)."""
    key = f"eval/{self.metric}"
    if key not in scalars:
      names = sorted(k.removeprefix("eval/") for k in scalars)
      raise ValueError(f"keep_best={self.metric!r} is not an evaluation metric of this task; it logs {names}. "
                       "Set --config.keep_best to one of them.")
    value = float(scalars[key])
    if not math.isfinite(value):
      return False
    return self.value is None or (value > self.value if self.mode == "max" else value < self.value)

  def update(self, step: int, scalars: dict[str, float], params, run) -> bool:
    """Keeps `params` (global arrays, on every process) when this evaluation improves; whether it did."""
    if not self.improves(scalars):
      return False
    host = evaluation.to_host(params)  # every process takes part in the gather

    def write(directory):
      run.task.export(run.bert_config, host, directory, run.tokenizer)
    self.save(step, float(scalars[f"eval/{self.metric}"]), write if jax.process_index() == 0 else None)
    return True

  def load(self, run, shardings):
    """The kept parameters, laid out by `shardings` (the state's params shardings)."""
    return jax.device_put(run.task.load_export(self.directory, run.bert_config), shardings)

  def save(self, step: int, value: float, write_params=None) -> None:
    """Records (step, value); `write_params(directory)` writes the parameters (a model directory that
    `jbert.load_pretrained` reads) on the process that writes files, None on the others."""
    if write_params is None:
      self.value, self.step = value, step
      return
    tmp, old = f"{self.directory}.tmp", f"{self.directory}.old"
    record = {"metric": self.metric, "mode": self.mode, "value": value, "step": step}
    if storage.is_remote(self.directory):
      with tempfile.TemporaryDirectory(prefix="jbert-best-") as local:
        write_params(local)
        with open(os.path.join(local, RECORD), "w", encoding="utf-8") as f:
          json.dump(record, f, indent=2)
        mirror.publish_folder(local, self.directory, tmp, last=(RECORD,))
    else:
      shutil.rmtree(tmp, ignore_errors=True)
      write_params(tmp)
      with open(os.path.join(tmp, RECORD), "w", encoding="utf-8") as f:
        json.dump(record, f, indent=2)
      if os.path.isdir(self.directory):
        shutil.rmtree(old, ignore_errors=True)
        os.replace(self.directory, old)
      os.replace(tmp, self.directory)
      shutil.rmtree(old, ignore_errors=True)
    self.value, self.step = value, step
    log.info("best %s %.4f at step %d: parameters kept in %s", self.metric, value, step, self.directory)

  def recover(self) -> None:
    """Undoes what a kill during `save` left (by the process that writes files, holding the workdir's lock):
    `best.old` is the last complete best when `best` is gone; `best.tmp` is an unfinished one."""
    tmp, old = f"{self.directory}.tmp", f"{self.directory}.old"
    if storage.is_remote(self.directory):
      mirror.recover_folder(self.directory, tmp, RECORD)
      return
    if not os.path.isdir(self.directory) and os.path.isdir(old):
      os.replace(old, self.directory)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(tmp, ignore_errors=True)

  def record(self) -> dict[str, Any]:
    return {"metric": self.metric, "mode": self.mode, "value": self.value, "step": self.step}
