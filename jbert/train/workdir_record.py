"""The config that trained a workdir, what a rerun may change in it, and when a rerun has nothing to do.

A workdir belongs to one training: rerunning the command resumes it, so a rerun whose config says something
else (another learning rate, label order, corpus or model) would train, evaluate and export a model that no
file describes truthfully. The workdir therefore holds, for the user and for the next rerun:

  WORKDIR/config.json    the config training it (total_steps and warmup resolved), as each checkpoint's `config`
  WORKDIR/history.jsonl  one line per start: when, from which step, and every key changed since, old and new

On a resume every key is compared with config.json (with the latest checkpoint's `config` for a workdir older
than these files). Keys in SAFE (cadences, evaluation sizes, checkpoint keeping, the mesh and other layout-only
keys) and a raised `total_steps` may change; any other difference (`data.bucketing` and `data.packing` too:
they shape the batches) stops the run before anything is written, naming each key, old and new, and the two ways
out: a new `--workdir`, or `--config.allow_changes=KEY,...` for a deliberate change, which history.jsonl then
records. Keys only one side has (a newer jbert added or dropped them) are not compared, except those in ADDED,
which a record without them held at their old meaning. `total_steps` at or below the step reached is no change
but nothing to do.

A fine-tuning run is finished when its latest step reached `total_steps` and results.json (written last) is of
that step and of the same OUTPUT keys: a rerun then says so and writes nothing, even when it changes (allowed)
keys that act only through training, which is over (its records keep saying what trained the model). A change of
an OUTPUT key writes the outputs again from the final checkpoint; with a training change beside it, that rewrite
would record a config the model was never trained with, so it is refused.
"""
from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
from typing import Any

from etils import epath
import ml_collections

from jbert import tasks
from jbert.runtime import atomic
from jbert.tasks import options as task_options

log = logging.getLogger("jbert")

RECORD = "config.json"
HISTORY = "history.jsonl"
OVERRIDE_KEY = "allow_changes"
# How predictions are decoded from a trained model, not how it is trained (the tasks' options declared
# evaluation-only, as SQuAD's null threshold, which its threshold search suggests a new value for): a change is
# allowed, and on a finished run it writes the outputs again from the final checkpoint.
EVALUATION = task_options.evaluation_keys(tasks.TASKS.classes())
# Keys that decide a finished run's outputs from its final parameters (labels' names, what is evaluated and
# predicted, how predictions are decoded): a change writes the outputs again, without training.
OUTPUT = EVALUATION + ("task.label_names", "task.eval_file", "task.test_file")
# Keys (a section covers its keys) that leave what the model is and what it is trained on as they were;
# num_epochs acts only through total_steps, which is compared resolved.
SAFE = EVALUATION + (
    "log_every_steps", "eval_every_steps", "eval_batches", "eval_batch_size", "checkpoint_every_steps",
    "max_checkpoints_to_keep", "async_checkpointing", "allow_data_restart", OVERRIDE_KEY, "num_epochs", "mesh",
    "logical_axis_rules", "data.worker_count", "task.tfds_data_dir", "model.attention_impl", "model.remat_policy")
# Resolved from total_steps when not set: then it follows a total_steps change rather than being one.
_FOLLOWS_TOTAL = "optim.warmup_steps"
# Keys added since workdirs were first recorded, with what their absence meant: a workdir trained before
# `data.bucketing` existed fed fixed-length batches, so resuming it bucketed would change its data order; one
# trained before `data.packing` fed one sequence per row, so resuming it packed would change its batches.
ADDED = {"data.bucketing": False, "data.packing": False}


class ConfigDriftError(ValueError):
  """A rerun's config differs from the one that trained the workdir; the message names each key."""


@dataclasses.dataclass(frozen=True)
class Change:
  key: str
  old: Any
  new: Any
  allowed_by: str  # "safe" (SAFE, or total_steps raised), "total_steps" (a derived warmup), or OVERRIDE_KEY


@dataclasses.dataclass(frozen=True)
class Rerun:
  """What the workdir holds before this run touches it: its latest step (None: nothing trained yet) and the
  allowed changes of this run's config against its record."""
  step: int | None
  changes: tuple[Change, ...] = ()


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(tree, dict):
    return {k: v for key, value in tree.items() for k, v in _flat(value, f"{prefix}{key}.").items()}
  return {prefix[:-1]: tree}


def _jsonable(config: ml_collections.ConfigDict | dict) -> dict[str, Any]:
  tree = config.to_dict() if isinstance(config, ml_collections.ConfigDict) else config
  return json.loads(json.dumps(tree, default=str))  # tuples as lists, as the record reads back


def _covers(names: list[str], key: str) -> bool:
  return any(key == n or key.startswith(n + ".") for n in names)


def allowed_keys(config: ml_collections.ConfigDict) -> list[str]:
  """The dotted keys (or sections) of `allow_changes`; one that the config lacks is refused, naming it."""
  names = [n.strip() for n in (config.get(OVERRIDE_KEY) or "").split(",") if n.strip()]
  flat = _flat(_jsonable(config))
  unknown = [n for n in names if not any(_covers([n], key) for key in flat)]
  if unknown:
    raise ConfigDriftError(f"{OVERRIDE_KEY}={config.get(OVERRIDE_KEY)!r} names {', '.join(unknown)}, which the "
                           "config has no key for; list dotted config keys such as optim.learning_rate.")
  return names


def _derived(flat: dict[str, Any]) -> bool:
  """Whether the resolved warmup is warmup_fraction of total_steps (and so follows it)."""
  fraction, total = flat.get("optim.warmup_fraction"), flat.get("total_steps")
  return fraction is not None and total is not None and flat.get(_FOLLOWS_TOTAL) == int(round(fraction * total))


def compare(recorded: dict[str, Any], config: ml_collections.ConfigDict, step: int, workdir: str) -> list[Change]:
  """This run's changes against `recorded` (both resolved); raises ConfigDriftError for any not allowed."""
  allowed = allowed_keys(config)
  old, new = _flat(_jsonable(recorded)), _flat(_jsonable(config))
  old.update({k: v for k, v in ADDED.items() if k in new and k not in old})
  total_changed = old.get("total_steps") != new.get("total_steps")
  changes, refused = [], []
  for key in sorted(old.keys() & new.keys()):
    if old[key] == new[key]:
      continue
    if _covers(list(SAFE), key) or (key == "total_steps" and new[key] > old[key]):
      changes.append(Change(key, old[key], new[key], "safe"))
    elif key == "total_steps" and new[key] <= step:
      changes.append(Change(key, old[key], new[key], "past"))  # nothing to train: `finished_message` says so
    elif _covers(allowed, key):
      changes.append(Change(key, old[key], new[key], OVERRIDE_KEY))
    elif key == _FOLLOWS_TOTAL and total_changed and _derived(old) and _derived(new):
      changes.append(Change(key, old[key], new[key], "total_steps"))
    else:
      refused.append(f"{key} {old[key]!r} -> {new[key]!r}")
  if refused:
    keys = ",".join(r.split(" ", 1)[0] for r in refused)
    raise ConfigDriftError(
        f"{workdir} was trained to step {step} with another config: {'; '.join(refused)}. Resuming would train "
        f"and report a model no file describes: pass a new --workdir, or --config.{OVERRIDE_KEY}={keys} to "
        f"change {'it' if len(refused) == 1 else 'them'} deliberately (recorded in {HISTORY}).")
  return changes


def _read_record(workdir: str) -> dict[str, Any] | None:
  path = epath.Path(workdir) / RECORD
  if not path.exists():
    return None
  try:
    return json.loads(path.read_text(encoding="utf-8"))["config"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ConfigDriftError(f"{path} cannot be read ({e}); it records the config that trained this workdir: "
                           "repair or delete it (the latest checkpoint's config is then compared), or pass a new "
                           "--workdir.") from e


def _reading(workdir: str, read):
  """`read(checkpointer)` on WORKDIR/checkpoints opened read-only; None when it holds no checkpoint."""
  directory = os.path.join(workdir, "checkpoints")
  if "://" not in workdir and not os.path.isdir(directory):
    return None
  from jbert.checkpoint import reading  # pylint: disable=g-import-not-at-top  (Orbax only when needed)
  if reading.find_checkpoint_dir(directory) is None:
    return None
  ckpt = reading.open_for_reading(directory)
  try:
    return read(ckpt)
  finally:
    ckpt.close()


def _checkpoint_config(workdir: str, step: int) -> dict[str, Any] | None:
  """The `config` item of checkpoint `step`, for a workdir older than config.json; None when it is damaged
  (the resume then sets the step aside and says so, and there is nothing to compare with)."""
  from jbert.checkpoint import manager  # pylint: disable=g-import-not-at-top
  try:
    return _reading(workdir, lambda ckpt: ckpt.read_json(step, "config"))
  except manager.CheckpointError as e:
    log.warning("%s; this run's config is not compared with the one that trained the workdir.", e)
    return None


def recorded_value(workdir: str, key: str) -> Any:
  """The value of dotted `key` in the config that trained `workdir`'s checkpoints; None without any."""
  step = _reading(workdir, lambda ckpt: ckpt.latest_step())
  recorded = None if step is None else _read_record(workdir) or _checkpoint_config(workdir, step)
  return _flat(recorded).get(key) if recorded else None


def check(workdir: str, config: ml_collections.ConfigDict) -> Rerun:
  """Compares `config` (total_steps and warmup resolved) with the config that trained `workdir`; reads only."""
  allowed_keys(config)  # a mistyped key is refused on a fresh workdir too
  step = _reading(workdir, lambda ckpt: ckpt.latest_step())
  if step is None:
    return Rerun(None)
  recorded = _read_record(workdir) or _checkpoint_config(workdir, step)
  return Rerun(step, tuple(compare(recorded, config, step, workdir)) if recorded else ())


def _outputs_current(workdir: str, config: ml_collections.ConfigDict, step: int) -> bool:
  """Whether results.json (written last) is of `step` and of this config's OUTPUT keys; not when an interrupted
  or older run wrote it."""
  try:
    results = json.loads((epath.Path(workdir) / "results.json").read_text(encoding="utf-8"))
    if results.get("step") != step:
      return False
    old, new = _flat(_jsonable(results.get("config") or {})), _flat(_jsonable(config))
  except (OSError, ValueError, AttributeError):
    return False
  return all(old.get(key) == value for key, value in new.items() if _covers(list(OUTPUT), key))


def _writes_outputs(config: ml_collections.ConfigDict) -> bool:
  """Whether the end of the run writes results.json and the exported model (its task's `exports`). A task no
  class trains counts as one that does: the run's plan refuses it, naming it, before anything is trained."""
  if "task" not in config:
    return False
  try:
    cls = tasks.TASKS.for_config(config.task)
  except ValueError:  # `local` with an unknown task.kind
    return True
  return cls is None or cls.exports


def _training_changes(rerun: Rerun) -> list[Change]:
  """The deliberate changes of keys that act only through training (not OUTPUT keys)."""
  return [c for c in rerun.changes if c.allowed_by == OVERRIDE_KEY and not _covers(list(OUTPUT), c.key)]


def finished_message(workdir: str, config: ml_collections.ConfigDict, rerun: Rerun) -> str | None:
  """What to say, instead of training, when the workdir has reached `config.total_steps` (resolved) and holds
  the outputs of that step (fine-tuning's results.json; pretraining has none); None when there is work left.
  Raises ConfigDriftError when the outputs must be written again but a training change would be recorded."""
  total, step = config.total_steps, rerun.step
  if step is None or step < total:
    return None
  unused = _training_changes(rerun)
  if _writes_outputs(config) and not _outputs_current(workdir, config, step):
    if unused:
      raise ConfigDriftError(
          f"{workdir} is trained to its last step {step}, and its outputs are to be written again from it; "
          f"{_listed(unused)} would only change training, which is over, yet the outputs would record "
          f"{'it' if len(unused) == 1 else 'them'}: drop {'it' if len(unused) == 1 else 'them'}, or raise "
          f"--config.total_steps above {step} to train with {'it' if len(unused) == 1 else 'them'}.")
    return None  # written again from the final checkpoint, without training
  where = workdir if "://" in workdir else os.path.abspath(workdir)
  if unused:  # nothing is written: the records keep the config that trained the model
    return (f"run.py: already complete at step {step} ({where}), and nothing was changed: {_listed(unused)} would "
            f"only change training, which is over; raise --config.total_steps above {step} to train further with "
            f"{'it' if len(unused) == 1 else 'them'}, or pass another --workdir.")
  if step > total:
    return (f"run.py: already past total_steps={total}: {where} holds step {step}, and its outputs are those of "
            f"step {step}; raise --config.total_steps above {step} to train further, or pass another --workdir.")
  return (f"run.py: already complete at step {step} ({where}); raise --config.total_steps to train further, or "
          "pass another --workdir.")


def _listed(changes: list[Change]) -> str:
  return "; ".join(f"{c.key} {c.old!r} -> {c.new!r}" for c in changes)


def record(workdir: str, config: ml_collections.ConfigDict, rerun: Rerun) -> None:
  """Writes config.json and appends this start to history.jsonl (process 0, holding the workdir lock)."""
  now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
  text = json.dumps({"written": now, "step": rerun.step or 0, "config": _jsonable(config)}, indent=2) + "\n"
  entry = json.dumps({"time": now, "event": "start" if rerun.step is None else "resume", "step": rerun.step or 0,
                      "changes": [dataclasses.asdict(c) for c in rerun.changes]}) + "\n"
  if "://" in workdir:  # an object store writes each object whole; it has no append
    history = epath.Path(workdir) / HISTORY
    (epath.Path(workdir) / RECORD).write_text(text, encoding="utf-8")
    history.write_text((history.read_text(encoding="utf-8") if history.exists() else "") + entry, encoding="utf-8")
  else:
    with atomic.open_for_write(os.path.join(workdir, RECORD), encoding="utf-8") as f:
      f.write(text)
    with open(os.path.join(workdir, HISTORY), "a", encoding="utf-8") as f:
      f.write(entry)
  for change in rerun.changes:
    log.info("config change recorded in %s: %s %r -> %r (%s)", HISTORY, change.key, change.old, change.new,
             change.allowed_by)
