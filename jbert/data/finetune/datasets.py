"""Registry of fine-tuning tasks: where their data lives, how to featurise it and how to score it."""
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import os
from typing import Any

import numpy as np

from jbert.data import sources
from jbert.data.finetune import classification
from jbert.data.finetune import local
from jbert.data.finetune import multiple_choice
from jbert.data.finetune import ner
from jbert.data.finetune import sentence_pairs
from jbert.data.finetune import squad


@dataclasses.dataclass(frozen=True)
class Dataset:
  """One fine-tuning task.

  Attributes:
    name: registry name.
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


_GLUE_SPLITS = {"train": "train", "validation": "validation", "test": "test"}


def _glue(name: str, text_keys: tuple[str, ...], label_names: tuple[str, ...] | None,
          metrics: tuple[str, ...] = ("accuracy",), *, config: str | None = None,
          splits: Mapping[str, str] = _GLUE_SPLITS, eval_splits: tuple[str, ...] = ("validation",)) -> Dataset:
  regression = label_names is None
  return Dataset(
      name=name, kind="regression" if regression else "classification",
      tfds_name=f"glue/{config or name}", splits=splits, eval_splits=eval_splits, text_keys=text_keys,
      label_key="label", num_labels=1 if regression else len(label_names), label_names=label_names,
      metrics=metrics,
      features=functools.partial(classification.classification_features, text_keys=text_keys, regression=regression))


_NLI = ("entailment", "neutral", "contradiction")
_MNLI_SPLITS = {"train": "train", "validation_matched": "validation_matched",
                "validation_mismatched": "validation_mismatched", "test_matched": "test_matched",
                "test_mismatched": "test_mismatched"}


def _squad(name: str, config: str, version_2_with_negative: bool) -> Dataset:
  return Dataset(
      name=name, kind="question_answering", tfds_name=f"squad/{config}",
      splits={"train": "train", "validation": "validation"}, eval_splits=("validation",),
      text_keys=("question", "context"), label_key="answers", num_labels=2, label_names=None,
      metrics=("exact_match", "f1"), features=squad.squad_features,
      version_2_with_negative=version_2_with_negative)


DATASETS: dict[str, Dataset] = {t.name: t for t in (
    _glue("cola", ("sentence",), ("unacceptable", "acceptable"), ("matthews_corr",)),
    _glue("sst2", ("sentence",), ("negative", "positive")),
    _glue("mrpc", ("sentence1", "sentence2"), ("not_equivalent", "equivalent"), ("accuracy", "f1")),
    _glue("qqp", ("question1", "question2"), ("not_duplicate", "duplicate"), ("accuracy", "f1")),
    _glue("stsb", ("sentence1", "sentence2"), None, ("pearson", "spearman")),
    _glue("mnli", ("premise", "hypothesis"), _NLI, splits=_MNLI_SPLITS,
          eval_splits=("validation_matched", "validation_mismatched")),
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
    _squad("squad", "v1.1", version_2_with_negative=False),
    _squad("squad_v2", "v2.0", version_2_with_negative=True),
    # Test is scored too: the BERT paper reports CoNLL-2003 test F1.
    Dataset(name="conll2003", kind="ner", tfds_name="conll2003",
         splits={"train": "train", "validation": "dev", "test": "test"}, eval_splits=("validation", "test"),
         text_keys=("tokens",), label_key="ner", num_labels=len(ner.CONLL2003_NER_TAGS),
         label_names=ner.CONLL2003_NER_TAGS, metrics=("precision", "recall", "f1"),
         features=functools.partial(ner.ner_features, tokens_key="tokens", tags_key="ner")),
    # Not in the TFDS catalogue: the files of github.com/rowanz/swagaf (data/), named as released.
    Dataset(name="swag", kind="multiple_choice", tfds_name=None,
         splits={"train": "train.csv", "validation": "val.csv", "test": "test.csv"}, eval_splits=("validation",),
         text_keys=("context", "endings"), label_key="label", num_labels=1, label_names=None,
         metrics=("accuracy",), features=multiple_choice.multiple_choice_features),
    Dataset(name="hellaswag", kind="multiple_choice", tfds_name="hellaswag",
         splits={"train": "train", "validation": "validation", "test": "test"}, eval_splits=("validation",),
         text_keys=("context", "endings"), label_key="label", num_labels=1, label_names=None,
         metrics=("accuracy",), features=multiple_choice.multiple_choice_features),
    # Bi-encoders (Sentence-BERT) on the user's files (task.train_file / eval_file): the objective is the kind.
    *(Dataset(name=kind, kind=kind, tfds_name=None, splits={}, eval_splits=("validation",),
              text_keys=("text_a", "text_b", "text_c"), label_key="label", num_labels=1, label_names=None,
              metrics=metrics, features=sentence_pairs.sentence_features)
      for kind, metrics in (("sts_cosine", ("spearman", "pearson")), ("nli_softmax", ("accuracy",)),
                            ("mnrl", ("mrr@10", "ndcg@10", "recall@1", "recall@10")), ("triplet", ("accuracy",)))),
)}


def get_dataset(name: str) -> Dataset:
  """The registered task `name`."""
  if name not in DATASETS:
    raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(DATASETS))} (or build one with "
                     "local_dataset for your own files).")
  return DATASETS[name]


def local_dataset(name: str, files: Mapping[str, str | os.PathLike], column_map: Mapping[str, str],
               label_list: Sequence[str] | None = None, metrics: Sequence[str] | None = None) -> Dataset:
  """A classification (or, without `label_list`, regression) task over local CSV/TSV/JSONL files.

  Args:
    name: task name.
    files: logical split -> file path, e.g. {"train": "train.tsv", "validation": "dev.tsv"}.
    column_map: canonical key (text_a, text_b, label) -> column name, as in `local.read_examples`.
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
      features=functools.partial(classification.classification_features, text_keys=text_keys, regression=regression,
                                 label_key="label" if "label" in column_map else None),
      column_map=dict(column_map))


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


def ner_files_dataset(name: str, files: Mapping[str, str], label_names: Sequence[str]) -> Dataset:
  """NER over local files (CoNLL columns, or JSON lines with `tokens` and `tags`); every split with tags is
  scored."""
  return Dataset(
      name=name, kind="ner", tfds_name=None, splits=dict(files), eval_splits=tuple(s for s in files if s != "train"),
      text_keys=("tokens",), label_key="tags", num_labels=len(label_names), label_names=tuple(label_names),
      metrics=("precision", "recall", "f1"),
      features=functools.partial(ner.ner_features, tokens_key="tokens", tags_key="tags"))


def multiple_choice_files_dataset(name: str, files: Mapping[str, str]) -> Dataset:
  """Multiple choice over local files (JSON lines with `context`, `endings`, `label`, or SWAG's CSV)."""
  return Dataset(
      name=name, kind="multiple_choice", tfds_name=None, splits=dict(files),
      eval_splits=tuple(s for s in files if s != "train"), text_keys=("context", "endings"), label_key="label",
      num_labels=1, label_names=None, metrics=("accuracy",),
      features=multiple_choice.multiple_choice_features)
