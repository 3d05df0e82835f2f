"""Options a task declares: its settings beyond the data config (question answering's windows and n-best search),
each with its default, least value and meaning, declared once on the class (`Task.declared_options`).

Everything else reads them from there: the `task` keys of the task's configs (`config_section`), the settings
its `for_prediction` takes and `jbert.predict` turns into flags (with their least values and help), and the
keys a finished run may change to write its outputs again without training (`evaluation_keys`, the workdir
record's). So code outside `jbert/tasks/` never names a task's options.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable


@dataclasses.dataclass(frozen=True)
class TaskOption:
  """One setting of a task: a `task.NAME` config key (unless not `configured`) and a prediction setting."""

  name: str
  default: bool | int | float  # its type is the option's: values given as text are read as it
  help: str  # what it is, in a few words: a flag's help, a config's comment, the reason in a refusal
  minimum: int | float | None = None  # the least value that can work; below it a flag is refused up front
  # It decides only how predictions are decoded from a trained model, not what is trained: a finished run may
  # change it, and then writes its outputs again from the final checkpoint.
  evaluation_only: bool = False
  configured: bool = True  # a `task` key of its configs; False: a prediction setting only (a dataset implies it)
  default_help: str | None = None  # how a flag's help states the default, when not "the run's, else DEFAULT"

  @property
  def type(self) -> type:
    return type(self.default)

  def flag_help(self, titles: Iterable[str]) -> str:
    """The help of a prediction flag of the tasks titled `titles` ("question answering")."""
    title = ", ".join(titles)
    default = self.default_help or f"the run's, else {_shown(self.default)}"
    return f"{title[:1].upper()}{title[1:]}: {self.help} (default: {default})."


def _shown(value: bool | int | float) -> str:
  if isinstance(value, bool):
    return str(value).lower()
  return f"{value:g}" if isinstance(value, float) else str(value)


def config_section(options: Iterable[TaskOption]) -> dict:
  """The `task` keys of `options` with their defaults (each one's comment is its declaration's help)."""
  return {o.name: o.default for o in options if o.configured}


def defaults(options: Iterable[TaskOption]) -> dict:
  """Every option's default, configured or not: what a prediction takes without a run's record or a setting."""
  return {o.name: o.default for o in options}


def names(cls) -> tuple[str, ...]:
  return tuple(o.name for o in cls.declared_options)


def collect(classes: Iterable[type]) -> dict[str, tuple[TaskOption, tuple[type, ...]]]:
  """name -> (the option, the classes declaring it), over `classes` in order. One name is one option: two classes
  declaring it differently would make one flag mean two things, so that is refused (a bug of the tasks)."""
  found: dict[str, tuple[TaskOption, tuple[type, ...]]] = {}
  for cls in classes:
    for option in cls.declared_options:
      if option.name in found and found[option.name][0] != option:
        first = found[option.name][1][0]
        raise TypeError(f"Task option {option.name!r} is declared differently by {first.__name__} and "
                        f"{cls.__name__}; one name must be one option (declare it once and share it).")
      known, owners = found.get(option.name, (option, ()))
      found[option.name] = (known, owners + (cls,) if cls not in owners else owners)
  return found


def evaluation_keys(classes: Iterable[type]) -> tuple[str, ...]:
  """The dotted config keys (`task.NAME`) of the evaluation-only options of `classes`."""
  return tuple(f"task.{name}" for name, (option, _) in collect(classes).items()
               if option.evaluation_only and option.configured)
