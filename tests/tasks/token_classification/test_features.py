"""NER features: first-sub-token labels, windows, the inverse mapping, local files (entity scores: test_metrics.py)."""
import numpy as np
import pytest
import tensorflow_datasets as tfds

from jbert.tasks import TASKS
from jbert.tasks.token_classification.features import (IGNORE_INDEX, columns_or_sentences, encode_tags,
                                                        infer_label_names, ner_features, read_ner_file,
                                                        word_predictions)

get_dataset = TASKS.dataset

WORDS = ["Gorbachev", "went", "to", "New", "York", "."]
TAGS = [1, 0, 0, 5, 6, 0]  # B-PER O O B-LOC I-LOC O


def test_labels_sit_on_first_subtokens(tokenizer):
  f = ner_features([{"tokens": WORDS, "ner": TAGS}], tokenizer, 12)
  tokens = tokenizer.convert_ids_to_tokens(f["input_ids"][0, :10].tolist())
  assert tokens == ["[CLS]", "go", "##rba", "##chev", "went", "to", "new", "york", ".", "[SEP]"]
  x = IGNORE_INDEX
  assert f["labels"][0].tolist() == [x, 1, x, x, 0, 0, 5, 6, 0, x, x, x]
  assert f["word_ids"][0].tolist() == [-1, 0, 0, 0, 1, 2, 3, 4, 5, -1, -1, -1]
  assert f["predict_mask"][0].tolist() == [0, 1, 0, 0, 1, 1, 1, 1, 1, 0, 0, 0]
  assert f["attention_mask"][0].tolist() == [1] * 10 + [0] * 2
  assert f["num_words"].tolist() == [6] and f["example_id"].tolist() == [0]
  assert {k: v.dtype for k, v in f.items()} == {k: np.int32 for k in f}
  # Predicting the labels back gives the word tags; other sub-tokens' predictions are ignored.
  predictions = np.where(f["labels"] == x, 8, f["labels"])
  assert word_predictions(predictions, f) == [TAGS]


def test_long_sentences_are_windowed_and_every_word_predicted_once(tiny_tokenizer):
  # 7 words, 12 sub-tokens; windows of at most 6 sub-tokens (max_seq_length 8) start at a word 3 or more
  # sub-tokens after the previous start.
  words = ["unbelievable", "john", "went", "to", "gorbachev", "city", "."]
  tags = [0, 1, 2, 0, 3, 4, 0]
  f = ner_features([{"tokens": words, "ner": tags}, {"tokens": ["cat"], "ner": [7]}], tiny_tokenizer, 8)
  rows = [tiny_tokenizer.convert_ids_to_tokens(r[m == 1].tolist())
          for r, m in zip(f["input_ids"], f["attention_mask"])]
  assert rows == [["[CLS]", "un", "##bel", "##iev", "##able", "john", "went", "[SEP]"],
                  ["[CLS]", "john", "went", "to", "go", "##rba", "##chev", "[SEP]"],
                  ["[CLS]", "go", "##rba", "##chev", "city", ".", "[SEP]"],
                  ["[CLS]", "cat", "[SEP]"]]
  assert f["example_id"].tolist() == [0, 0, 0, 1] and f["num_words"].tolist() == [7, 7, 7, 1]
  # Each word is predicted in the window where its first sub-token has the most context on both sides
  # (min(left, right) sub-tokens): john 1 in window 0 vs 0 in window 1; went 1 in window 1 vs 0 in window 0;
  # gorbachev 2 in window 1 vs 0 in window 2; city 1 in window 2.
  predicted = [f["word_ids"][r][f["predict_mask"][r] == 1].tolist() for r in range(4)]
  assert predicted == [[0, 1], [2, 3, 4], [5, 6], [0]]
  x = IGNORE_INDEX
  assert f["labels"][1].tolist() == [x, x, 2, 0, 3, x, x, x]
  # Words come back in order from whichever window predicts them; no word is dropped.
  assert word_predictions(np.maximum(f["labels"], 0), f) == [tags, [7]]


def test_a_word_without_pieces_reads_as_unk(tiny_tokenizer):
  f = ner_features([{"tokens": ["cat", "\u200b", "sat"], "ner": [0, 1, 0]}], tiny_tokenizer, 8)
  assert tiny_tokenizer.convert_ids_to_tokens(f["input_ids"][0, :5].tolist()) == [
      "[CLS]", "cat", "[UNK]", "sat", "[SEP]"]
  assert f["labels"][0, :5].tolist() == [IGNORE_INDEX, 0, 1, 0, IGNORE_INDEX]


def test_unlabelled_sentences_and_bad_tags(tiny_tokenizer):
  f = ner_features([{"tokens": ["the", "cat"], "tags": None}], tiny_tokenizer, 8, tags_key="tags")
  assert (f["labels"] == IGNORE_INDEX).all() and f["predict_mask"][0, :4].tolist() == [0, 1, 1, 0]
  with pytest.raises(ValueError, match="example 0 has 6 words but 2 tags in 'ner'"):
    ner_features([{"tokens": WORDS, "ner": [0, 0]}], tiny_tokenizer, 12)
  with pytest.raises(ValueError, match=r"line 3 of x.jsonl has tag id 9, outside the 9 labels \[0, 9\)"):
    ner_features([{"tokens": ["a"], "ner": [9], "where": "line 3 of x.jsonl"}], tiny_tokenizer, 8, num_labels=9)


def test_mock_conll2003_with_bytes(tokenizer):
  examples = [{"tokens": np.array([w.encode() for w in WORDS], dtype=object), "ner": np.array(TAGS),
               "pos": np.zeros(6, np.int64), "chunks": np.zeros(6, np.int64)},
              {"tokens": np.array([b"The", b"cat"], dtype=object), "ner": np.array([0, 0]),
               "pos": np.zeros(2, np.int64), "chunks": np.zeros(2, np.int64)}]
  task = get_dataset("conll2003")
  with tfds.testing.mock_data(as_data_source_fn=lambda *args, **kwargs: examples):
    source = task.load("validation")
    loaded = [source[i] for i in range(len(source))]
  f = task.features(loaded, tokenizer, 16)
  for k in ("input_ids", "token_type_ids", "attention_mask", "labels", "word_ids", "predict_mask"):
    assert f[k].shape == (2, 16) and f[k].dtype == np.int32
  assert f["labels"][0, :10].tolist() == ner_features(
      [{"tokens": WORDS, "ner": TAGS}], tokenizer, 16)["labels"][0, :10].tolist()
  assert word_predictions(np.maximum(f["labels"], 0), f) == [TAGS, [0, 0]]
  assert task.label_names[1] == "B-PER" and task.num_labels == 9


def test_read_conll_columns(tmp_path):
  path = tmp_path / "train.txt"
  path.write_text("-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\nGerman JJ B-NP B-MISC\n\n\n"
                  "Peter NNP B-NP B-PER\nBlackburn NNP I-NP I-PER\n", encoding="utf-8")
  assert read_ner_file(path) == [
      {"tokens": ["EU", "rejects", "German"], "tags": ["B-ORG", "O", "B-MISC"],
       "where": f"the sentence at line 3 of {path}"},
      {"tokens": ["Peter", "Blackburn"], "tags": ["B-PER", "I-PER"], "where": f"the sentence at line 8 of {path}"}]
  unlabelled = tmp_path / "test.conll"
  unlabelled.write_text("EU\nrejects\n\nPeter\n", encoding="utf-8")
  assert [s["tags"] for s in read_ner_file(unlabelled)] == [None, None]
  mixed = tmp_path / "mixed.txt"
  mixed.write_text("EU B-ORG\nrejects O\n\nPeter\nBlackburn I-PER\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"line 5 of .*mixed.txt: some words of the sentence starting at line 4"):
    read_ner_file(mixed)
  with pytest.raises(FileNotFoundError, match="NER file .*missing.txt does not exist"):
    read_ner_file(tmp_path / "missing.txt")


@pytest.mark.parametrize("text, read_as", [
    ("-DOCSTART- -X- O\n\nSOCCER NN O\nJAPAN NNP B-LOC\n", "columns"),
    ("SOCCER O\nJAPAN B-LOC\n", "columns"),  # every line's last field a tag of the model
    ("SOCCER\nJAPAN\n\nWIN\nBIG\n", "columns"),  # a word a line, blank lines between sentences
    ("SOCCER\nJAPAN\n\n", "columns"),  # one such sentence, ended by a blank line
    ("x NN\ny VB\n\nz NN\n", "columns"),  # untagged columns of a fixed width
    ("SOCCER JAPAN WIN\nBIG DAY\n", "sentences"),
    ("New York\nLos Angeles\n\n", "sentences"),  # two words a line, no blank line between them
    ("x y\n\nz w\n", "sentences"),  # every block one line: a sentence a line, spaced out
    ("Spain wins O\nJapan loses\n", "sentences"),  # one line ends in a tag name, not all
    ("", "sentences"),
])
def test_prediction_inputs_read_as_columns_where_training_would(tmp_path, text, read_as):
  path = tmp_path / "input.txt"
  path.write_text(text, encoding="utf-8")
  assert columns_or_sentences(path, ("O", "B-LOC", "I-LOC")) == read_as


def test_a_word_a_line_without_a_blank_line_is_ambiguous(tmp_path):
  path = tmp_path / "input.txt"
  path.write_text("SOCCER\nJAPAN\nWIN\n", encoding="utf-8")
  with pytest.raises(ValueError, match=r"input.txt holds one word per line and no blank line: as CoNLL columns \(how "
                                       r"training reads such a file\) it is one sentence of 3 words, as a sentence "
                                       r"per line 3 one-word sentences; end each sentence with a blank line"):
    columns_or_sentences(path, ("O", "B-LOC"))


def test_read_jsonl_and_encode_tags(tmp_path):
  path = tmp_path / "dev.jsonl"
  path.write_text('{"tokens": ["EU", "rejects"], "tags": ["B-ORG", "O"]}\n\n'
                  '{"tokens": ["Peter"], "tags": [1]}\n{"tokens": ["x"], "tags": ["B-FOO"]}\n', encoding="utf-8")
  sentences = read_ner_file(path)
  assert [s["where"] for s in sentences] == [f"line {i} of {path}" for i in (1, 3, 4)]
  names = ("O", "B-ORG", "I-ORG")
  assert [s["tags"] for s in encode_tags(sentences[:2], names)] == [[1, 0], [1]]
  with pytest.raises(ValueError, match=r"line 4 of .*dev.jsonl has tag 'B-FOO', which is not in the label set "
                                       r"\['O', 'B-ORG', 'I-ORG'\]"):
    encode_tags(sentences, names)
  with pytest.raises(ValueError, match=r"line 3 of .*dev.jsonl gives tag ids \(1\), whose names cannot be "
                                       "inferred"):
    infer_label_names(sentences)
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"tokens": ["a", "b"], "tags": ["O"]}\n', encoding="utf-8")
  with pytest.raises(ValueError, match=r"line 1 of .*bad.jsonl has 2 tokens but its `tags` is not a list of as "
                                       "many tags"):
    read_ner_file(bad)
  bad.write_text('{"words": ["a"]}\n', encoding="utf-8")
  with pytest.raises(ValueError, match=r"line 1 of .*bad.jsonl has no `tokens` list"):
    read_ner_file(bad)


def test_inferred_label_order():
  sentences = [{"tokens": [], "tags": ["I-PER", "B-LOC", "O", "B-PER", "I-LOC"]}, {"tokens": [], "tags": None}]
  assert infer_label_names(sentences) == ("O", "B-LOC", "I-LOC", "B-PER", "I-PER")


def test_roberta_and_xlmr_words_read_as_transformers_splits_them(family_folder):
  """NER's words through RoBERTa's byte-level BPE and XLM-R's SentencePiece: each word as transformers tokenizes a
  pre-split text (is_split_into_words, add_prefix_space), the tag on each word's first sub-token."""
  import transformers
  from jbert.tokenizer import load_tokenizer
  tok = load_tokenizer(family_folder)
  theirs = transformers.AutoTokenizer.from_pretrained(str(family_folder), add_prefix_space=True)
  words = ["Zoë", "Müller", "lives", "in", "Москва", ",", "東京", "and", "Paris", "😀", "."]
  tags = list(range(len(words)))
  f = ner_features([{"tokens": words, "ner": tags}], tok, 64)
  expected = theirs(words, is_split_into_words=True, truncation=True, max_length=64)
  n = int(f["attention_mask"][0].sum())
  assert f["input_ids"][0, :n].tolist() == expected["input_ids"]
  word_ids = [-1 if w is None else w for w in expected.word_ids()]
  assert f["word_ids"][0, :n].tolist() == word_ids
  firsts = [i for i, w in enumerate(word_ids) if w >= 0 and word_ids[i - 1] != w]
  assert np.flatnonzero(f["predict_mask"][0]).tolist() == firsts
  assert f["labels"][0, firsts].tolist() == tags
