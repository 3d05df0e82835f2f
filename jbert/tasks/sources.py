"""Where a fine-tuning task's examples come from: a `Dataset` (TFDS splits or the user's files, how they are
featurised and scored), and what every task's reader needs of a raw example.

Each task family declares its named datasets in its own package (`<family>/sources.py`, the class's `datasets`);
`jbert.tasks.TASKS.datasets()` gathers them.
"""
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import os
from typing import Any

import numpy as np

from jbert.data import local
from jbert.data import sources


@dataclasses.dataclass(frozen=True)
class Dataset:
  """The data of one fine-tuning task.

  Attributes:
    name: the name `task.name` trains it by (a family's declaration), or the user's files' task name.
    kind: "classification", "regression", "question_answering", "ner", "multiple_choice", or a bi-encoder
      objective ("sts_cosine", "nli_softmax", "mnrl", "triplet").
    tfds_name: TFDS `name/config` (None for local files).
    splits: logical split name -> TFDS split name (or file path for local tasks).
    eval_splits: the logical splits that fine-tuning evaluates on.
    text_keys: example fields that hold the input text.
    label_key: example field of the label (None when there is none).
    num_labels: classifier outputs (1 for regression and multiple choice; 2 for the SQuAD start/end logits).
    label_names: class names in label-id order (None for regression, SQuAD and multiple choice).
    metrics: names of the reported metrics.
    features: `features(examples, tokenizer, max_seq_length, **kwargs) -> dict[str, np.ndarray]`.
    version_2_with_negative: SQuAD v2.0 (questions may have no answer).
    column_map: for local files, canonical key (text_a, text_b, label) -> column name.
    recipe: the dataset's departures from the fine-tuning recipe (`jbert.train.finetune_config`), dotted config
      keys -> values: the paper's settings for SQuAD and SWAG, sparser evaluation on the largest GLUE sets.
  """
  name: str
  kind: str
  tfds_name: str | None
  splits: Mapping[str, str]
  eval_splits: tuple[str, ...]
  text_keys: tuple[str, ...]
  label_key: str | None
  num_labels: int
  label_names: tuple[str, ...] | None
  metrics: tuple[str, ...]
  features: Callable[..., dict[str, np.ndarray]]
  version_2_with_negative: bool = False
  column_map: Mapping[str, str] | None = None
  recipe: Mapping[str, Any] = dataclasses.field(default_factory=dict)

  def load(self, split: str, data_dir: str | None = None) -> Sequence[Mapping[str, Any]]:
    """Random-access examples of a logical split (TFDS `data_source`, or the parsed local file)."""
    if split not in self.splits:
      raise ValueError(f"task {self.name!r} has no split {split!r}; it has {sorted(self.splits)}.")
    if self.tfds_name is None:
      return local.read_examples(self.splits[split], self.column_map, self.label_names)
    # Registers glue and conll2003 with tfds when TensorFlow is absent (squad registers itself).
    import tensorflow_datasets.text  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    # Never downloads at run time: data is prepared once, ahead of training; a missing dataset is one
    # FileNotFoundError with the `tfds build ... --file_format=array_record` command.
    return sources.tfds_data_source(self.tfds_name, self.splits[split], data_dir, name_key=f"task {self.name}")


def split_files(task_name: str, paths: Mapping[str, str | os.PathLike | None]) -> dict[str, str]:
  """The splits of `paths` that are given (a training file is required), each checked to exist."""
  files = {split: os.fspath(path) for split, path in paths.items() if path}
  if "train" not in files:
    raise ValueError(f"task {task_name}: no training file; name one (train, and optionally validation and test "
                     "files).")
  for split, path in files.items():
    if not os.path.isfile(path):
      raise FileNotFoundError(f"task {task_name}: the {split} file {path} does not exist.")
  return files


def as_text(value: Any) -> str:
  """Text from TFDS: `str` from mocks, `bytes` from real record files."""
  if isinstance(value, np.ndarray):
    value = value.item()
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def require_keys(example: Mapping[str, Any], keys: Sequence[str]) -> None:
  """Raises a KeyError naming the missing fields and the available ones."""
  missing = [k for k in keys if k not in example]
  if missing:
    raise KeyError(f"examples lack field(s) {missing}; available: {sorted(example)}.")
