"""NER features: first-sub-token labels, the inverse mapping, seqeval-compatible entity scores."""
import numpy as np
import pytest
import tensorflow_datasets as tfds

from jbert.data.finetune.ner import IGNORE_INDEX, entity_scores, get_entities, ner_features, word_predictions
from jbert.data.finetune.tasks import get_task

WORDS = ["Gorbachev", "went", "to", "New", "York", "."]
TAGS = [1, 0, 0, 5, 6, 0]  # B-PER O O B-LOC I-LOC O


def test_labels_sit_on_first_subtokens(tokenizer):
  f = ner_features([{"tokens": WORDS, "ner": TAGS}], tokenizer, 12)
  tokens = tokenizer.convert_ids_to_tokens(f["input_ids"][0, :10].tolist())
  assert tokens == ["[CLS]", "go", "##rba", "##chev", "went", "to", "new", "york", ".", "[SEP]"]
  x = IGNORE_INDEX
  assert f["labels"][0].tolist() == [x, 1, x, x, 0, 0, 5, 6, 0, x, x, x]
  assert f["word_ids"][0].tolist() == [-1, 0, 0, 0, 1, 2, 3, 4, 5, -1, -1, -1]
  assert f["attention_mask"][0].tolist() == [1] * 10 + [0] * 2
  assert f["num_words"].tolist() == [6] and f["example_id"].tolist() == [0]
  assert {k: v.dtype for k, v in f.items()} == {k: np.int32 for k in f}
  # Predicting the labels back gives the word tags; other sub-tokens' predictions are ignored.
  predictions = np.where(f["labels"] == x, 8, f["labels"])
  assert word_predictions(predictions, f["word_ids"], f["num_words"]) == [TAGS]


def test_truncated_words_get_fill_value(tokenizer):
  f = ner_features([{"tokens": WORDS, "ner": TAGS}, {"tokens": [], "ner": []}], tokenizer, 6)
  assert tokenizer.convert_ids_to_tokens(f["input_ids"][0].tolist()) == [
      "[CLS]", "go", "##rba", "##chev", "went", "[SEP]"]
  assert tokenizer.convert_ids_to_tokens(f["input_ids"][1, :2].tolist()) == ["[CLS]", "[SEP]"]
  predictions = np.full(f["input_ids"].shape, 3)
  words = word_predictions(predictions, f["word_ids"], f["num_words"], fill_value=0)
  assert words == [[3, 3, 0, 0, 0, 0], []]


def test_word_tag_mismatch_is_an_error(tiny_tokenizer):
  with pytest.raises(ValueError, match="example 0 has 6 words but 2 tags in 'ner'"):
    ner_features([{"tokens": WORDS, "ner": [0, 0]}], tiny_tokenizer, 12)


def test_mock_conll2003_with_bytes(tokenizer):
  examples = [{"tokens": np.array([w.encode() for w in WORDS], dtype=object), "ner": np.array(TAGS),
               "pos": np.zeros(6, np.int64), "chunks": np.zeros(6, np.int64)},
              {"tokens": np.array([b"The", b"cat"], dtype=object), "ner": np.array([0, 0]),
               "pos": np.zeros(2, np.int64), "chunks": np.zeros(2, np.int64)}]
  task = get_task("conll2003")
  with tfds.testing.mock_data(as_data_source_fn=lambda *args, **kwargs: examples):
    source = task.load("validation")
    loaded = [source[i] for i in range(len(source))]
  f = task.features(loaded, tokenizer, 16)
  for k in ("input_ids", "token_type_ids", "attention_mask", "labels", "word_ids"):
    assert f[k].shape == (2, 16) and f[k].dtype == np.int32
  assert f["labels"][0, :10].tolist() == ner_features(
      [{"tokens": WORDS, "ner": TAGS}], tokenizer, 16)["labels"][0, :10].tolist()
  assert word_predictions(np.maximum(f["labels"], 0), f["word_ids"], f["num_words"]) == [TAGS, [0, 0]]
  assert task.label_names[1] == "B-PER" and task.num_labels == 9


def test_get_entities_matches_seqeval():
  assert get_entities(["B-PER", "I-PER", "O", "B-LOC"]) == [("PER", 0, 1), ("LOC", 3, 3)]
  # IOB1: an entity may start with I-, and B- only separates adjacent entities of one type.
  assert get_entities(["I-PER", "I-PER", "O", "I-LOC", "B-LOC"]) == [
      ("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 4)]
  # A type change inside a run of I- tags starts a new entity.
  assert get_entities(["B-PER", "I-LOC", "I-LOC"]) == [("PER", 0, 0), ("LOC", 1, 2)]
  assert get_entities(["O", "O"]) == []


def test_entity_scores_hand_computed():
  true = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "O", "B-MISC"]]
  pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O", "O", "B-MISC"]]
  # Gold: PER, LOC, ORG(2 words), MISC. Predicted: PER, ORG(1 word, wrong type at LOC), ORG(1 word), MISC.
  s = entity_scores(true, pred)
  assert (s["precision"], s["recall"], s["f1"]) == (0.5, 0.5, 0.5)
  assert s["per_type"]["PER"]["f1"] == 1.0 and s["per_type"]["MISC"]["f1"] == 1.0
  assert s["per_type"]["LOC"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
  assert s["per_type"]["ORG"] == {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}
  # 1 correct of 2 predicted and 3 gold: P = 1/2, R = 1/3, F1 = 2 * (1/6) / (5/6) = 0.4.
  s = entity_scores([["B-PER", "O", "B-LOC", "I-LOC", "B-ORG"]], [["B-PER", "O", "B-LOC", "O", "O"]])
  np.testing.assert_allclose([s["precision"], s["recall"], s["f1"]], [0.5, 1 / 3, 0.4])
  # Sentences are separated: a gold entity at the end of one and the start of the next stay two entities.
  s = entity_scores([["O", "I-PER"], ["I-PER", "O"]], [["O", "I-PER"], ["I-PER", "O"]])
  assert s["per_type"]["PER"]["support"] == 2 and s["f1"] == 1.0
  with pytest.raises(ValueError, match="sentence 0 has 2 gold tags but 1 predicted ones"):
    entity_scores([["O", "O"]], [["O"]])
