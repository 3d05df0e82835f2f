"""Tasks the shared trainer runs, and `jbert.predict` serves: pretraining and fine-tuning problems.

Each task package registers its classes (`jbert.tasks.registry`); importing them here is what makes the registry
complete. Everything below only iterates the registrations:

  build_task(config, tok) the task a training config names (its class's `from_config`), holding its data (without
                          a tokenizer: shapes and losses only, for AOT compilation and benchmarks)
  config_section(name)    the `task` keys of `configs/finetune.py:NAME`
  for_model(folder)       the class and kind of a fine-tuned model folder, for `jbert.predict`

A dataset (`jbert.tasks.sources.Dataset`, declared by name on its class: `Task.datasets`) says where a task's data
lives and how it is scored; its `kind` picks the class. A new task is one package (jbert/tasks/<family>/) with a
registered class (`base.Task`, or `finetuning.PredictingTask` for models `jbert.predict` serves) and its import
below.
"""
from __future__ import annotations

# The task packages (jbert/tasks/<family>/), in the registry's order (`local`'s kinds are listed in it); each
# package's __init__ imports the modules that register its classes (token_classification: the CRF variant too).
from jbert.tasks import classification  # noqa: F401  pylint: disable=unused-import
from jbert.tasks import token_classification  # noqa: F401  pylint: disable=unused-import
from jbert.tasks import question_answering  # noqa: F401  pylint: disable=unused-import
from jbert.tasks import multiple_choice  # noqa: F401  pylint: disable=unused-import
from jbert.tasks import cross_encoder  # noqa: F401  pylint: disable=unused-import
from jbert.tasks import sentence_embedding  # noqa: F401  pylint: disable=unused-import
from jbert.tasks import distillation  # noqa: F401  pylint: disable=unused-import
from jbert.tasks import pretraining  # noqa: F401  pylint: disable=unused-import
from jbert.tasks import electra  # noqa: F401  pylint: disable=unused-import
from jbert.tasks.base import MODEL_INPUTS, EvalSet, Task, Weighted, reported, softmax, training_loss
from jbert.tasks.finetuning import FinetuneTask, PredictingTask
from jbert.tasks.classification.task import SequenceClassification
from jbert.tasks.cross_encoder.task import CrossEncoder
from jbert.tasks.multiple_choice.task import MultipleChoice
from jbert.tasks.pretraining.task import Pretraining
from jbert.tasks.question_answering.task import QuestionAnswering
from jbert.tasks.registry import TASKS
from jbert.tasks.token_classification.task import TokenClassification
from jbert.tasks import sections


def config_section(name: str) -> dict:
  """The `task` keys of a fine-tuning config for task `name`, each commented once where it is defined."""
  return {**sections.name(name), **TASKS.config_section(name)}


def build_task(config, tokenizer=None) -> Task:
  """The task a training config names (`config.task.name`; pretraining for configs without a task section),
  with its data read and featurised by `tokenizer`; without one, its shapes and losses only."""
  name = config.task.name if "task" in config else Pretraining.kinds[0]
  cls = TASKS.for_config(config.task) if "task" in config else Pretraining
  if cls is None:
    raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS.config_names())} "
                     "(`local` trains on your own files: --config.task.train_file=... ).")
  if "task" in config:
    TASKS.check_keys(config.task)
  return cls.from_config(config, tokenizer)  # a fine-tuning task lays out its batches from config.data itself


def architecture_source(config) -> tuple[str | None, dict]:
  """(checkpoint, shape fields it changes) whose architecture and tokenizer the run takes (`Task.architecture_source`:
  `init_from`, or a distillation's teacher)."""
  cls = TASKS.for_config(config.task) if "task" in config else None
  return (cls or Task).architecture_source(config)


def for_model(folder) -> tuple[type[PredictingTask], str] | None:
  """(class, kind) of the fine-tuned model in `folder` (`jbert.inference.folder.ModelFolder`): the kind its
  config.json records where jbert trained it, else the first class serving its head that recognises it
  (transformers' and sentence-transformers' folders); None for a model no task serves."""
  info = folder.info
  if info.head is None:
    return None
  if info.task in TASKS.kinds():
    cls = TASKS.get(info.task)
    if cls.head.architecture == info.head.architecture:
      return (cls, info.task) if cls.predicts else None
  for cls in TASKS.for_head(info.head.architecture):
    kind = cls.recognises(folder)
    if kind is not None:
      return cls, kind
  return None


__all__ = ["MODEL_INPUTS", "TASKS", "architecture_source", "CrossEncoder", "EvalSet", "FinetuneTask", "MultipleChoice", "PredictingTask",
           "Pretraining", "QuestionAnswering", "SequenceClassification", "Task", "TokenClassification", "Weighted",
           "build_task", "config_section", "for_model", "reported", "softmax", "training_loss"]
