"""The datasets sequence classification trains by name (GLUE, from TFDS), and the user's own files (`local`)."""
from collections.abc import Mapping, Sequence
import functools
import os
from typing import Any

from jbert.tasks.classification import features
from jbert.tasks.sources import Dataset

_GLUE_SPLITS = {"train": "train", "validation": "validation", "test": "test"}


def _glue(name: str, text_keys: tuple[str, ...], label_names: tuple[str, ...] | None,
          metrics: tuple[str, ...] = ("accuracy",), *, config: str | None = None,
          splits: Mapping[str, str] = _GLUE_SPLITS, eval_splits: tuple[str, ...] = ("validation",),
          recipe: Mapping[str, Any] | None = None) -> Dataset:
  regression = label_names is None
  return Dataset(
      name=name, kind="regression" if regression else "classification",
      tfds_name=f"glue/{config or name}", splits=splits, eval_splits=eval_splits, text_keys=text_keys,
      label_key="label", num_labels=1 if regression else len(label_names), label_names=label_names,
      metrics=metrics, recipe=recipe or {},
      features=functools.partial(features.classification_features, text_keys=text_keys, regression=regression))


_NLI = ("entailment", "neutral", "contradiction")
_LARGE = {"eval_every_steps": 5_000}  # the largest GLUE sets: tens of thousands of steps, evaluated every 5,000
_MNLI_SPLITS = {"train": "train", "validation_matched": "validation_matched",
                "validation_mismatched": "validation_mismatched", "test_matched": "test_matched",
                "test_mismatched": "test_mismatched"}

DATASETS: dict[str, Dataset] = {t.name: t for t in (
    _glue("cola", ("sentence",), ("unacceptable", "acceptable"), ("matthews_corr",)),
    _glue("sst2", ("sentence",), ("negative", "positive")),
    _glue("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("accuracy", "f1")),
    _glue("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), ("accuracy", "f1"), recipe=_LARGE),
    _glue("stsb", ("sentence1", "sentence2"), None, ("pearson", "spearman")),
    _glue("mnli", ("premise", "hypothesis"), _NLI, splits=_MNLI_SPLITS,
          eval_splits=("validation_matched", "validation_mismatched"), recipe=_LARGE),
    # MNLI restricted to one evaluation genre set, so that "validation" means one of them.
    _glue("mnli_matched", ("premise", "hypothesis"), _NLI, config="mnli",
          splits={"train": "train", "validation": "validation_matched", "test": "test_matched"}),
    _glue("mnli_mismatched", ("premise", "hypothesis"), _NLI, config="mnli",
          splits={"train": "train", "validation": "validation_mismatched", "test": "test_mismatched"}),
    _glue("qnli", ("question", "sentence"), ("entailment", "not_entailment")),
    _glue("rte", ("sentence1", "sentence2"), ("entailment", "not_entailment")),
    _glue("wnli", ("sentence1", "sentence2"), ("not_entailment", "entailment")),
    # The diagnostic set: test only, scored with a model fine-tuned on MNLI.
    _glue("ax", ("premise", "hypothesis"), _NLI, splits={"test": "test"}, eval_splits=()),
)}


def local_dataset(name: str, files: Mapping[str, str | os.PathLike], column_map: Mapping[str, str],
                  label_list: Sequence[str] | None = None, metrics: Sequence[str] | None = None) -> Dataset:
  """A classification (or, without `label_list`, regression) task over local CSV/TSV/JSONL files.

  Args:
    name: task name.
    files: logical split -> file path, e.g. {"train": "train.tsv", "validation": "dev.tsv"}.
    column_map: canonical key (text_a, text_b, label) -> column name, as in `jbert.data.local.read_examples`.
    label_list: class names in label-id order; None means float labels.
    metrics: metric names; accuracy (or pearson and spearman for regression) by default.

  Examples loaded by the task carry the canonical keys, which `features` reads.
  """
  regression = label_list is None
  text_keys = tuple(k for k in ("text_a", "text_b") if k in column_map)
  return Dataset(
      name=name, kind="regression" if regression else "classification", tfds_name=None,
      splits={k: os.fspath(v) for k, v in files.items()},
      eval_splits=tuple(k for k in files if k != "train"), text_keys=text_keys,
      label_key="label" if "label" in column_map else None, num_labels=1 if regression else len(label_list),
      label_names=tuple(label_list) if label_list is not None else None,
      metrics=tuple(metrics or (("pearson", "spearman") if regression else ("accuracy",))),
      features=functools.partial(features.classification_features, text_keys=text_keys, regression=regression,
                                 label_key="label" if "label" in column_map else None),
      column_map=dict(column_map))
