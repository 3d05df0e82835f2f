"""The datasets multiple choice trains by name (SWAG's released files, HellaSwag from TFDS), and the user's files."""
from collections.abc import Mapping

from jbert.tasks.multiple_choice import features
from jbert.tasks.sources import Dataset

# The paper's SWAG recipe: batch 16 (examples of 4 endings each), lr 2e-5, 3 epochs.
_RECIPE = {"batch_size": 16}

DATASETS: dict[str, Dataset] = {t.name: t for t in (
    # Not in the TFDS catalogue: the files of github.com/rowanz/swagaf (data/), named as released.
    Dataset(name="swag", kind="multiple_choice", tfds_name=None,
            splits={"train": "train.csv", "validation": "val.csv", "test": "test.csv"}, eval_splits=("validation",),
            text_keys=("context", "endings"), label_key="label", num_labels=1, label_names=None,
            metrics=("accuracy",), features=features.multiple_choice_features, recipe=_RECIPE),
    Dataset(name="hellaswag", kind="multiple_choice", tfds_name="hellaswag",
            splits={"train": "train", "validation": "validation", "test": "test"}, eval_splits=("validation",),
            text_keys=("context", "endings"), label_key="label", num_labels=1, label_names=None,
            metrics=("accuracy",), features=features.multiple_choice_features, recipe=_RECIPE),
)}


def multiple_choice_files_dataset(name: str, files: Mapping[str, str]) -> Dataset:
  """Multiple choice over local files (JSON lines with `context`, `endings`, `label`, or SWAG's CSV)."""
  return Dataset(
      name=name, kind="multiple_choice", tfds_name=None, splits=dict(files),
      eval_splits=tuple(s for s in files if s != "train"), text_keys=("context", "endings"), label_key="label",
      num_labels=1, label_names=None, metrics=("accuracy",),
      features=features.multiple_choice_features)
