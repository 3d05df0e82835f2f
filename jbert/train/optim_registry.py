"""The optimisers and learning-rate schedules `optim.name` and `optim.schedule` name, each registered by its module.

An optimiser is `build(cfg, mask) -> [optax.GradientTransformation, ...]`, chained from (already clipped) gradients
to the update direction before the learning rate: its moments, the weight decay on the leaves `mask` marks, and
any per-tensor scaling of its own; `jbert.train.optim` clips before it and multiplies by the schedule after it.
A schedule is `build(cfg, total_steps) -> step -> learning rate`, called after `optim` has checked the keys
every schedule shares (peak, end, warmup). `keys` are the entry's own `optim` config keys and their defaults, which
`optim.default_config` adds to every config so that one spelling reaches them from the command line.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import ml_collections
import optax


@dataclasses.dataclass(frozen=True)
class Entry:
  name: str
  build: Callable[..., Any]
  keys: dict[str, Any]


OPTIMIZERS: dict[str, Entry] = {}
SCHEDULES: dict[str, Entry] = {}


def _register(table: dict[str, Entry], kind: str, name: str, keys: dict[str, Any] | None):
  def wrap(build):
    if name in table:
      raise ValueError(f"{kind} {name!r} is registered twice.")
    clash = {k for k in (keys or {}) for other in table.values() if k in other.keys}
    if clash:
      raise ValueError(f"{kind} {name!r} declares optim keys another {kind} has: {sorted(clash)}.")
    table[name] = Entry(name, build, dict(keys or {}))
    return build
  return wrap


def register_optimizer(name: str, keys: dict[str, Any] | None = None):
  """Decorates `build(cfg, mask) -> list of GradientTransformation` as optimiser `name`."""
  return _register(OPTIMIZERS, "optimizer", name, keys)


def register_schedule(name: str, keys: dict[str, Any] | None = None):
  """Decorates `build(cfg, total_steps) -> optax.Schedule` as schedule `name`."""
  return _register(SCHEDULES, "schedule", name, keys)


def declared_keys() -> dict[str, Any]:
  """Every registered entry's own `optim` keys with their defaults."""
  out = {}
  for entry in (*OPTIMIZERS.values(), *SCHEDULES.values()):
    out.update(entry.keys)
  return out


def optimizer(cfg: ml_collections.ConfigDict, mask: Any) -> list[optax.GradientTransformation]:
  if cfg.name not in OPTIMIZERS:
    raise ValueError(f"optim.name={cfg.name!r} is not supported; use one of {', '.join(OPTIMIZERS)}.")
  return OPTIMIZERS[cfg.name].build(cfg, mask)


def schedule(cfg: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  if cfg.schedule not in SCHEDULES:
    raise ValueError(f"optim.schedule={cfg.schedule!r} is not supported; use one of {', '.join(SCHEDULES)}.")
  return SCHEDULES[cfg.schedule].build(cfg, total_steps)
