"""Orbax checkpoints of a training run: train state, per-shard data-iterator state and the configs.

Layout: `WORKDIR/checkpoints/<step>/{state,data,config,bert_config}`. Orbax writes each step into a temporary
directory and renames it when every process has finished, so `latest_step()` never sees a partial checkpoint
(on GCS, a commit marker plays the role of the rename).
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any, Iterable, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

log = logging.getLogger("jbert")


class CheckpointError(RuntimeError):
  """A checkpoint could not be written or does not fit the current run."""


# ----------------------------------------------------------------------------------------------------------
# Data-iterator state: one JSON file per data shard, so that a run restarted with another number of processes
# still finds the state of every shard it now owns.
# ----------------------------------------------------------------------------------------------------------


class DataStateHandler(ocp.CheckpointHandler):
  """Each process writes and reads only the shards it owns."""

  def save(self, directory: epath.Path, args: "DataStateSave"):
    for shard, state in args.states.items():
      (directory / f"shard_{int(shard)}.json").write_text(json.dumps(state))

  def restore(self, directory: epath.Path, args: "DataStateRestore") -> dict[int, Any]:
    states = {}
    for shard in args.shards:
      path = directory / f"shard_{int(shard)}.json"
      if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the checkpoint was written with another data.num_shards.")
      states[int(shard)] = json.loads(path.read_text())
    return states

  def metadata(self, directory: epath.Path):
    return sorted(p.name for p in directory.iterdir())

  def structure(self, directory):  # Required by older Orbax versions.
    del directory

  def finalize(self, directory):
    del directory

  def close(self):
    pass


@ocp.args.register_with_handler(DataStateHandler, for_save=True)
@dataclasses.dataclass
class DataStateSave(ocp.args.CheckpointArgs):
  states: Mapping[int, Any]


@ocp.args.register_with_handler(DataStateHandler, for_restore=True)
@dataclasses.dataclass
class DataStateRestore(ocp.args.CheckpointArgs):
  shards: Iterable[int]


# ----------------------------------------------------------------------------------------------------------
# The run's checkpoint manager.
# ----------------------------------------------------------------------------------------------------------


def _absolute(path: str | os.PathLike) -> epath.Path:
  path = epath.Path(path)
  return path if str(path).startswith(("gs://", "s3://")) else epath.Path(os.path.abspath(path))


def check_writable(directory: str | os.PathLike) -> epath.Path:
  """Creates `directory` and proves it writable, so a bad path fails before any compilation."""
  directory = _absolute(directory)
  try:
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".write_probe_{jax.process_index()}"
    probe.write_text("ok")
    probe.unlink()
  except OSError as e:
    raise CheckpointError(
        f"cannot write checkpoints to {directory}: {e}. Choose a writable --workdir (or free disk space).") from e
  return directory


class Checkpointer:
  """Thin wrapper over `ocp.CheckpointManager` with the jbert items and clear errors."""

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3, async_save: bool = True):
    self.directory = check_writable(directory)
    self._manager = ocp.CheckpointManager(
        self.directory,
        item_handlers={
            "state": ocp.StandardCheckpointHandler(),
            "data": DataStateHandler(),
            "config": ocp.JsonCheckpointHandler(),
            "bert_config": ocp.JsonCheckpointHandler(),
        },
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Mapping[str, Any], *, data_states: Mapping[int, Any] | None,
           config: Mapping[str, Any], bert_config: Mapping[str, Any]) -> None:
    """Starts an (async) save; raises `CheckpointError` if this or the previous save failed."""
    items = {
        "state": ocp.args.StandardSave(state),
        "config": ocp.args.JsonSave(_jsonable(config)),
        "bert_config": ocp.args.JsonSave(dict(bert_config)),
    }
    if data_states is not None:
      items["data"] = DataStateSave(dict(data_states))
    try:
      self._manager.wait_until_finished()
      self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    except Exception as e:  # Orbax wraps OSError in several types; all mean the same to a user.
      raise CheckpointError(
          f"saving the checkpoint of step {step} to {self.directory} failed: {e}. The training state is still "
          "in memory; free disk space or fix the path, then the next save retries.") from e

  def wait(self) -> None:
    try:
      self._manager.wait_until_finished()
    except Exception as e:
      raise CheckpointError(f"finishing a checkpoint in {self.directory} failed: {e}") from e

  def read_json(self, step: int, item: str) -> dict[str, Any]:
    return self._manager.restore(step, args=ocp.args.Composite(**{item: ocp.args.JsonRestore()}))[item]

  def check_compatible(self, step: int, abstract_state: Mapping[str, Any]) -> None:
    """Refuses a checkpoint whose arrays differ from the run's, naming every mismatched weight."""
    saved = _shapes_by_path(self._state_metadata(step))
    wanted = _shapes_by_path(abstract_state)
    problems = [f"{k}: checkpoint {saved[k]} vs run {v}" for k, v in wanted.items() if k in saved and saved[k] != v]
    problems += [f"{k}: missing from checkpoint" for k in wanted if k not in saved]
    problems += [f"{k}: not in this run" for k in saved if k not in wanted]
    if problems:
      shown = "\n  ".join(problems[:20]) + (f"\n  ... and {len(problems) - 20} more" if len(problems) > 20 else "")
      raise CheckpointError(
          f"the checkpoint at {self.directory}/{step} does not match this run's model/optimiser:\n  {shown}\n"
          "Use a fresh --workdir for a different model, or the same config that wrote it.")

  def _state_metadata(self, step: int) -> Any:
    meta = self._manager.item_metadata(step)["state"]
    return getattr(meta, "tree", meta)

  def restore(self, step: int, abstract_state: Mapping[str, Any], *, shards: Iterable[int] | None):
    """Restores the state onto the shardings carried by `abstract_state` (any mesh) and the data states of
    `shards` (None when the checkpoint lacks them, e.g. another `data.num_shards`)."""
    self.check_compatible(step, abstract_state)
    state = self._manager.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state)))["state"]
    data_states = None
    if shards is not None:
      try:
        data_states = self._manager.restore(
            step, args=ocp.args.Composite(data=DataStateRestore(list(shards))))["data"]
      except (FileNotFoundError, KeyError, ValueError) as e:
        log.warning("checkpoint %d: no data-iterator state for shards %s (%s); the data stream restarts.",
                    step, list(shards), e)
    return state, data_states

  def close(self) -> None:
    self._manager.close()


def _shapes_by_path(tree: Any) -> dict[str, tuple[int, ...]]:
  """{"opt_state/0/mu/bert/...": shape}: Orbax metadata stores namedtuples as dicts and tuples as lists, so
  paths are compared by their plain names."""
  def name(key):
    for attr in ("key", "idx", "name"):
      if hasattr(key, attr):
        return str(getattr(key, attr))
    return str(key)
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
  return {"/".join(name(k) for k in path): tuple(leaf.shape) for path, leaf in leaves if hasattr(leaf, "shape")}


def _jsonable(tree: Any) -> Any:
  if isinstance(tree, Mapping):
    return {str(k): _jsonable(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [_jsonable(v) for v in tree]
  if isinstance(tree, (np.integer, np.floating)):
    return tree.item()
  return tree


# ----------------------------------------------------------------------------------------------------------
# Parameters only, for `jbert.load_pretrained` on a training workdir.
# ----------------------------------------------------------------------------------------------------------


def find_checkpoint_dir(path: str | os.PathLike) -> epath.Path | None:
  """`path` itself or `path/checkpoints` if it holds Orbax steps with a `state` item; else None."""
  path = _absolute(path)
  for candidate in (path / "checkpoints", path):
    if candidate.is_dir() and any(p.name.isdigit() and (p / "state").exists() for p in candidate.iterdir()):
      return candidate
  return None


def restore_params(path: str | os.PathLike, step: int | None = None) -> tuple[dict[str, Any], Any]:
  """(BertConfig dict, params as numpy) of a training checkpoint; `step` defaults to the latest."""
  directory = find_checkpoint_dir(path)
  if directory is None:
    raise FileNotFoundError(f"no jbert training checkpoint (a numbered step with a 'state' item) under {path}.")
  ckpt = Checkpointer(directory, max_to_keep=None, async_save=False)
  try:
    step = ckpt.latest_step() if step is None else step
    bert_config = ckpt.read_json(step, "bert_config")
    meta_tree = ckpt._state_metadata(step)  # pylint: disable=protected-access
  finally:
    ckpt.close()
  # Only the parameters, as host numpy arrays: no optimiser state is read and no device memory is used.
  target = jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), {"params": meta_tree["params"]})
  restored = ocp.PyTreeCheckpointer().restore(
      directory / str(step) / "state",
      args=ocp.args.PyTreeRestore(
          item=target, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target),
          partial_restore=True))
  return bert_config, restored["params"]


def read_model_config(path: str | os.PathLike, step: int | None = None) -> dict[str, Any]:
  """The model description (BertConfig fields, `architectures`, labels) a training checkpoint records."""
  directory = find_checkpoint_dir(path)
  if directory is None:
    raise FileNotFoundError(f"no jbert training checkpoint (a numbered step with a 'state' item) under {path}.")
  ckpt = Checkpointer(directory, max_to_keep=None, async_save=False)
  try:
    return ckpt.read_json(ckpt.latest_step() if step is None else step, "bert_config")
  finally:
    ckpt.close()
