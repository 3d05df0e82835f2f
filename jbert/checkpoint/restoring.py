"""The restoring half of `jbert.checkpoint.manager.Checkpointer`: a step read back onto any mesh, checked against
the fingerprints saved with it; the newest step that restores completely found, damaged newer steps named and moved
aside (never deleted).
"""
from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from jbert.checkpoint import data_state as checkpoint_data
from jbert.checkpoint import integrity
from jbert.checkpoint.writable import CheckpointError

log = logging.getLogger("jbert")

DAMAGED_SUFFIX = ".damaged"  # a damaged step moved aside: not a number, so Orbax and jbert never list it


class DamagedStep(Exception):
  """A step that cannot be restored; the message names the file (or array) and what is wrong."""


class Restoring:
  """What `Checkpointer` reads: `directory`, `_manager` (an `ocp.CheckpointManager` with the jbert items),
  `_num_shards` and `_complete` (the newest step known complete, which a resume sets) are the checkpointer's."""
  directory: epath.Path
  _manager: ocp.CheckpointManager
  _num_shards: int | None
  _complete: int | None

  def read_json(self, step: int, item: str) -> dict[str, Any]:
    try:
      return self._manager.restore(step, args=ocp.args.Composite(**{item: ocp.args.JsonRestore()}))[item]
    except Exception as e:  # pylint: disable=broad-except
      raise CheckpointError(f"checkpoint step {step} in {self.directory}: {item} cannot be read: "
                            f"{integrity.describe(e, self.directory / str(step))}.") from e

  def _check_compatible(self, step: int, metadata: Any, abstract_state: Mapping[str, Any]) -> None:
    saved = _shapes_by_path(metadata)
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
    `shards` (None when the checkpoint was written with another `data.num_shards`). A damaged step raises a
    `CheckpointError` naming the file or array."""
    state, problem = self._restore_state(step, abstract_state)
    data_states = None
    if problem is None:
      data_states, problem = self._restore_data(step, shards)
    if problem is not None:
      raise CheckpointError(f"checkpoint step {step} in {self.directory} is damaged: {problem}.")
    return state, data_states

  def restore_latest_intact(self, abstract_state: Mapping[str, Any], *, shards: Iterable[int] | None,
                            data_restart_ok: bool = False) -> tuple[int, Any, Any] | None:
    """(step, state, data states or None) of the newest step that restores completely; None without checkpoints.

    A damaged step (a missing or truncated file, an array that differs from its fingerprint, an unreadable
    data-iterator state) is named in a warning and the next older one is tried; the damaged steps newer than
    the one restored are moved to `<step>.damaged` so that the run can write those steps again. With
    `data_restart_ok`, a step whose only damage is its data-iterator state is restored with the data stream
    restarted instead. A checkpoint of another model still raises (`_check_compatible`); so does a workdir
    where no step is intact, listing what is wrong with each.
    """
    shards = None if shards is None else list(shards)
    damaged: dict[int, str] = {}
    data_only = []
    for step in sorted(self.all_steps(), reverse=True):
      state, problem = self._restore_state(step, abstract_state)
      data_states = None
      if problem is None:
        data_states, data_problem = self._restore_data(step, shards)
        if data_problem is not None and not data_restart_ok:
          problem = data_problem
          data_only.append(step)
        elif data_problem is not None:
          log.warning("checkpoint step %d: %s; data_restart_ok is set, so it resumes with the data stream "
                      "restarted from its beginning (batches already trained on come again).", step, data_problem)
      if not _everywhere(problem is None):
        damaged[step] = problem or "damaged on another process (see its log)"
        log.warning("checkpoint step %d in %s is damaged: %s.", step, self.directory, damaged[step])
        continue
      self._set_aside([s for s in damaged if s > step])
      self._complete = step
      if damaged:
        log.warning("resuming from step %d, the newest intact checkpoint: the steps after it are trained again, "
                    "with the same data and results as before.", step)
      return step, state, data_states
    if not damaged:
      return None
    listing = "\n  ".join(f"step {s}: {p}" for s, p in damaged.items())
    hint = (" A step whose only damage is its data-iterator state can resume with the data stream restarted from "
            "its beginning: set --config.allow_data_restart=true." if data_only else "")
    raise CheckpointError(
        f"no checkpoint in {self.directory} can be restored; nothing was deleted:\n  {listing}\n"
        f"Restore the damaged files from a copy, or move the checkpoints directory away to start afresh.{hint}")

  def _restore_state(self, step: int, abstract_state: Mapping[str, Any]) -> tuple[Any, str | None]:
    """(state, None) or (None, what is damaged). Every process takes part: the fingerprints are a collective,
    computed only once all processes have read their part."""
    state, saved, problem = None, None, None
    try:
      step_dir = self._step_dir_with_files(step)
      try:
        metadata = self._state_metadata(step)
      except Exception as e:  # pylint: disable=broad-except
        raise DamagedStep(integrity.describe(e, step_dir)) from e
      self._check_compatible(step, metadata, abstract_state)
      try:
        state = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state)))["state"]
        saved = self._fingerprints(step)
      except Exception as e:  # pylint: disable=broad-except
        raise DamagedStep(integrity.describe(e, step_dir)) from e
    except DamagedStep as e:
      problem = str(e)
    if not _everywhere(problem is None):
      return None, problem or "damaged on another process (see its log)"
    try:
      self._check_fingerprints(saved, state)
    except DamagedStep as e:
      return None, str(e)
    return state, None

  def restore_params(self, step: int) -> Any:
    """The parameters of `step` as host numpy arrays, checked like a resume; no optimiser state is read and no
    device memory is used."""
    step_dir = self._step_dir_with_files(step)
    try:
      meta_tree = self._state_metadata(step)
      target = jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), {"params": meta_tree["params"]})
      restored = ocp.PyTreeCheckpointer().restore(
          step_dir / "state",
          args=ocp.args.PyTreeRestore(
              item=target, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), target),
              partial_restore=True))
      saved = self._fingerprints(step)
    except Exception as e:  # pylint: disable=broad-except
      raise DamagedStep(integrity.describe(e, step_dir)) from e
    self._check_fingerprints(saved, restored)
    return restored["params"]

  def _step_dir_with_files(self, step: int) -> epath.Path:
    step_dir = self.directory / str(step)
    missing = integrity.missing_files(step_dir)
    if missing:
      raise DamagedStep(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} missing")
    return step_dir

  def _fingerprints(self, step: int) -> dict[str, int] | None:
    if not (self.directory / str(step) / "fingerprints").exists():
      return None  # Written before fingerprints existed.
    return self._manager.restore(step, args=ocp.args.Composite(fingerprints=ocp.args.JsonRestore()))["fingerprints"]

  @staticmethod
  def _check_fingerprints(saved: dict[str, int] | None, tree: Any) -> None:
    bad = integrity.mismatched(saved, tree) if saved is not None else []
    if bad:
      more = f" and {len(bad) - 1} more arrays" if len(bad) > 1 else ""
      raise DamagedStep(f"array {bad[0]}{more} read back differently from what was saved (their fingerprints "
                     "differ): a data file under state/ is corrupt")

  def _restore_data(self, step: int, shards: list[int] | None) -> tuple[dict[int, Any] | None, str | None]:
    if shards is None:
      return None, None
    return checkpoint_data.read_states(self.directory / str(step) / "data", shards, self._num_shards, step)

  def _set_aside(self, steps: list[int]) -> None:
    """Moves damaged steps out of Orbax's sight (renamed, not deleted) so that those steps can be saved again."""
    if not steps:
      return
    if jax.process_index() == 0:
      for step in steps:
        src = self.directory / str(step)
        dst = self.directory / f"{step}{DAMAGED_SUFFIX}"
        n = 1
        while dst.exists():
          dst, n = self.directory / f"{step}{DAMAGED_SUFFIX}.{n}", n + 1
        try:
          src.rename(dst)
          log.warning("checkpoint step %d was moved to %s (nothing is deleted).", step, dst)
        except OSError as e:
          log.warning("checkpoint step %d could not be moved aside (%s): saving step %d will fail until it is "
                      "moved away by hand.", step, e, step)
    _barrier("jbert_checkpoint_set_aside")
    self._manager.reload()


def _everywhere(ok: bool) -> bool:
  """True when every process says so: a step is only used if all processes could read their part of it."""
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return bool(np.all(multihost_utils.process_allgather(np.array(ok))))


def _barrier(name: str) -> None:
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    multihost_utils.sync_global_devices(name)


def _shapes_by_path(tree: Any) -> dict[str, tuple[int, ...]]:
  leaves = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
  return {integrity.leaf_name(path): tuple(leaf.shape) for path, leaf in leaves if hasattr(leaf, "shape")}
