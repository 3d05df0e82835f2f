"""Orbax checkpoints of a training run: train state, per-shard data-iterator state, the configs and a fingerprint
of every array.

Layout: `WORKDIR/checkpoints/<step>/{state,data,config,bert_config,fingerprints}`. Orbax writes each step into a
temporary directory and renames it when every process has finished, so `latest_step()` never sees a partial
checkpoint (on GCS, a commit marker plays the role of the rename).

Failures are reported under the step they belong to: a save that cannot start raises at once, a background
write that fails is found by `poll()` (every training step) and logged, and the next save still runs. A storage
that stops answering (or answers without object generations) raises `StorageFailure` instead: every later write
would wait out the clients' retries, or fail the same way. Each message names the step a rerun resumes from,
checked on the storage as a resume checks it (`resumable_step`). A resume takes the newest step that restores
completely (`restore_latest_intact`, in `jbert.checkpoint.restoring`); damaged newer steps are named and moved
aside, never deleted.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp

from jbert.checkpoint import data_state as checkpoint_data
from jbert.checkpoint import integrity
from jbert.checkpoint.restoring import DAMAGED_SUFFIX, DamagedStep, Restoring  # noqa: F401
from jbert.checkpoint.writable import CheckpointError, StorageFailure, absolute, check_writable  # noqa: F401
from jbert.runtime import storage_failures

log = logging.getLogger("jbert")

# ----------------------------------------------------------------------------------------------------------
# The run's checkpoint manager.
# ----------------------------------------------------------------------------------------------------------


class Checkpointer(Restoring):
  """`ocp.CheckpointManager` with the jbert items, failures reported under their own step, and resume from the
  newest intact step. `num_data_shards` (the run's `data.num_shards`) tells a deleted shard state (damage) from
  a checkpoint written with another number of shards (the data stream restarts, with a warning).

  `read_only=True` (see `open_for_reading`) creates and probes nothing and refuses to save: loading weights from a
  run, predicting from it or fine-tuning from it must work on a directory the reader cannot write (a shared or
  archived run, a read-only mount)."""

  def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3, async_save: bool = True,
               num_data_shards: int | None = None, read_only: bool = False):
    self.read_only = read_only
    self.directory = absolute(directory) if read_only else check_writable(directory)
    self._num_shards = num_data_shards
    self._async = async_save
    self._in_flight: tuple[int, bool] | None = None  # (step, final) of the save running in the background
    self._partial: set[int] = set()  # failed saves whose temporary directories are still to be removed
    self._failed: set[int] = set()  # every failed save: close() checks again that none left a directory behind
    self._complete: int | None = None  # the newest step this run restored or saw saved completely
    self.storage_down = False  # the storage stopped answering: nothing more is written, waited for or removed
    self._manager = ocp.CheckpointManager(
        self.directory,
        item_handlers={
            "state": ocp.StandardCheckpointHandler(),
            "data": checkpoint_data.DataStateHandler(),
            "config": ocp.JsonCheckpointHandler(),
            "bert_config": ocp.JsonCheckpointHandler(),
            "fingerprints": ocp.JsonCheckpointHandler(),
        },
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=async_save and not read_only,
            save_interval_steps=0 if read_only else 1,  # Orbax warns that it sets 0 itself for a reader
            create=not read_only, read_only=read_only, save_root_metadata=not read_only,
            # Orbax's background directory creation leaves every other writer thread waiting 300 s on a
            # signal that never comes when the mkdir fails (read-only or full storage); created in the
            # caller's thread, the failure raises at once.
            async_options=ocp.AsyncOptions(create_directories_asynchronously=False)))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  # -- saving ------------------------------------------------------------------------------------------------

  def save(self, step: int, state: Mapping[str, Any], *, data_states: Mapping[int, Any] | None,
           config: Mapping[str, Any], bert_config: Mapping[str, Any], final: bool = False) -> None:
    """Starts an (async) save of `step`; raises `CheckpointError` naming `step` if it cannot start.

    A failure of the previous save is logged under that save's step and does not stop this one, unless it is a
    `StorageFailure`, raised here. `final` (the last step, or a stop on SIGTERM) only changes what the error
    messages say happens next.
    """
    if self.read_only:
      raise CheckpointError(f"{self.directory} was opened read-only; open it with Checkpointer(...) to save.")
    previous = self._settle()
    if isinstance(previous, StorageFailure):
      raise previous
    self._remove_partial()
    items = {
        "state": ocp.args.StandardSave(state),
        "config": ocp.args.JsonSave(_jsonable(config)),
        "bert_config": ocp.args.JsonSave(dict(bert_config)),
    }
    if data_states is not None:
      items["data"] = checkpoint_data.DataStateSave(dict(data_states), self._num_shards)
    try:
      items["fingerprints"] = ocp.args.JsonSave(integrity.fingerprints(state))
      self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    except Exception as e:  # Orbax wraps OSError in several types; all mean the same to a user.
      raise self._error(step, e, final) from e
    if self._async:
      self._in_flight = (step, final)
    else:
      self._complete = step

  def poll(self) -> CheckpointError | None:
    """Never blocks: once the background save has ended, its failure (already logged, under its own step, unless
    it is a `StorageFailure`, which the caller raises); None while it runs or when it succeeded. Cheap enough to
    call after every training step."""
    if self._in_flight is None or self._manager.is_saving_in_progress():
      return None
    return self._settle()

  def wait(self) -> None:
    """Blocks until the background save has ended; raises `CheckpointError` if it failed."""
    error = self._settle(log_error=False)
    if error is not None:
      raise error

  def _settle(self, log_error: bool = True) -> CheckpointError | None:
    if self._in_flight is None:
      return None
    (step, final), self._in_flight = self._in_flight, None
    committed = False
    try:
      self._manager.wait_until_finished()
      committed = None  # Orbax's commit ran: only the check below can tell whether it reached the storage
      path = self.directory / str(step)
      if not (path.exists() and ocp.step.is_path_finalized(path)):
        raise OSError(f"Orbax did not finalise {path} (its log above says why)")
    except Exception as e:  # pylint: disable=broad-except
      error = self._error(step, e, final, committed=committed)
      error.__cause__ = e
      if log_error and not isinstance(error, StorageFailure):
        log.error("%s", error)
      return error
    self._complete = step
    return None

  def _remove_partial(self) -> None:
    """Removes the temporary directories of failed saves, which would otherwise hold the space a full disk lacks.
    Orbax's writer threads of a failed save may still be finishing, so what cannot go now goes at the next call.
    With the storage down nothing is tried: the rerun's `remove_interrupted` removes them."""
    if jax.process_index() != 0 or self.storage_down:
      return
    for step in sorted(self._partial):
      try:
        for partial in self.directory.glob(f"{step}.orbax-checkpoint-tmp*"):
          partial.rmtree()
      except Exception as e:  # pylint: disable=broad-except  (gcsfs raises aiohttp's errors too)
        if storage_failures.unreachable(e):
          self.storage_down = True
          return
        if not isinstance(e, OSError):
          raise
        continue  # Read-only storage, or a writer thread still busy: tried again later.
      if not list(self.directory.glob(f"{step}.orbax-checkpoint-tmp*")):  # a late writer may recreate it
        self._partial.discard(step)

  def remove_interrupted(self) -> list[str]:
    """Removes the `N.orbax-checkpoint-tmp*` folders of saves a killed run left (Orbax lists only finished
    steps, so they are never restored, but they hold space until step N is saved again). Call it from process 0
    holding the workdir lock, before the first save: then no writer of this run can own one. Returns their
    names."""
    if self.read_only or jax.process_index() != 0:
      return []
    names = []
    for partial in sorted(self.directory.glob("*.orbax-checkpoint-tmp*")):
      partial.rmtree()
      names.append(partial.name)
    return names

  def _error(self, step: int, error: BaseException, final: bool, committed: bool | None = False
             ) -> CheckpointError:
    """What failed, why, and what happens next, as the error to raise or log. `committed` None: Orbax's commit
    ran but whether it reached the storage could not be checked."""
    self._partial.add(step)
    self._failed.add(step)
    kind = storage_failures.kind(error)
    if kind == storage_failures.UNREACHABLE:
      self.storage_down = True
    self._remove_partial()
    what = f"the checkpoint of step {step} could not be written to {self.directory}"
    storage = storage_failures.describe(error, str(self.directory))
    if kind == storage_failures.UNREACHABLE:
      return StorageFailure(f"{what}: {storage}. The run stops: rerun the same command once the storage answers, "
                            f"and it resumes from {self.resume_point(step, maybe=committed is None)}.")
    if kind == storage_failures.NO_GENERATIONS:
      return StorageFailure(f"{what}: {storage}. The run stops (every later save would fail the same way); the "
                            f"newest complete checkpoint is {self.resume_point(step)}.")
    next_ = ("Training goes on with the state in memory and the next save tries again." if not final else
             f"The run stops without it: fix the storage (free space, permissions), then rerun the same command "
             f"to resume from {self.resume_point(step)}.")
    return CheckpointError(f"{what}: {storage or integrity.root_message(error)}. {next_}")

  def resume_point(self, failed: int | None = None, *, maybe: bool = False) -> str:
    """Where a rerun of the same command goes on from, for a message: the step `resumable_step` finds on the
    storage; with the storage down (its clients would wait out their retries again), the newest step this run
    restored or saw saved completely, and, with `maybe`, the `failed` step if its commit reached the storage."""
    if not self.storage_down:
      try:
        step = self.resumable_step(exclude=failed)
      except Exception as e:  # pylint: disable=broad-except  (a message must not fail: say what is known)
        if storage_failures.unreachable(e):
          self.storage_down = True
        log.debug("checking the checkpoints of %s failed: %s", self.directory, e)
      else:
        return f"step {step}" if step is not None else "the start (no checkpoint is complete)"
    known = f"step {self._complete}" if self._complete is not None else "the start"
    if maybe and failed is not None:
      return f"step {failed} if its commit reached the storage before the failure, else {known}"
    return (f"{known}, the newest checkpoint this run saw complete" if self._complete is not None else
            "the start (this run saw no checkpoint complete)")

  def resumable_step(self, exclude: int | None = None) -> int | None:
    """The step a resume would restore, found as `restore_latest_intact` finds it short of reading the arrays:
    the steps listed on the storage now (not Orbax's list, which a failed save can leave stale), newest first, the
    first that is finalised, has every file and readable state metadata. None when no step is."""
    steps = sorted((int(p.name) for p in self.directory.iterdir() if p.name.isdigit()), reverse=True)
    for step in steps:
      if step == exclude or not ocp.step.is_path_finalized(self.directory / str(step)):
        continue
      try:
        self._step_dir_with_files(step)
        self._state_metadata(step)
      except Exception:  # pylint: disable=broad-except  (damaged: a resume would pass it over too)
        continue
      return step
    return None

  def close(self) -> None:
    """Waits for the background save (logging its failure, if any) and releases Orbax's threads. With the storage
    down it waits for nothing: a save still under way is abandoned (it never commits, and the rerun removes what
    it wrote), and Orbax's writer threads are left to the process's exit (`ahead.abandon`)."""
    if self.storage_down:
      return
    self._settle()
    try:
      self._manager.close()
    except Exception as e:  # pylint: disable=broad-except  (already reported by _settle)
      log.debug("closing the checkpoint manager: %s", e)
    if self.read_only:
      return  # Nothing was saved, so no failed save can have left a directory behind.
    # Writer threads of a failed save can outlive the manager by a moment and recreate what was removed, even a
    # directory removed at an earlier save: every failed step is checked until three checks in a row find none.
    clean = 0
    for _ in range(50):
      self._partial |= self._failed
      self._remove_partial()
      clean = 0 if self._partial else clean + 1
      if clean == 3 or jax.process_index() != 0:
        break
      time.sleep(0.1)


def _jsonable(tree: Any) -> Any:
  if isinstance(tree, Mapping):
    return {str(k): _jsonable(v) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [_jsonable(v) for v in tree]
  if isinstance(tree, (np.integer, np.floating)):
    return tree.item()
  return tree
