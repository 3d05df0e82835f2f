"""Where tasks' data come from: the datasets the task families declare by name (`TASKS.datasets()`), their
splits and loading, and the user's files."""
import pytest

from jbert.tasks import TASKS
from jbert.tasks.multiple_choice.sources import multiple_choice_files_dataset
from jbert.tasks.sources import split_files
from jbert.tasks.token_classification.sources import ner_files_dataset

DATASETS, get_dataset = TASKS.datasets(), TASKS.dataset

GLUE = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "ax")


def test_registry_holds_every_task():
  assert set(GLUE) | {"squad", "squad_v2", "conll2003", "mnli_matched", "mnli_mismatched", "swag",
                      "hellaswag", "sts_cosine", "nli_softmax", "mnrl", "triplet"} == set(DATASETS)
  for name in ("sts_cosine", "nli_softmax", "mnrl", "triplet"):  # your own files: no TFDS dataset behind them
    assert get_dataset(name).kind == name and get_dataset(name).tfds_name is None
  for name in GLUE:
    assert get_dataset(name).tfds_name == f"glue/{name}"


@pytest.mark.parametrize("name,kind,num_labels,metrics", [
    ("cola", "classification", 2, ("matthews_corr",)),
    ("sst2", "classification", 2, ("accuracy",)),
    ("mrpc", "classification", 2, ("accuracy", "f1")),
    ("qqp", "classification", 2, ("accuracy", "f1")),
    ("stsb", "regression", 1, ("pearson", "spearman")),
    ("mnli", "classification", 3, ("accuracy",)),
    ("rte", "classification", 2, ("accuracy",)),
    ("squad", "question_answering", 2, ("exact_match", "f1")),
    ("squad_v2", "question_answering", 2, ("exact_match", "f1")),
    ("conll2003", "ner", 9, ("precision", "recall", "f1")),
    ("swag", "multiple_choice", 1, ("accuracy",)),
    ("hellaswag", "multiple_choice", 1, ("accuracy",)),
])
def test_task_fields(name, kind, num_labels, metrics):
  task = get_dataset(name)
  assert (task.kind, task.num_labels, task.metrics) == (kind, num_labels, metrics)


def test_splits():
  assert get_dataset("mnli").eval_splits == ("validation_matched", "validation_mismatched")
  assert get_dataset("mnli_mismatched").splits["validation"] == "validation_mismatched"
  assert get_dataset("mnli_matched").tfds_name == "glue/mnli"
  assert dict(get_dataset("ax").splits) == {"test": "test"} and get_dataset("ax").eval_splits == ()
  assert get_dataset("conll2003").splits["validation"] == "dev"
  assert get_dataset("conll2003").eval_splits == ("validation", "test")  # the paper reports test F1
  assert get_dataset("swag").tfds_name is None and get_dataset("hellaswag").tfds_name == "hellaswag"
  assert (get_dataset("squad").tfds_name, get_dataset("squad_v2").tfds_name) == ("squad/v1.1", "squad/v2.0")
  assert not get_dataset("squad").version_2_with_negative and get_dataset("squad_v2").version_2_with_negative
  assert get_dataset("qnli").text_keys == ("question", "sentence")
  with pytest.raises(ValueError, match=r"task 'ax' has no split 'train'; it has \['test'\]"):
    get_dataset("ax").load("train")


def test_unknown_task_lists_known_ones():
  with pytest.raises(ValueError, match=r"unknown task 'sst-2'; known tasks: ax, cola, conll2003, hellaswag, mnli, "):
    get_dataset("sst-2")


@pytest.mark.parametrize("data_dir", ["empty", "missing", None])
def test_unprepared_tfds_data_is_one_error_not_a_download(tmp_path, monkeypatch, caplog, capfd, data_dir):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "default"))
  (tmp_path / "empty").mkdir()
  given = None if data_dir is None else str(tmp_path / data_dir)
  where = "TFDS's data dir" if data_dir is None else f"data_dir={given}"
  build = "`tfds build glue/rte --file_format=array_record" + (f" --data_dir={given}`" if given else "`")
  with pytest.raises(FileNotFoundError) as error:
    get_dataset("rte").load("validation", data_dir=given)
  assert str(error.value).startswith(f"TFDS dataset 'glue/rte' split 'validation' has no prepared random-access "
                                     f"(array_record) files in {where}")
  assert build in str(error.value)
  assert error.value.__context__ is None or error.value.__suppress_context__  # no chained TFDS KeyError shown
  assert "Variant folder" not in caplog.text + "".join(capfd.readouterr())  # TFDS's own warnings stay hidden
  assert not any(tmp_path.rglob("*.array_record*"))


def test_split_files_and_files_tasks(tmp_path):
  train = tmp_path / "train.txt"
  train.write_text("EU B-ORG\n")
  files = split_files("conll2003", {"train": train, "validation": None, "test": ""})
  assert files == {"train": str(train)}
  with pytest.raises(ValueError, match="task local: no training file"):
    split_files("local", {"train": None, "validation": train})
  with pytest.raises(FileNotFoundError, match=r"task swag: the validation file .*val.csv does not exist"):
    split_files("swag", {"train": train, "validation": tmp_path / "val.csv"})
  task = ner_files_dataset("local", {"train": str(train), "validation": str(train)}, ("O", "B-ORG"))
  assert (task.kind, task.num_labels, task.label_names, task.eval_splits, task.label_key) == (
      "ner", 2, ("O", "B-ORG"), ("validation",), "tags")
  task = multiple_choice_files_dataset("swag", {"train": str(train)})
  assert (task.kind, task.num_labels, task.eval_splits, task.tfds_name) == ("multiple_choice", 1, (), None)
