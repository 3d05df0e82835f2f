"""GLUE-style classification features and metrics."""
import numpy as np
import pytest
import tensorflow_datasets as tfds

from jbert.tasks import TASKS
from jbert.tasks.classification.features import classification_features
from jbert.tasks.sources import as_text

get_dataset = TASKS.dataset


def _tokens(tokenizer, features, row=0):
  length = int(features["attention_mask"][row].sum())
  return tokenizer.convert_ids_to_tokens(features["input_ids"][row, :length].tolist())


def test_pair_layout_and_padding(tokenizer):
  examples = [{"s1": "The cat sat.", "s2": "On the mat.", "label": 1, "idx": 7}]
  f = classification_features(examples, tokenizer, 12, text_keys=("s1", "s2"))
  assert _tokens(tokenizer, f) == [
      "[CLS]", "the", "cat", "sat", ".", "[SEP]", "on", "the", "mat", ".", "[SEP]"]
  assert f["token_type_ids"][0].tolist() == [0] * 6 + [1] * 5 + [0]
  assert f["attention_mask"][0].tolist() == [1] * 11 + [0]
  assert f["input_ids"][0, -1] == tokenizer.pad_id
  assert f["label"].tolist() == [1] and f["example_id"].tolist() == [7]
  assert {k: v.dtype for k, v in f.items()} == {k: np.int32 for k in f}


def test_longest_first_truncation(tokenizer):
  # 4 + 4 tokens into 8 - 3 = 5: the longer side loses one token at a time, the second on ties.
  examples = [{"a": "The cat sat.", "b": "On the mat."}]
  f = classification_features(examples, tokenizer, 8, text_keys=("a", "b"), label_key=None)
  assert _tokens(tokenizer, f) == ["[CLS]", "the", "cat", "sat", "[SEP]", "on", "the", "[SEP]"]
  assert f["label"].tolist() == [-1] and f["example_id"].tolist() == [0]
  single = classification_features([{"a": "The cat sat on the mat."}], tokenizer, 5, text_keys=("a",),
                                   label_key=None)
  assert _tokens(tokenizer, single) == ["[CLS]", "the", "cat", "sat", "[SEP]"]


def test_bytes_and_str_give_the_same_features(tokenizer):
  as_str = [{"sentence": "It was a very good movie.", "label": 1, "idx": 0}]
  as_bytes = [{"sentence": np.array("It was a very good movie.".encode()), "label": np.array(1), "idx": 0}]
  f_str = classification_features(as_str, tokenizer, 16, text_keys=("sentence",))
  f_bytes = classification_features(as_bytes, tokenizer, 16, text_keys=("sentence",))
  for k in f_str:
    np.testing.assert_array_equal(f_str[k], f_bytes[k])
  assert as_text(b"Zo\xc3\xab") == "Zoë" and as_text(np.bytes_(b"a")) == "a" and as_text("b") == "b"


def test_missing_text_field_names_available_ones(tiny_tokenizer):
  with pytest.raises(KeyError, match=r"lack field\(s\) \['sentence2'\]; available: \['label', 'sentence1'\]"):
    classification_features([{"sentence1": "a", "label": 0}], tiny_tokenizer, 8,
                            text_keys=("sentence1", "sentence2"))


@pytest.mark.parametrize("name,split,num_labels", [
    ("sst2", "train", 2), ("mnli", "validation_matched", 3), ("mnli", "validation_mismatched", 3),
    ("stsb", "validation", 1)])
def test_mock_tfds_features(tokenizer, name, split, num_labels):
  task = get_dataset(name)
  with tfds.testing.mock_data(num_examples=5):
    source = task.load(split)
    examples = [source[i] for i in range(len(source))]
  f = task.features(examples, tokenizer, 24)
  assert task.num_labels == num_labels
  for k in ("input_ids", "token_type_ids", "attention_mask"):
    assert f[k].shape == (5, 24) and f[k].dtype == np.int32
  assert f["example_id"].tolist() == [int(ex["idx"]) for ex in examples]
  if task.kind == "regression":
    assert f["label"].dtype == np.float32
    np.testing.assert_allclose(f["label"], [float(ex["label"]) for ex in examples])
  else:
    assert f["label"].dtype == np.int32 and f["label"].tolist() == [int(ex["label"]) for ex in examples]
  assert (f["input_ids"][:, 0] == tokenizer.cls_id).all()
  assert (f["token_type_ids"].max(axis=1) == (len(task.text_keys) - 1)).all()
