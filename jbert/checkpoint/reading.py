"""Reading a training workdir's checkpoints without training: parameters and the model description, for
`jbert.load_pretrained`, `jbert.predict`, `jbert.convert` and the config-drift check. Nothing is created or written:
a read-only workdir serves as well as a live one."""
from __future__ import annotations

import logging
import os
from typing import Any

from etils import epath

from jbert.checkpoint.manager import Checkpointer, CheckpointError, absolute, DamagedStep

log = logging.getLogger("jbert")

class _ReadOnlyNotice(logging.Filter):
  """Orbax's `Given directory is read only=DIR`, which it logs for every reader: true, and no news to the user of
  `jbert.predict` or `load_pretrained`."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Given directory is read only")


def open_for_reading(directory: str | os.PathLike) -> Checkpointer:
  """A Checkpointer that only reads `directory` (no write probe, nothing created); close it after use."""
  absl = logging.getLogger("absl")
  notice = _ReadOnlyNotice()
  absl.addFilter(notice)
  try:
    return Checkpointer(directory, max_to_keep=None, async_save=False, read_only=True)
  finally:
    absl.removeFilter(notice)


def find_checkpoint_dir(path: str | os.PathLike) -> epath.Path | None:
  """`path` itself or `path/checkpoints` if it holds Orbax steps with a `state` item; else None."""
  path = absolute(path)
  for candidate in (path / "checkpoints", path):
    if candidate.is_dir() and any(p.name.isdigit() and (p / "state").exists() for p in candidate.iterdir()):
      return candidate
  return None


def restore_params(path: str | os.PathLike, step: int | None = None) -> tuple[dict[str, Any], Any]:
  """(BertConfig dict, params as numpy) of a training checkpoint: `step`, or the newest step whose parameters
  read back intact (a damaged newer step is named in a warning)."""
  directory = find_checkpoint_dir(path)
  if directory is None:
    raise FileNotFoundError(f"no jbert training checkpoint (a numbered step with a 'state' item) under {path}.")
  ckpt = open_for_reading(directory)
  damaged = {}
  try:
    for candidate in [step] if step is not None else sorted(ckpt.all_steps(), reverse=True):
      try:
        return ckpt.read_json(candidate, "bert_config"), ckpt.restore_params(candidate)
      except (DamagedStep, CheckpointError) as e:
        damaged[candidate] = str(e)
        log.warning("checkpoint step %d in %s: its parameters cannot be used: %s.", candidate, directory, e)
  finally:
    ckpt.close()
  listing = "\n  ".join(f"step {s}: {p}" for s, p in damaged.items())
  raise CheckpointError(f"no checkpoint in {directory} has readable parameters:\n  {listing}")


def read_model_config(path: str | os.PathLike, step: int | None = None) -> dict[str, Any]:
  """The model description (BertConfig fields, `architectures`, labels) a training checkpoint records."""
  directory = find_checkpoint_dir(path)
  if directory is None:
    raise FileNotFoundError(f"no jbert training checkpoint (a numbered step with a 'state' item) under {path}.")
  ckpt = open_for_reading(directory)
  try:
    return ckpt.read_json(ckpt.latest_step() if step is None else step, "bert_config")
  finally:
    ckpt.close()
