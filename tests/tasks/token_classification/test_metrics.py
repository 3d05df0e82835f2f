"""NER's entity-level scores (`jbert/tasks/token_classification/metrics.py`): seqeval's chunks and scores, plain tags
as IO tags."""
import numpy as np
import pytest
import seqeval.metrics as seqeval_metrics

from jbert.tasks.token_classification.features import tag_scheme
from jbert.tasks.token_classification.metrics import entity_scores, get_entities


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


def test_plain_tags_are_io_tags_scored_by_hand():
  """Plain tags (no B-/I- prefix): an entity is a maximal run of one type. seqeval's default mode reads `ORG` as O
  and `PER` as a type `ER`, so these values are worked out by hand."""
  assert get_entities(["PER", "PER", "LOC", "O", "ORG", "ORG", "MISC"]) == [
      ("PER", 0, 1), ("LOC", 2, 2), ("ORG", 4, 5), ("MISC", 6, 6)]
  gold = [["PER", "PER", "O", "ORG", "ORG", "LOC"], ["MISC", "O", "ORG"]]
  pred = [["PER", "O", "O", "ORG", "ORG", "ORG"], ["MISC", "O", "LOC"]]
  # Gold: PER 0-1, ORG 3-4, LOC 5 | MISC 0, ORG 2 (5). Predicted: PER 0, ORG 3-5 | MISC 0, LOC 2 (4). Right: MISC.
  s = entity_scores(gold, pred)
  np.testing.assert_allclose([s["precision"], s["recall"], s["f1"], s["accuracy"]],
                             [1 / 4, 1 / 5, 2 * (1 / 20) / (9 / 20), 6 / 9], rtol=1e-12)
  assert s["per_type"] == {
      "LOC": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1},
      "MISC": {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1},
      "ORG": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 2},
      "PER": {"precision": 0.0, "recall": 0.0, "f1": 0.0, "support": 1}}
  assert entity_scores(gold, gold)["f1"] == 1.0 and entity_scores(gold, gold)["per_type"]["ORG"]["support"] == 2
  assert tag_scheme(["O", "PER", "LOC"]) == "io" and tag_scheme(["O", "B-PER", "I-PER", "S-LOC"]) == "prefixed"
  with pytest.raises(ValueError, match=r"^the tags mix prefixed ones \(B-PER, I-PER\) with plain ones \(LOC, ORG\), "
                                       r"so entities have no single reading; prefix every entity tag \(B-X/I-X\) "
                                       r"or none \(IO tags"):
    tag_scheme(["O", "B-PER", "I-PER", "LOC", "ORG"])


def test_entity_scores_equal_seqeval_on_random_iob1_and_iob2_tags():
  rng = np.random.default_rng(0)
  names = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
  for trial in range(20):
    true = [[names[i] for i in rng.choice(7, rng.integers(0, 12), p=[.4, .1, .1, .1, .1, .1, .1])]
            for _ in range(30)]
    pred = [[t if rng.random() < 0.8 else names[rng.integers(7)] for t in s] for s in true]
    if trial == 0:
      pred = [["O"] * len(s) for s in true]  # nothing predicted: precision 0 by convention
    ours = entity_scores(true, pred)
    report = seqeval_metrics.classification_report(true, pred, output_dict=True, zero_division=0)
    want = (seqeval_metrics.precision_score(true, pred, zero_division=0),
            seqeval_metrics.recall_score(true, pred, zero_division=0),
            seqeval_metrics.f1_score(true, pred, zero_division=0), seqeval_metrics.accuracy_score(true, pred))
    np.testing.assert_allclose([ours["precision"], ours["recall"], ours["f1"], ours["accuracy"]], want,
                               rtol=1e-12)
    types = {k: v for k, v in report.items() if not k.endswith("avg")}
    assert set(ours["per_type"]) >= set(types)
    for type_, scores in ours["per_type"].items():
      got = [scores["precision"], scores["recall"], scores["f1"], scores["support"]]
      ref = types.get(type_, {"precision": 0.0, "recall": 0.0, "f1-score": 0.0, "support": 0})
      np.testing.assert_allclose(got, [ref["precision"], ref["recall"], ref["f1-score"], ref["support"]],
                                 rtol=1e-12)
