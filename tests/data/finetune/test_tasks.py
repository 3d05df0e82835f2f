"""The task registry."""
import pytest

from jbert.data.finetune import TASKS, get_task

GLUE = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "ax")


def test_registry_holds_every_task():
  assert set(GLUE) | {"squad", "squad_v2", "conll2003", "mnli_matched", "mnli_mismatched"} == set(TASKS)
  for name in GLUE:
    assert get_task(name).tfds_name == f"glue/{name}"


@pytest.mark.parametrize("name,kind,num_labels,metrics", [
    ("cola", "classification", 2, ("matthews_corr",)),
    ("sst2", "classification", 2, ("accuracy",)),
    ("mrpc", "classification", 2, ("accuracy", "f1")),
    ("qqp", "classification", 2, ("accuracy", "f1")),
    ("stsb", "regression", 1, ("pearson", "spearman")),
    ("mnli", "classification", 3, ("accuracy",)),
    ("rte", "classification", 2, ("accuracy",)),
    ("squad", "squad", 2, ("exact_match", "f1")),
    ("squad_v2", "squad", 2, ("exact_match", "f1")),
    ("conll2003", "ner", 9, ("precision", "recall", "f1")),
])
def test_task_fields(name, kind, num_labels, metrics):
  task = get_task(name)
  assert (task.kind, task.num_labels, task.metrics) == (kind, num_labels, metrics)


def test_splits():
  assert get_task("mnli").eval_splits == ("validation_matched", "validation_mismatched")
  assert get_task("mnli_mismatched").splits["validation"] == "validation_mismatched"
  assert get_task("mnli_matched").tfds_name == "glue/mnli"
  assert dict(get_task("ax").splits) == {"test": "test"} and get_task("ax").eval_splits == ()
  assert get_task("conll2003").splits["validation"] == "dev"
  assert (get_task("squad").tfds_name, get_task("squad_v2").tfds_name) == ("squad/v1.1", "squad/v2.0")
  assert not get_task("squad").version_2_with_negative and get_task("squad_v2").version_2_with_negative
  assert get_task("qnli").text_keys == ("question", "sentence")
  with pytest.raises(ValueError, match=r"task 'ax' has no split 'train'; it has \['test'\]"):
    get_task("ax").load("train")


def test_unknown_task_lists_known_ones():
  with pytest.raises(ValueError, match=r"unknown task 'sst-2'; known tasks: ax, cola, conll2003, mnli, "):
    get_task("sst-2")


@pytest.mark.parametrize("data_dir", ["empty", "missing", None])
def test_unprepared_tfds_data_is_one_error_not_a_download(tmp_path, monkeypatch, caplog, capfd, data_dir):
  monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "default"))
  (tmp_path / "empty").mkdir()
  given = None if data_dir is None else str(tmp_path / data_dir)
  where = "TFDS's data dir" if data_dir is None else f"data_dir={given}"
  build = "`tfds build glue/rte --file_format=array_record" + (f" --data_dir={given}`" if given else "`")
  with pytest.raises(FileNotFoundError) as error:
    get_task("rte").load("validation", data_dir=given)
  assert str(error.value).startswith(f"TFDS dataset 'glue/rte' split 'validation' has no prepared random-access "
                                     f"(array_record) files in {where}")
  assert build in str(error.value)
  assert error.value.__context__ is None or error.value.__suppress_context__  # no chained TFDS KeyError shown
  assert "Variant folder" not in caplog.text + "".join(capfd.readouterr())  # TFDS's own warnings stay hidden
  assert not any(tmp_path.rglob("*.array_record*"))
