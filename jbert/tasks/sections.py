"""`task` config keys that several task modules share: where the data lives, and the columns of local files.

Each task class's `config_section(name)` composes its section from these and its own keys; `jbert.tasks.
config_section(name)` adds `name`. Every key is commented once, here or in its task module.
"""
from __future__ import annotations

import ml_collections


def optional(field_type, default=None) -> ml_collections.FieldReference:
  """A key that may stay None (locked configs need its type up front)."""
  return ml_collections.FieldReference(default, field_type=field_type)


def name(value: str) -> dict:
  return {"name": value}                      # GLUE task, squad(_v2), conll2003, swag, hellaswag, or `local`


def files() -> dict:
  """Where a task's data lives: TFDS, or the user's files."""
  return {
      "tfds_data_dir": optional(str),         # TFDS data dir; None: TFDS's default (~/tensorflow_datasets)
      # -- local files: CSV, TSV (unquoted, as GLUE's) or JSONL by suffix; SQuAD JSON; CoNLL columns --
      "train_file": optional(str),            # training examples
      "eval_file": optional(str),             # evaluation examples; without the label column: predicted only
      "test_file": optional(str),             # examples to predict (labels, if any, are scored too)
  }


def files_ignored(datasets, task_cfg) -> dict[str, str]:
  """The `files()` keys a task's run does not read, with why: a named TFDS dataset (in `datasets`) reads its own
  splits unless task.train_file is set; local files need no TFDS data dir."""
  dataset = datasets.get(task_cfg.name)
  if dataset is not None and dataset.tfds_name is not None and not task_cfg.train_file:
    return dict.fromkeys(("eval_file", "test_file"), f"{dataset.name} reads TFDS's splits unless task.train_file "
                                                     "is set")
  return {"tfds_data_dir": "its data are local files (task.train_file, ...), not TFDS"}


def columns() -> dict:
  """The columns of local files (classification; NER's and multiple choice's `local` files read the same keys)."""
  return {
      "text_a": optional(str),                # column of the first text
      "text_b": optional(str),                # column of the second text of a pair; None: single texts
      "label": optional(str),                 # column of the label
      "label_names": "",                      # comma-separated class names in id order (integer labels 0..N-1
                                              # are ids into it); empty: integer labels are classes named by
                                              # their values, other numbers a regression target
                                              # (NER: the tag set; empty: the training file's tags)
      "regression": False,                    # local files: True trains a regressor on numeric labels
      "kind": "classification",               # local files: classification | ner | multiple_choice
  }
