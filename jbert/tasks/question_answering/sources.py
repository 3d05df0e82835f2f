"""The datasets question answering trains by name: SQuAD v1.1 and v2.0 from TFDS."""
from jbert.tasks.question_answering import features
from jbert.tasks.sources import Dataset


# The paper's SQuAD recipe: 384-token windows, lr 3e-5, 2 epochs.
_RECIPE = {"data.max_seq_length": 384, "optim.learning_rate": 3e-5, "num_epochs": 2.0}


def _squad(name: str, config: str, version_2_with_negative: bool) -> Dataset:
  return Dataset(
      name=name, kind="question_answering", tfds_name=f"squad/{config}",
      splits={"train": "train", "validation": "validation"}, eval_splits=("validation",),
      text_keys=("question", "context"), label_key="answers", num_labels=2, label_names=None,
      metrics=("exact_match", "f1"), features=features.squad_features,
      version_2_with_negative=version_2_with_negative, recipe=_RECIPE)


DATASETS: dict[str, Dataset] = {t.name: t for t in (
    _squad("squad", "v1.1", version_2_with_negative=False),
    _squad("squad_v2", "v2.0", version_2_with_negative=True),
)}
