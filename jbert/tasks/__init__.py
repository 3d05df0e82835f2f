"""Tasks the shared trainer runs, and `jbert.predict` serves: pretraining and fine-tuning problems.

One registry, one name per kind of task, used by the config, the trainer, prediction and the files:

  KINDS                   kind -> task class (each class one module: its featurisation, batch spec, losses,
                          per-row outputs, records, prediction files)
  build_task(config, tok) the task a training config names, holding its data (without a tokenizer: shapes and
                          losses only, for AOT compilation and benchmarks)
  config_section(name)    the `task` keys of `configs/finetune.py:NAME`
  for_head(architecture)  the task class of a fine-tuned head; `for_prediction` builds it for `jbert.predict`

A dataset (`jbert.data.finetune.datasets`) says where a task's data lives and how it is scored; its `kind`
picks the class.
"""
from __future__ import annotations

import dataclasses
import os

import ml_collections

from jbert.data.finetune import datasets
from jbert.tasks.base import MODEL_INPUTS, EvalSet, FinetuneTask, Stream, Task, softmax
from jbert.tasks.classification import SequenceClassification
from jbert.tasks.multiple_choice import MultipleChoice
from jbert.tasks.pretraining import Pretraining
from jbert.tasks.question_answering import QuestionAnswering
from jbert.tasks import question_answering
from jbert.tasks.token_classification import TokenClassification

KINDS: dict[str, type[Task]] = {
    "classification": SequenceClassification, "regression": SequenceClassification,
    "ner": TokenClassification, "question_answering": QuestionAnswering, "multiple_choice": MultipleChoice,
}
# `local` files of another kind than classification (`task.kind`).
LOCAL_KINDS = ("classification", "ner", "multiple_choice")


def trainable_tasks() -> list[str]:
  return sorted([n for n, d in datasets.DATASETS.items() if d.kind in KINDS and d.splits.get("train")] + ["local"])


def for_head(architecture: str) -> type[FinetuneTask] | None:
  """The task class whose head is `architecture` (a config.json `architectures` entry), None for other heads."""
  return next((cls for cls in KINDS.values() if cls.head.architecture == architecture), None)


def for_prediction(architecture: str, *, label_names: tuple[str, ...] | None, max_seq_length: int, tokenizer,
                   **settings) -> FinetuneTask:
  """The task of a fine-tuned head, without data, for `jbert.predict`: `label_names` None makes a one-label
  sequence classifier a regressor; `settings` are question answering's (`question_answering.SETTINGS` and
  `version_2_with_negative`)."""
  cls = for_head(architecture)
  if cls is None:
    raise ValueError(f"{architecture} is not a fine-tuned head; one of "
                     f"{', '.join(sorted({c.head.architecture for c in KINDS.values()}))}.")
  # Datasets without splits: the tokenizer featurises prediction inputs only.
  common = {"max_seq_length": max_seq_length, "tokenizer": tokenizer}
  if cls is SequenceClassification:
    return cls(datasets.local_dataset("predict", {}, {"text_a": "text_a"}, label_names), **common)
  if cls is TokenClassification:
    return cls(datasets.ner_files_dataset("predict", {}, label_names), **common)
  if cls is QuestionAnswering:
    return cls(dataclasses.replace(datasets.get_dataset("squad"), splits={}), **common, **settings)
  return cls(datasets.multiple_choice_files_dataset("predict", {}), **common)


def config_section(name: str) -> dict:
  """The `task` keys of a fine-tuning config for task `name`, each commented once here or in its task module."""
  files = {
      "tfds_data_dir": _optional(str),        # TFDS data dir; None: TFDS's default (~/tensorflow_datasets)
      # -- local files: CSV, TSV (unquoted, as GLUE's) or JSONL by suffix; SQuAD JSON; CoNLL columns --
      "train_file": _optional(str),           # training examples
      "eval_file": _optional(str),            # evaluation examples; without the label column: predicted only
      "test_file": _optional(str),            # examples to predict (labels, if any, are scored too)
  }
  task = {"name": name}                       # GLUE task, squad(_v2), conll2003, swag, hellaswag, or `local`
  kind = datasets.DATASETS[name].kind if name in datasets.DATASETS else "classification"
  if kind == "question_answering":
    return {**task, **files, **question_answering.config_section()}
  columns = {
      "text_a": _optional(str),               # column of the first text
      "text_b": _optional(str),               # column of the second text of a pair; None: single texts
      "label": _optional(str),                # column of the label
      "label_names": "",                      # comma-separated class names in id order; empty: regression
                                              # (NER: the tag set; empty: the training file's tags)
      "kind": "classification",               # local files: classification | ner | multiple_choice
  }
  return {**task, **files, **columns}


def _optional(field_type):
  return ml_collections.FieldReference(None, field_type=field_type)


def build_task(config, tokenizer=None) -> Task:
  """The task a training config names (`config.task.name`; pretraining for configs without a task section),
  with its data read and featurised by `tokenizer`; without one, its shapes and losses only."""
  if "task" not in config or config.task.name == "pretraining":
    if tokenizer is None:
      return Pretraining(nsp=config.data.nsp, max_predictions=config.data.max_predictions_per_seq)
    return Pretraining.from_config(config, tokenizer)
  name = config.task.name
  if name == "local":
    kind = config.task.get("kind", "classification")
    if kind not in LOCAL_KINDS:
      raise ValueError(f"task.kind={kind!r}; local files are {', '.join(LOCAL_KINDS)}.")
    if kind != "classification":
      return KINDS[kind].from_config(None, config, tokenizer)
    dataset = local_dataset(config.task)
  elif name not in datasets.DATASETS or datasets.DATASETS[name].kind not in KINDS:
    raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(trainable_tasks())} "
                     "(`local` trains on your own files: --config.task.train_file=... ).")
  else:
    dataset = datasets.get_dataset(name)
  if dataset.kind in ("classification", "regression"):
    # A model fine-tuned on MNLI also scores the GLUE diagnostic set (AX.tsv), as the GLUE server expects.
    extra = (datasets.get_dataset("ax"),) if name == "mnli" else ()
    return SequenceClassification(dataset, max_seq_length=config.data.max_seq_length,
                                  global_batch_size=config.batch_size, seed=config.seed, tokenizer=tokenizer,
                                  data_dir=config.task.tfds_data_dir, extra_test=extra)
  return KINDS[dataset.kind].from_config(dataset, config, tokenizer)


def local_dataset(task_cfg) -> datasets.Dataset:
  """`local` classification: the user's CSV/TSV/JSONL files with the columns the config names."""
  if not task_cfg.train_file:
    raise ValueError("task local needs --config.task.train_file=FILE (CSV, TSV or JSONL by suffix).")
  files = {"train": task_cfg.train_file}
  for split, path in (("validation", task_cfg.eval_file), ("test", task_cfg.test_file)):
    if path:
      files[split] = path
  for split, path in files.items():
    if not os.path.isfile(path):
      raise FileNotFoundError(f"task local: the {split} file {path} does not exist.")
    if os.path.splitext(path)[1].lower() not in datasets.local.FORMATS:
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
  return datasets.local_dataset("local", files, columns, names or None)


__all__ = ["KINDS", "LOCAL_KINDS", "MODEL_INPUTS", "EvalSet", "FinetuneTask", "MultipleChoice", "Pretraining",
           "QuestionAnswering", "SequenceClassification", "Stream", "Task", "TokenClassification", "build_task",
           "config_section", "for_head", "for_prediction", "local_dataset", "softmax", "trainable_tasks"]
