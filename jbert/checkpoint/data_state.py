"""The data-iterator state inside a checkpoint: one JSON file per data shard, so that a run restarted with another
number of processes still finds the state of every shard it now owns, and `layout.json` with the number of
shards, which tells a deleted shard state (damage) from a checkpoint written with another `data.num_shards`.
"""
from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any, Iterable, Mapping

import jax
import orbax.checkpoint as ocp
from etils import epath

log = logging.getLogger("jbert")

LAYOUT = "layout.json"  # {"num_shards": N}, written by process 0 beside the shard states


class DataStateHandler(ocp.CheckpointHandler):
  """Each process writes and reads only the shards it owns; process 0 also records the number of shards."""

  def save(self, directory: epath.Path, args: "DataStateSave"):
    for shard, state in args.states.items():
      (directory / f"shard_{int(shard)}.json").write_text(json.dumps(state))
    if args.num_shards is not None and jax.process_index() == 0:
      (directory / LAYOUT).write_text(json.dumps({"num_shards": int(args.num_shards)}))

  def restore(self, directory: epath.Path, args: "DataStateRestore") -> dict[int, Any]:
    return {int(s): json.loads((directory / f"shard_{int(s)}.json").read_text()) for s in args.shards}

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
  num_shards: int | None = None


@ocp.args.register_with_handler(DataStateHandler, for_restore=True)
@dataclasses.dataclass
class DataStateRestore(ocp.args.CheckpointArgs):
  shards: Iterable[int]


def read_states(data_dir: epath.Path, shards: list[int], num_shards: int | None,
                step: int) -> tuple[dict[int, Any] | None, str | None]:
  """(states of `shards`, None); (None, None) for a checkpoint of another number of shards (logged: the stream
  restarts); or (None, what is damaged). `num_shards` is the run's, None when unknown."""
  if not data_dir.exists():
    return None, "data/ (the data-iterator state) is missing"
  layout = data_dir / LAYOUT
  try:
    saved_shards = json.loads(layout.read_text())["num_shards"] if layout.exists() else None
  except (ValueError, KeyError, TypeError) as e:
    return None, f"data/{LAYOUT} is unreadable ({e})"
  if saved_shards is not None and num_shards is not None and saved_shards != num_shards:
    log.warning("checkpoint step %d was written with data.num_shards=%d and this run has %d: the data stream "
                "restarts (set data.num_shards to a fixed number to resume it exactly).", step, saved_shards,
                num_shards)
    return None, None
  states = {}
  for shard in shards:
    path = data_dir / f"shard_{shard}.json"
    if not path.exists():
      if saved_shards is None:  # Written without a layout: most likely another number of shards.
        log.warning("checkpoint step %d has no data-iterator state for shard %d; the data stream restarts.", step,
                    shard)
        return None, None
      return None, f"data/shard_{shard}.json (the data-iterator state) is missing"
    try:
      states[shard] = json.loads(path.read_text())
    except ValueError as e:
      return None, f"data/shard_{shard}.json (the data-iterator state) is not valid JSON ({e})"
  return states, None
