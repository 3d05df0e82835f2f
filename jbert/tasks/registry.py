"""The task registry: each task module registers its class (`@register`), under the kinds it trains and serves.

A registration is the class itself, which declares (`jbert.tasks.base.Task`): its kind names, its head, its config
keys (`config_section`), `from_config(config, tokenizer)`, `for_prediction(folder, ...)`, its prediction-input
reader, how it buckets and how it writes outputs. This module only maps names to classes:

  kind        a task class's own name for what it trains (`classification`, `ner`, `cross_encoder`, ...); a fine-tuned
              model records the kind that trained it (config.json's `jbert.task`), which `jbert.predict` looks up
  config name what `configs/finetune.py:NAME` and `task.name` say: a dataset a class declares (`Task.datasets`,
              its `<family>/sources.py`; the dataset's `kind` picks the class), a class's own `config_names`
              (`cross_encoder`), or `local`, whose `task.kind` picks among the classes that read local files
              (`local_kind`)
  variant     a class registered `variant_of` another kind trains that kind's configs where its `selects(task)`
              says so (a CRF over NER's tags with `task.crf=true`); its `variant_keys()` join those configs' keys

A config's section holds the keys of every class its name may train (`local`: every local kind and variant), so
`check_keys` refuses a key set away from its default that the class chosen does not read (not in its own keys, or
in its `ignores`), naming the classes that do read it: a key that does nothing is a mistake, as an unknown one is.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import ml_collections

from jbert import errors

if TYPE_CHECKING:
  from jbert.tasks.base import Task
  from jbert.tasks.sources import Dataset

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

  def datasets(self) -> dict[str, Dataset]:
    """Every dataset the registered classes declare by name (`Task.datasets`), in registration order."""
    found: dict[str, Dataset] = {}
    for cls in self.classes():
      for name, dataset in cls.datasets.items():
        found.setdefault(name, dataset)
    return found

  def dataset(self, name: str) -> Dataset:
    """The dataset `task.name=name` trains on."""
    found = self.datasets()
    if name not in found:
      raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(found))} (or build one with "
                       "local_dataset for your own files).")
    return found[name]

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
    dataset = self.datasets().get(name)
    if dataset is not None:
      return self._by_kind.get(dataset.kind)
    return next((cls for cls in self.classes() if name in cls.config_names), None)

  def for_config(self, task_cfg) -> type[Task] | None:
    """The class a config's `task` section trains: `for_config_name`, or the variant of it the section selects."""
    cls = self.for_config_name(task_cfg.name, task_cfg.get("kind"))
    if cls is None:
      return None
    return next((v for v in self.variants(cls) if v.selects(task_cfg)), cls)

  def variants(self, cls: type[Task]) -> tuple[type[Task], ...]:
    """The classes registered as variants of a kind of `cls`."""
    return tuple(v for v in self.classes() if v.variant_of in cls.kinds)

  def config_section(self, name: str) -> dict:
    """The `task` keys (beside `name`) of `configs/finetune.py:NAME`: its class's, and its variants' (for `local`,
    those of every kind local files train). An unknown name gets sequence classification's (build_task refuses
    it)."""
    base = self.for_config_name(name) or self.get("classification")
    section = base.config_section(name)
    for cls in ([self.for_config_name(LOCAL, k) for k in self.local_kinds()] if name == LOCAL else [base]):
      for variant in self.variants(cls):
        section.update(variant.variant_keys())
    return section

  def reads(self, cls: type[Task], task_cfg) -> set[str]:
    """The `task` keys `cls` acts on for `task_cfg` (beside `name`): its section and variant keys but its ignores;
    `kind` only for `local`, where it picks the class."""
    keys = set(cls.config_section(task_cfg.name)) | set(cls.variant_keys())
    keys -= set(cls.ignores(task_cfg)) | ({"kind"} if task_cfg.name != LOCAL else set())
    return keys

  def check_keys(self, task_cfg) -> None:
    """A ValueError for the first key of `task_cfg` set away from its default that the class it trains does not
    read, naming the key, the task and the classes (with their configs) that read it."""
    cls = self.for_config(task_cfg)
    if cls is None:
      return
    name = task_cfg.name
    defaults = ml_collections.ConfigDict(self.config_section(name))
    read = self.reads(cls, task_cfg)
    for key in task_cfg:
      value = task_cfg[key]
      if key == "name" or key in read or (key in defaults and value == defaults[key]):
        continue
      why = {**cls.ignores(task_cfg), "kind": "task.kind picks the task of `local` files only"}.get(
          key, "it is not one of its settings")
      chosen = f"{name}{f' with task.kind={task_cfg.kind}' if name == LOCAL else ''}"
      # Its own class first, then those its config name trains (`local`'s other kinds), then the rest.
      readers = [f"{title} ({', '.join(names)})" for title, names in sorted(self.readers(key).items(), key=lambda r: (
          r[0] != _title(cls), not any(n.split(" ")[0] == name for n in r[1])))]
      raise ValueError(f"task.{key}={errors.preview(value)} does nothing for task {chosen} ({_title(cls)}): {why}. "
                       + (f"task.{key} is read by {errors.listing(readers, 6)}." if readers else "No task reads it.")
                       + " Drop it, or train a task that reads it.")

  def readers(self, key: str) -> dict[str, list[str]]:
    """{title: [config, ...]} of the classes that read `key` under a config's defaults (a variant under its base's
    configs, where the base does not read it), in registration order."""
    found: dict[str, list[str]] = {}
    contexts = [(n, None) for n in self.config_names() if n != LOCAL] + [(LOCAL, k) for k in self.local_kinds()]
    for name, kind in contexts:
      section = ml_collections.ConfigDict({**self.config_section(name), "name": name})
      if kind is not None:
        section.kind = kind
      base = self.for_config_name(name, kind)
      for cls in (base, *self.variants(base)):
        if key in self.reads(cls, section) and (cls is base or key not in self.reads(base, section)):
          found.setdefault(_title(cls), []).append(name if kind is None else f"{name} with task.kind={kind}")
    return found

  def config_names(self) -> list[str]:
    """Every name `configs/finetune.py` trains: the datasets of registered kinds that have training data (a split,
    or files the config names), each fine-tuning class's own names, and `local`."""
    names = [n for n, d in self.datasets().items()
             if d.kind in self._by_kind and ("train" in d.splits or not d.splits)]
    own = [n for cls in self.classes() if cls.exports and not cls.pretrains for n in cls.config_names
           if n not in names]
    return sorted(names + own + [LOCAL])

  def for_head(self, architecture: str) -> tuple[type[Task], ...]:
    """The classes that serve a fine-tuned head named `architecture`, most derived first (a subclass recognises
    its own folders before its base class claims the head)."""
    found = [cls for cls in self.classes() if cls.predicts and not cls.variant_of
             and cls.head.architecture == architecture]
    return tuple(sorted(found, key=lambda cls: -len(cls.__mro__)))


def _title(cls: type[Task]) -> str:
  """What messages call the task class: its `title`, else its kind."""
  return getattr(cls, "title", None) or cls.kinds[0]


TASKS = Registry()
register = TASKS.register
