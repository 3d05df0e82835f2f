"""Tasks the shared trainer runs: pretraining and fine-tuning problems (see `jbert.tasks.base`)."""
from __future__ import annotations

import os

from jbert.data import finetune
from jbert.tasks.base import MODEL_INPUTS, EvalSet, Stream, Task
from jbert.tasks.classification import SequenceClassification
from jbert.tasks.multiple_choice import MultipleChoice
from jbert.tasks.pretraining import Pretraining
from jbert.tasks.question_answering import QuestionAnswering
from jbert.tasks.token_classification import TokenClassification

# Data-task kind (`jbert.data.finetune.Task.kind`) -> the trainer's task class.
BY_KIND = {"classification": SequenceClassification, "regression": SequenceClassification,
           "ner": TokenClassification, "multiple_choice": MultipleChoice, "squad": QuestionAnswering}
# `local` files of another kind than classification (`task.kind`): the class reads them itself.
LOCAL_KINDS = {"ner": TokenClassification, "multiple_choice": MultipleChoice}


def trainable_tasks() -> list[str]:
  return sorted([n for n, t in finetune.TASKS.items() if t.kind in BY_KIND and t.splits.get("train")] + ["local"])


def build_task(config) -> Task:
  """The task a training config names: `config.task.name`, or pretraining for configs without a task section."""
  if "task" not in config or config.task.name == "pretraining":
    return Pretraining(config)
  name = config.task.name
  kind = config.task.get("kind", "classification")
  if name == "local" and kind != "classification":
    if kind not in LOCAL_KINDS:
      raise ValueError(f"task.kind={kind!r}; local files are classification, {', '.join(LOCAL_KINDS)}.")
    return LOCAL_KINDS[kind](None, config)
  if name == "local":
    data_task = local_data_task(config.task)
  else:
    if name not in finetune.TASKS or finetune.TASKS[name].kind not in BY_KIND:
      raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(trainable_tasks())} "
                       "(`local` trains on your own files: --config.task.train_file=... ).")
    data_task = finetune.get_task(name)
  # A model fine-tuned on MNLI also scores the GLUE diagnostic set (AX.tsv), as the GLUE server expects.
  extra = (finetune.get_task("ax"),) if name == "mnli" else ()
  return BY_KIND[data_task.kind](data_task, config, extra_test_tasks=extra)


def local_data_task(task_cfg) -> finetune.Task:
  """`local`: the user's CSV/TSV/JSONL files with the columns the config names."""
  if not task_cfg.train_file:
    raise ValueError("task local needs --config.task.train_file=FILE (CSV, TSV or JSONL by suffix).")
  files = {"train": task_cfg.train_file}
  for split, path in (("validation", task_cfg.eval_file), ("test", task_cfg.test_file)):
    if path:
      files[split] = path
  for split, path in files.items():
    if not os.path.isfile(path):
      raise FileNotFoundError(f"task local: the {split} file {path} does not exist.")
    if os.path.splitext(path)[1].lower() not in finetune.local.FORMATS:
      raise ValueError(f"task local: cannot tell the format of {path} from its suffix; name it .csv, .tsv or "
                       ".jsonl.")
  if not task_cfg.text_a or not task_cfg.label:
    raise ValueError("task local needs --config.task.text_a=COLUMN and --config.task.label=COLUMN "
                     "(and --config.task.text_b=COLUMN for sentence pairs).")
  columns = {"text_a": task_cfg.text_a, "label": task_cfg.label}
  if task_cfg.text_b:
    columns["text_b"] = task_cfg.text_b
  names = [n.strip() for n in (task_cfg.label_names or "").split(",") if n.strip()]
  if len(names) == 1:
    raise ValueError(f"task.label_names={task_cfg.label_names!r} names one class; give at least two "
                     "comma-separated names, or leave it empty for regression.")
  return finetune.local_task("local", files, columns, names or None)


__all__ = ["BY_KIND", "LOCAL_KINDS", "MODEL_INPUTS", "EvalSet", "MultipleChoice", "Pretraining",
           "QuestionAnswering", "SequenceClassification", "Stream", "Task", "TokenClassification", "build_task",
           "local_data_task", "trainable_tasks"]
