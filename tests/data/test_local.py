"""Local CSV / TSV / JSON-lines files with a column mapping."""
import json

import numpy as np
import pytest

from jbert.data.local import label_names_from_values
from jbert.data.local import read_examples
from jbert.tasks.classification.sources import local_dataset
from tests.tasks.tokenizers import tiny_tokenizer  # noqa: F401  pylint: disable=unused-import  (a fixture)

ROWS = [
    {"sentence1": "The cat sat.", "sentence2": "On the mat.", "gold": "yes", "extra": "1"},
    {"sentence1": "It was bad.", "sentence2": "Not good, \"very\" bad.", "gold": "no", "extra": "2"},
]
COLUMNS = {"text_a": "sentence1", "text_b": "sentence2", "label": "gold"}
EXPECTED = [
    {"text_a": "The cat sat.", "text_b": "On the mat.", "label": 1, "idx": 0},
    {"text_a": "It was bad.", "text_b": "Not good, \"very\" bad.", "label": 0, "idx": 1},
]


def _write(path, rows):
  if path.suffix == ".jsonl":
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  elif path.suffix == ".tsv":
    lines = ["\t".join(rows[0])] + ["\t".join(r.values()) for r in rows]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  else:
    quoted = [",".join('"' + v.replace('"', '""') + '"' for v in r.values()) for r in rows]
    path.write_text("\n".join([",".join(rows[0])] + quoted) + "\n", encoding="utf-8")
  return path


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl"])
def test_read_with_column_map(tmp_path, suffix):
  path = _write(tmp_path / f"data{suffix}", ROWS)
  assert read_examples(path, COLUMNS, ["no", "yes"]) == EXPECTED


def test_regression_labels_and_single_sentence(tmp_path):
  rows = [{"s": "good movie", "score": "4.5"}, {"s": "bad movie", "score": "0.25"}]
  examples = read_examples(_write(tmp_path / "d.jsonl", rows), {"text_a": "s", "label": "score"})
  assert examples == [{"text_a": "good movie", "label": 4.5, "idx": 0},
                      {"text_a": "bad movie", "label": 0.25, "idx": 1}]


def test_bad_column_names_it_and_the_available_ones(tmp_path):
  path = _write(tmp_path / "d.csv", ROWS)
  with pytest.raises(KeyError, match=r"column\(s\) \['label'\] not in row 0 of .*d.csv \(line 2\); available columns: "
                     r"\['sentence1', 'sentence2', 'gold', 'extra'\]"):
    read_examples(path, {"text_a": "sentence1", "label": "label"}, ["no", "yes"])


def test_other_bad_inputs(tmp_path):
  path = _write(tmp_path / "d.tsv", ROWS)
  with pytest.raises(ValueError) as error:
    read_examples(path, COLUMNS, ["yes"])
  assert str(error.value) == (f"row 1 of {path} has label 'no', which is not in task.label_names ['yes']; add it to "
                              "--config.task.label_names (class names in id order).")
  with pytest.raises(ValueError, match="column_map keys must be text_a"):
    read_examples(path, {"sentence": "sentence1"})
  with pytest.raises(ValueError, match="pass file_format as one of csv, tsv, jsonl"):
    read_examples(tmp_path / "d.txt", COLUMNS)


def test_integer_labels_are_class_ids_into_names_that_are_not_integers(tmp_path):
  rows = [{"s": "good", "y": "1"}, {"s": "bad", "y": "0"}, {"s": "worse", "y": "2"}]
  path = _write(tmp_path / "d.csv", rows)
  columns = {"text_a": "s", "label": "y"}
  assert [e["label"] for e in read_examples(path, columns, ["negative", "positive", "mixed"])] == [1, 0, 2]
  assert [e["label"] for e in read_examples(path, columns, ["2", "1", "0"])] == [1, 2, 0]  # integer names: by name
  with pytest.raises(ValueError) as error:
    read_examples(path, columns, ["negative", "positive"])
  assert str(error.value) == (f"row 2 of {path} has label '2', which is not in task.label_names ['negative', "
                              "'positive'] nor a class id 0..1; add it to --config.task.label_names (class names in "
                              "id order).")


def test_names_from_label_values_integers_numbers_or_words(tmp_path):
  integers = _write(tmp_path / "i.csv", [{"s": "a", "y": "10"}, {"s": "b", "y": "-1"}, {"s": "c", "y": "2"}])
  assert label_names_from_values(integers, "y") == ["-1", "2", "10"]  # numerically, not as strings
  scores = _write(tmp_path / "r.jsonl", [{"s": "a", "y": 0.5}, {"s": "b", "y": 3}])
  assert label_names_from_values(scores, "y") is None
  words = _write(tmp_path / "w.tsv", [{"s": "a", "y": "pos"}, {"s": "b", "y": "neg"}, {"s": "c", "y": "1"}])
  with pytest.raises(ValueError) as error:
    label_names_from_values(words, "y")
  assert str(error.value) == (f"the labels of {words} (column 'y') are not numbers (2 distinct, e.g. ['neg', 'pos']); "
                              "name the classes in id order with --config.task.label_names=neg,pos.")
  with pytest.raises(KeyError, match=r"column\(s\) \['gold'\] not in row 0 .* Set --config.task.label to its label "
                                     r"column."):
    label_names_from_values(words, "gold")


def test_local_task_end_to_end(tmp_path, tiny_tokenizer):
  task = local_dataset("paraphrase", {"train": _write(tmp_path / "train.csv", ROWS),
                                   "validation": _write(tmp_path / "dev.jsonl", ROWS[:1])},
                    COLUMNS, ["no", "yes"])
  assert (task.kind, task.num_labels, task.eval_splits, task.metrics) == (
      "classification", 2, ("validation",), ("accuracy",))
  f = task.features(task.load("train"), tiny_tokenizer, 16)
  assert f["input_ids"].shape == (2, 16) and f["label"].tolist() == [1, 0] and f["label"].dtype == np.int32
  tokens = tiny_tokenizer.convert_ids_to_tokens(f["input_ids"][0, :11].tolist())
  assert tokens == ["[CLS]", "the", "cat", "sat", ".", "[SEP]", "on", "the", "mat", ".", "[SEP]"]
  assert task.features(task.load("validation"), tiny_tokenizer, 16)["example_id"].tolist() == [0]
  regression = local_dataset("scores", {"train": _write(tmp_path / "s.jsonl", [{"s": "a", "y": "1.5"}])},
                          {"text_a": "s", "label": "y"})
  assert regression.kind == "regression" and regression.metrics == ("pearson", "spearman")
  f = regression.features(regression.load("train"), tiny_tokenizer, 8)
  assert f["label"].dtype == np.float32 and f["label"].tolist() == [1.5]
