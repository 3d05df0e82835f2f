"""The datasets token classification trains by name (CoNLL-2003 from TFDS), and the user's tagged files."""
from collections.abc import Mapping, Sequence
import functools

from jbert.tasks.sources import Dataset
from jbert.tasks.token_classification import features

DATASETS: dict[str, Dataset] = {t.name: t for t in (
    # Test is scored too: the BERT paper reports CoNLL-2003 test F1.
    Dataset(name="conll2003", kind="ner", tfds_name="conll2003",
            splits={"train": "train", "validation": "dev", "test": "test"}, eval_splits=("validation", "test"),
            text_keys=("tokens",), label_key="ner", num_labels=len(features.CONLL2003_NER_TAGS),
            label_names=features.CONLL2003_NER_TAGS, metrics=("precision", "recall", "f1"),
            features=functools.partial(features.ner_features, tokens_key="tokens", tags_key="ner")),
)}


def ner_files_dataset(name: str, files: Mapping[str, str], label_names: Sequence[str]) -> Dataset:
  """NER over local files (CoNLL columns, or JSON lines with `tokens` and `tags`); every split with tags is
  scored."""
  return Dataset(
      name=name, kind="ner", tfds_name=None, splits=dict(files), eval_splits=tuple(s for s in files if s != "train"),
      text_keys=("tokens",), label_key="tags", num_labels=len(label_names), label_names=tuple(label_names),
      metrics=("precision", "recall", "f1"),
      features=functools.partial(features.ner_features, tokens_key="tokens", tags_key="tags"))
