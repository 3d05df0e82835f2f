"""Multiple-choice features, SWAG/JSONL files and the TFDS hellaswag entry."""
import numpy as np
import pytest
import tensorflow_datasets as tfds

from jbert.tasks.multiple_choice.features import multiple_choice_features, read_multiple_choice_file
from jbert.tasks import TASKS

get_dataset = TASKS.dataset

EXAMPLES = [
    {"context": "the cat sat", "endings": ["on the mat .", "in paris", "john smith", "a river"], "label": 0},
    {"context": "zoe muller lives in", "endings": ["new york", "the mat", "a cat", "paris"], "label": 3},
]


def test_each_ending_is_packed_after_the_context(tiny_tokenizer):
  f = multiple_choice_features(EXAMPLES, tiny_tokenizer, 9)
  assert {k: (v.shape, v.dtype) for k, v in f.items()} == {
      "input_ids": ((2, 4, 9), np.int32), "token_type_ids": ((2, 4, 9), np.int32),
      "attention_mask": ((2, 4, 9), np.int32), "label": ((2,), np.int32), "example_id": ((2,), np.int32)}
  assert f["label"].tolist() == [0, 3] and f["example_id"].tolist() == [0, 1]
  # "the cat sat" + "on the mat ." is one token too long: the longer (the ending) loses its last.
  tokens = tiny_tokenizer.convert_ids_to_tokens(f["input_ids"][0, 0].tolist())
  assert tokens == ["[CLS]", "the", "cat", "sat", "[SEP]", "on", "the", "mat", "[SEP]"]
  assert f["token_type_ids"][0, 0].tolist() == [0] * 5 + [1] * 4
  assert f["attention_mask"][0, 1].tolist() == [1] * 8 + [0]
  # "zoe muller lives in" + "the mat" fits exactly; + "new york" too.
  tokens = tiny_tokenizer.convert_ids_to_tokens(f["input_ids"][1, 1].tolist())
  assert tokens == ["[CLS]", "zoe", "muller", "lives", "in", "[SEP]", "the", "mat", "[SEP]"]
  # Every pair is exactly the tokenizer's pair encoding.
  for i, example in enumerate(EXAMPLES):
    for c, ending in enumerate(example["endings"]):
      want = tiny_tokenizer.encode(example["context"], ending, max_length=9)
      n = len(want["input_ids"])
      assert f["input_ids"][i, c, :n].tolist() == want["input_ids"]
      assert f["token_type_ids"][i, c, :n].tolist() == want["token_type_ids"]
      assert f["attention_mask"][i, c].tolist() == [1] * n + [0] * (9 - n)


def test_unlabelled_and_bad_examples(tiny_tokenizer):
  f = multiple_choice_features([{"context": "a", "endings": ["cat", "mat"]}, {"context": "a", "endings": ["b", "c"],
                                                                             "label": -1}], tiny_tokenizer, 8)
  assert f["label"].tolist() == [-1, -1]
  uneven = [EXAMPLES[0], {**EXAMPLES[1], "endings": ["a", "b", "c"], "where": "line 2 of dev.jsonl"}]
  with pytest.raises(ValueError, match="line 2 of dev.jsonl has 3 endings but the others have 4; every example "
                                       r"needs the same number of endings \(fix or drop it\)"):
    multiple_choice_features(uneven, tiny_tokenizer, 8)
  with pytest.raises(ValueError, match="example 0 has 2 endings but the others have 4"):
    multiple_choice_features([{"context": "a", "endings": ["b", "c"], "label": 0}], tiny_tokenizer, 8,
                             num_choices=4)
  with pytest.raises(ValueError, match="example 1 has label 4, not the index of one of its 4 endings"):
    multiple_choice_features([EXAMPLES[0], {**EXAMPLES[1], "label": 4}], tiny_tokenizer, 8)
  with pytest.raises(KeyError, match=r"examples lack field\(s\) \['endings'\]"):
    multiple_choice_features([{"context": "a"}], tiny_tokenizer, 8, num_choices=2)


def test_read_jsonl_and_swag_csv(tmp_path):
  jsonl = tmp_path / "train.jsonl"
  jsonl.write_text('{"context": "the cat", "endings": ["sat", "ran"], "label": 1}\n\n'
                   '{"context": "a mat", "endings": ["is", "was"]}\n', encoding="utf-8")
  assert read_multiple_choice_file(jsonl) == [
      {"context": "the cat", "endings": ["sat", "ran"], "label": 1, "where": f"line 1 of {jsonl}"},
      {"context": "a mat", "endings": ["is", "was"], "label": None, "where": f"line 3 of {jsonl}"}]
  swag = tmp_path / "val.csv"
  swag.write_text(",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label\n"
                  '0,lsmdc1,5,"Students lower their eyes. They","Students lower their eyes.",They,gold,'
                  'nod.,"cry, loudly.",sit.,run.,1\n', encoding="utf-8")
  assert read_multiple_choice_file(swag) == [
      {"context": "Students lower their eyes.", "endings": ["They nod.", "They cry, loudly.", "They sit.",
                                                            "They run."], "label": 1, "where": f"line 2 of {swag}"}]
  swag.write_text("sent1,ending0\nx,y\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"val.csv lacks SWAG's column\(s\) \['sent2'\]"):
    read_multiple_choice_file(swag)
  jsonl.write_text('{"context": "a", "endings": ["b", "c"], "label": "first"}\n', encoding="utf-8")
  with pytest.raises(ValueError, match="line 1 of .*train.jsonl has label 'first'; a label is the index of the "
                                       "right ending"):
    read_multiple_choice_file(jsonl)
  jsonl.write_text('{"context": "a", "choices": ["b", "c"]}\n', encoding="utf-8")
  with pytest.raises(ValueError, match="line 1 of .*train.jsonl needs a `context` text and an `endings` list"):
    read_multiple_choice_file(jsonl)
  with pytest.raises(ValueError, match="cannot tell the format of .*data.tsv"):
    (tmp_path / "data.tsv").write_text("x")
    read_multiple_choice_file(tmp_path / "data.tsv")


def test_mock_hellaswag(tiny_tokenizer):
  examples = [{"context": b"the cat", "endings": np.array([b"sat", b"ran", b"is", b"was"], dtype=object),
               "label": np.int32(2), "activity_label": b"x", "split_type": b"indomain", "source_id": b"y"},
              {"context": b"a mat", "endings": np.array([b"a", b"b", b"c", b"d"], dtype=object),
               "label": np.int32(-1), "activity_label": b"x", "split_type": b"zeroshot", "source_id": b"y"}]
  task = get_dataset("hellaswag")
  with tfds.testing.mock_data(as_data_source_fn=lambda *args, **kwargs: examples):
    source = task.load("test")
    loaded = [source[i] for i in range(len(source))]
  f = task.features(loaded, tiny_tokenizer, 8)
  assert f["input_ids"].shape == (2, 4, 8) and f["label"].tolist() == [2, -1]
  assert tiny_tokenizer.convert_ids_to_tokens(f["input_ids"][0, 2, :5].tolist()) == [
      "[CLS]", "the", "cat", "[SEP]", "is"]
