"""The task registry: each task module registers its class (`@register`), under the kinds it trains and serves.

A registration is the class itself, which declares (`jbert.tasks.base.Task`): its kind names, its head, its config
keys (`config_section`), `from_config(config, tokenizer)`, `for_prediction(folder, ...)`, its prediction-input
reader, how it buckets and how it writes outputs. This module only maps names to classes:

  kind        a task class's own name for what it trains (`classification`, `ner`, `cross_encoder`, ...); a fine-tuned
              model records the kind that trained it (config.json's `jbert.task`), which `jbert.predict` looks up
  config name what `configs/finetune.py:NAME` and `task.name` say: a dataset of `jbert.data.finetune.datasets`
              (its `kind` picks the class), a class's own `config_names` (`cross_encoder`), or `local`, whose
              `task.kind` picks among the classes that read local files (`local_kind`)
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from jbert.data.finetune import datasets

if TYPE_CHECKING:
  from jbert.tasks.base import Task

LOCAL = "local"


class Registry:
  """Task classes by kind, in registration order (the order of `jbert.tasks`' imports)."""

  def __init__(self):
    self._by_kind: dict[str, type[Task]] = {}

  def register(self, cls: type[Task]) -> type[Task]:
    """Class decorator: registers `cls` under each of `cls.kinds`; a kind registered twice is refused."""
    if not cls.kinds:
      raise ValueError(f"task class {cls.__name__} declares no kinds.")
    for kind in cls.kinds:
      other = self._by_kind.get(kind)
      if other is not None and other is not cls:
        raise ValueError(f"task kind {kind!r} of {cls.__module__}.{cls.__name__} is already registered by "
                         f"{other.__module__}.{other.__name__}.")
    self._by_kind.update(dict.fromkeys(cls.kinds, cls))
    return cls

  def kinds(self) -> tuple[str, ...]:
    return tuple(self._by_kind)

  def classes(self) -> tuple[type[Task], ...]:
    return tuple(dict.fromkeys(self._by_kind.values()))

  def get(self, kind: str) -> type[Task]:
    if kind not in self._by_kind:
      raise ValueError(f"unknown task kind {kind!r}; one of {', '.join(self._by_kind)}.")
    return self._by_kind[kind]

  def local_kinds(self) -> tuple[str, ...]:
    """The `task.kind` values of `local` files, in registration order."""
    return tuple(cls.local_kind for cls in self.classes() if cls.local_kind)

  def for_config_name(self, name: str, local_kind: str | None = None) -> type[Task] | None:
    """The class that `task.name=name` trains (`local`: the one `local_kind` names); None for an unknown name."""
    if name == LOCAL:
      kind = local_kind or self.local_kinds()[0]
      found = next((cls for cls in self.classes() if cls.local_kind == kind), None)
      if found is None:
        raise ValueError(f"task.kind={kind!r}; local files are {', '.join(self.local_kinds())}.")
      return found
    if name in datasets.DATASETS:
      return self._by_kind.get(datasets.DATASETS[name].kind)
    return next((cls for cls in self.classes() if name in cls.config_names), None)

  def config_names(self) -> list[str]:
    """Every name `configs/finetune.py` trains: the datasets of registered kinds that have training data (a split,
    or files the config names), each fine-tuning class's own names, and `local`."""
    names = [n for n, d in datasets.DATASETS.items()
             if d.kind in self._by_kind and ("train" in d.splits or not d.splits)]
    own = [n for cls in self.classes() if cls.exports for n in cls.config_names if n not in names]
    return sorted(names + own + [LOCAL])

  def for_head(self, architecture: str) -> tuple[type[Task], ...]:
    """The classes that serve a fine-tuned head named `architecture`, most derived first (a subclass recognises
    its own folders before its base class claims the head)."""
    found = [cls for cls in self.classes() if cls.predicts and cls.head.architecture == architecture]
    return tuple(sorted(found, key=lambda cls: -len(cls.__mro__)))


TASKS = Registry()
register = TASKS.register
