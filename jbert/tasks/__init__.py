"""Tasks the shared trainer runs, and `jbert.predict` serves: pretraining and fine-tuning problems.

One registry, one name per kind of task, used by the config, the trainer, prediction and the files:

  KINDS                   kind -> task class (each class one module: its config keys, featurisation, batch
                          spec, losses, per-row outputs, records, prediction and submission files)
  build_task(config, tok) the task a training config names, holding its data (without a tokenizer: shapes and
                          losses only, for AOT compilation and benchmarks)
  config_section(name)    the `task` keys of `configs/finetune.py:NAME`
  for_head(architecture)  the task class of a fine-tuned head; `for_prediction` builds it for `jbert.predict`

A dataset (`jbert.data.finetune.datasets`) says where a task's data lives and how it is scored; its `kind`
picks the class. A new task is one module with a `FinetuneTask` subclass (`from_config`, `for_prediction`,
`featurise`, the losses, `predictions`, `records`, `evaluate`, `write_outputs`) plus its line in KINDS and its
datasets' lines in `DATASETS`.
"""
from __future__ import annotations

import ml_collections

from jbert.data import packing
from jbert.data.finetune import datasets
from jbert.tasks import classification, cross_encoder, question_answering, sentence_embedding
from jbert.tasks.base import MODEL_INPUTS, EvalSet, FinetuneTask, Stream, Task, softmax
from jbert.tasks.classification import SequenceClassification
from jbert.tasks.multiple_choice import MultipleChoice
from jbert.tasks.pretraining import Pretraining
from jbert.tasks.question_answering import QuestionAnswering
from jbert.tasks.token_classification import TokenClassification

KINDS: dict[str, type[Task]] = {
    "classification": SequenceClassification, "regression": SequenceClassification,
    "ner": TokenClassification, "question_answering": QuestionAnswering, "multiple_choice": MultipleChoice,
    **sentence_embedding.KINDS,  # bi-encoders: sts_cosine, nli_softmax, mnrl, triplet
}
# `local` files of another kind than classification (`task.kind`).
LOCAL_KINDS = ("classification", "ner", "multiple_choice")


def trainable_tasks() -> list[str]:
  return sorted([n for n, d in datasets.DATASETS.items()
                 if d.kind in KINDS and (d.splits.get("train") or d.kind in sentence_embedding.KINDS)]
                + ["cross_encoder", "local"])


def for_head(architecture: str) -> type[FinetuneTask] | None:
  """The task class whose head is `architecture` (a config.json `architectures` entry), None for other heads."""
  return next((cls for cls in KINDS.values() if cls.head.architecture == architecture), None)


def for_prediction(architecture: str, *, label_names: tuple[str, ...] | None, max_seq_length: int, tokenizer,
                   **settings) -> FinetuneTask:
  """The task of a fine-tuned head, without data, for `jbert.predict` (see each class's `for_prediction`)."""
  cls = for_head(architecture)
  if cls is None:
    raise ValueError(f"{architecture} is not a fine-tuned head; one of "
                     f"{', '.join(dict.fromkeys(c.head.architecture for c in KINDS.values()))}.")
  return cls.for_prediction(label_names=label_names, max_seq_length=max_seq_length, tokenizer=tokenizer, **settings)


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
  if kind in sentence_embedding.KINDS:
    return {**task, **sentence_embedding.config_section(kind)}
  # NER and multiple choice read the same column keys: `local` picks its kind by `task.kind`.
  columns = classification.config_section()
  if name == "cross_encoder":  # Pairs and a one-logit loss: no classes, kinds or regression switch.
    columns = {**{k: columns[k] for k in ("text_a", "text_b", "label")}, **cross_encoder.config_section()}
  return {**task, **files, **columns}


def _optional(field_type):
  return ml_collections.FieldReference(None, field_type=field_type)


def build_task(config, tokenizer=None) -> Task:
  """The task a training config names (`config.task.name`; pretraining for configs without a task section),
  with its data read and featurised by `tokenizer`; without one, its shapes and losses only."""
  if "task" not in config or config.task.name == "pretraining":
    if tokenizer is None:
      # nsp None: phase 2 before init_from's settings are read (AOT compiles); BERT's phase 2 has NSP.
      return Pretraining(nsp=config.data.nsp is not False, max_predictions=config.data.max_predictions_per_seq,
                         packed=packing.Layout.from_config(config.data))
    return Pretraining.from_config(config, tokenizer)
  name = config.task.name
  if name == "cross_encoder":
    return _batching(SequenceClassification.from_config(None, config, tokenizer), config)
  if name == "local":
    kind = config.task.get("kind", "classification")
    if kind not in LOCAL_KINDS:
      raise ValueError(f"task.kind={kind!r}; local files are {', '.join(LOCAL_KINDS)}.")
    return _batching(KINDS[kind].from_config(None, config, tokenizer), config)
  if name not in datasets.DATASETS or datasets.DATASETS[name].kind not in KINDS:
    raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(trainable_tasks())} "
                     "(`local` trains on your own files: --config.task.train_file=... ).")
  dataset = datasets.get_dataset(name)
  return _batching(KINDS[dataset.kind].from_config(dataset, config, tokenizer), config)


def _batching(task: Task, config) -> Task:
  """`data.bucketing` (default on) of a fine-tuning task."""
  if isinstance(task, FinetuneTask):
    task.bucketing = bool(config.data.get("bucketing", True))
  return task


__all__ = ["KINDS", "LOCAL_KINDS", "MODEL_INPUTS", "EvalSet", "FinetuneTask", "MultipleChoice", "Pretraining",
           "QuestionAnswering", "SequenceClassification", "Stream", "Task", "TokenClassification", "build_task",
           "config_section", "for_head", "for_prediction", "softmax", "trainable_tasks"]
