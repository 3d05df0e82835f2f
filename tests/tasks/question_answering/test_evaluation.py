"""SQuAD post-processing (answers across windows, n-best lists, null odds) and the official EM/F1."""
import math

import numpy as np
import pytest

from jbert.tasks.question_answering.features import squad_features, squad_references
from jbert.tasks.question_answering.evaluation import postprocess, spans_to_answers, squad_metrics

from . import squad_official
from .test_features import ANSWER, CONTEXT, _example, perfect_logits

WORDS = ("the cat sat on mat is in of who what where lives city capital france paris zoe muller john smith went to "
         "new york river good bad movie not and it was very").split()


def _generated(num_examples, seed, impossible_every=0):
  """Contexts of 20-40 random words; the answer is 1-4 consecutive words, anywhere in the context."""
  rng = np.random.default_rng(seed)
  examples = []
  for i in range(num_examples):
    words = rng.choice(WORDS, size=rng.integers(20, 41)).tolist()
    first = int(rng.integers(0, len(words) - 4))
    answer = " ".join(words[first:first + int(rng.integers(1, 5))])
    context = " ".join(words)
    start = len(" ".join(words[:first])) + (first > 0)
    examples.append(_example(f"g{i}", "what is it ?", answer, context=context, start=start,
                             impossible=bool(impossible_every) and i % impossible_every == 0))
  return examples


@pytest.mark.parametrize("stride", [1, 3, 7])
def test_perfect_logits_recover_every_answer_across_window_boundaries(tokenizer, stride):
  examples = _generated(60, seed=stride, impossible_every=5)
  f = squad_features(examples, tokenizer, 24, doc_stride=stride, max_query_length=8)
  # 24 - 5 - 3 = 16 context tokens per window, windows `stride` tokens apart: many windows cut an answer.
  cut = 0
  for row in range(len(f["input_ids"])):
    example = examples[f["example_id"][row]]
    if example["is_impossible"]:
      continue
    begin = example["answers"]["answer_start"][0]
    end = begin + len(example["answers"]["text"][0])
    inside = f["offsets"][row, f["offsets"][row, :, 0] >= 0]
    lo, hi = inside[0, 0], inside[-1, 1]
    cut += lo < end and begin < hi and not lo <= begin < end <= hi
  assert cut >= 10
  predictions = postprocess(f, *perfect_logits(f), n_best=20, max_answer_length=30, version_2_with_negative=True)
  assert predictions.answers == {e["id"]: (e["answers"]["text"] or [""])[0] for e in examples}
  assert all((odds > 0) == examples[int(qid[1:])]["is_impossible"] for qid, odds in predictions.null_odds.items())
  metrics = squad_metrics(predictions.answers, squad_references(examples))
  assert metrics["exact_match"] == metrics["f1"] == 100.0


def test_only_the_window_with_maximal_context_may_start_a_span(tiny_tokenizer):
  # Windows [0, 8), [4, 12), [8, 16), [12, 18) of context tokens (see test_windows_known_layout) after 7 tokens
  # of [CLS] question [SEP]. "paris" (context token 11) is in windows 1 and 2, with maximal context in window 2.
  f = squad_features([_example(answer="Paris")], tiny_tokenizer, 16, doc_stride=4, max_query_length=8)
  assert not f["token_is_max_context"][1, 7 + 7] and f["token_is_max_context"][2, 7 + 3]
  start, end = np.full((2, 4, 16), -5.0)
  # Window 1's "paris" would score 18, but may not start a span there; it may end one (". Zoë ... Paris", 4).
  start[1, 7 + 7], end[1, 7 + 7] = 9.0, 9.0
  start[2, 7 + 3], end[2, 7 + 3] = 3.0, 3.0  # window 2's "paris": 6
  start[2, 7 + 2], end[2, 7 + 2] = 4.0, 4.0  # window 2's "in": 8
  assert spans_to_answers(f, start, end, 20, 30) == {"q1": "in"}
  start[2, 7 + 2] = -5.0
  assert spans_to_answers(f, start, end, 20, 30) == {"q1": "Paris"}
  start[2, 7 + 3] = -5.0
  assert spans_to_answers(f, start, end, 20, 30) == {"q1": ". Zoë Müller lives in Paris"}


def test_nbest_null_odds_and_threshold_known_values(tiny_tokenizer):
  # One window: [CLS] who lives in paris ? [SEP] the cat sat on the mat . zoe muller lives in paris , the ...
  f = squad_features([_example()], tiny_tokenizer, 32, max_query_length=8)
  assert len(f["input_ids"]) == 1
  start, end = np.full((2, 1, 32), -9.0, np.float32)
  start[0, 0], end[0, 0] = 1.0, 1.5  # null score 2.5
  start[0, 14], end[0, 15] = 2.0, 1.0  # "Zoë Müller" 3.0
  start[0, 15], end[0, 14] = 1.0, 0.5  # "Müller" 2.0; "Zoë" 2.5
  start[0, 2] = 4.0  # a question token: never a span
  end[0, 13] = 5.0  # ".", before every start candidate
  post = postprocess(f, start, end, n_best=4, max_answer_length=30, version_2_with_negative=True)
  texts = [e["text"] for e in post.nbest["q1"]]
  # The top 4 starts are positions 2, 14, 0, 15 and the top 4 ends 13, 0, 15, 14: valid spans are "Zoë Müller"
  # (3.0), "Zoë" (2.5) and "Müller" (2.0); the null answer (2.5) follows the span it ties with.
  assert texts == ["Zoë Müller", "Zoë", "", "Müller"]
  scores = np.array([3.0, 2.5, 2.5, 2.0])
  np.testing.assert_allclose([e["probability"] for e in post.nbest["q1"]], np.exp(scores) / np.exp(scores).sum())
  assert [(e["start_logit"], e["end_logit"]) for e in post.nbest["q1"]] == [(2.0, 1.0), (2.0, 0.5), (1.0, 1.5),
                                                                            (1.0, 1.0)]
  assert post.null_odds == {"q1": 2.5 - 3.0} and post.answers == {"q1": ANSWER}
  assert post.best_spans == {"q1": ANSWER}
  # The threshold: "" once the null score beats the best span by more than it.
  assert postprocess(f, start, end, null_score_diff_threshold=-0.6, version_2_with_negative=True).answers == {
      "q1": ""}
  assert postprocess(f, start, end, null_score_diff_threshold=-0.4, version_2_with_negative=True).answers == {
      "q1": ANSWER}
  # With n_best=3 the starts are positions 2, 14, 0 and the ends 13, 0, 15: one span, then the null entry.
  assert [e["text"] for e in postprocess(f, start, end, n_best=3, version_2_with_negative=True).nbest["q1"]] == [
      "Zoë Müller", ""]
  # SQuAD 1.1 has no null entry; max_answer_length=1 keeps single tokens.
  v1 = postprocess(f, start, end, n_best=4, max_answer_length=1)
  assert [e["text"] for e in v1.nbest["q1"]] == ["Zoë", "Müller"] and v1.null_odds == {}
  assert v1.answers == {"q1": "Zoë"}


def test_no_valid_span_answers_empty(tiny_tokenizer):
  f = squad_features([_example()], tiny_tokenizer, 32, max_query_length=8)
  start, end = np.full((2, 1, 32), -9.0)
  start[0, 1:6] = end[0, 1:6] = 5.0  # the top candidates are question tokens only
  v1 = postprocess(f, start, end, n_best=5)
  assert v1.answers == {"q1": ""} and v1.nbest == {"q1": []}
  v2 = postprocess(f, start, end, n_best=5, version_2_with_negative=True)
  assert v2.answers == {"q1": ""} and v2.null_odds == {"q1": math.inf}
  assert v2.nbest["q1"] == [{"text": "", "probability": 1.0, "start_logit": -9.0, "end_logit": -9.0}]


def test_logits_must_match_the_features(tiny_tokenizer):
  f = squad_features([_example()], tiny_tokenizer, 32, max_query_length=8)
  with pytest.raises(ValueError, match=r"must match the features' input_ids \(1, 32\)"):
    spans_to_answers(f, np.zeros((2, 32)), np.zeros((2, 32)))


# Hand-made questions that exercise the official scripts' normalisation and scoring. (qid, gold texts, prediction)
_HAS_ANSWERS = [
    ("articles-case-punct", ["Eiffel Tower"], "the Eiffel Tower!"),
    ("whitespace", ["Paris"], "in  Paris,\tFrance "),
    ("several-golds", ["the dog", "cat sat", "a cat sat on"], "A cat"),
    ("articles-inside", ["an apple a day"], "apple day"),
    ("word-order", ["Denver Broncos"], "Broncos Denver"),
    ("only-an-article", ["the"], "The"),  # normalises to "" (2.0: the only gold is "", and "The" matches)
    ("dots", ["U.S."], "US"),
    ("comma", ["1,000 km"], "1000 km!"),
    ("empty-prediction", ["x y"], ""),
    ("repeated-words", ["big big cat"], "big cat cat"),
    ("partial", ["Carolina Panthers"], "the Panthers of Carolina and"),
    ("unicode", ["Zoë Müller"], "zoë müller"),
]
_NO_ANSWERS = [("no-answer-right", [], ""), ("no-answer-wrong", [], "something"), ("no-answer-article", [], "the")]


def _dataset(cases):
  qas = [{"id": qid, "question": "?", "answers": [{"text": t, "answer_start": 0} for t in golds]}
         for qid, golds, _ in cases]
  return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]


def test_squad_1_metrics_equal_the_official_script():
  cases = _HAS_ANSWERS + [("missing", ["anything"], None)]
  predictions = {qid: p for qid, _, p in cases if p is not None}
  official = squad_official.evaluate_v1(_dataset(cases), predictions)
  ours = squad_metrics(predictions, {qid: golds for qid, golds, _ in cases}, version_2_with_negative=False)
  assert ours == {"exact_match": official["exact_match"], "f1": official["f1"], "total": float(len(cases))}
  assert 0 < ours["exact_match"] < ours["f1"] < 100
  with pytest.raises(ValueError, match="question 'x' has no gold answer, which SQuAD 1.1 scoring cannot score"):
    squad_metrics({"x": ""}, {"x": []}, version_2_with_negative=False)


def test_squad_2_metrics_equal_the_official_script():
  cases = _HAS_ANSWERS + _NO_ANSWERS
  predictions = {qid: p for qid, _, p in cases}
  references = {qid: golds for qid, golds, _ in cases}
  official = squad_official.evaluate_v2(_dataset(cases), predictions)
  ours = squad_metrics(predictions, references)
  assert ours == {("exact_match" if k == "exact" else k): float(v) for k, v in official.items()}
  assert sorted(ours) == ["HasAns_exact", "HasAns_f1", "HasAns_total", "NoAns_exact", "NoAns_f1", "NoAns_total",
                          "exact_match", "f1", "total"]
  # Only-an-article is a question with an answer (HasAns) whose gold normalises to "": "The" scores 1.
  assert ours["HasAns_total"] == len(_HAS_ANSWERS) and ours["NoAns_exact"] == 100 * 2 / 3


def test_best_thresholds_equal_the_official_script():
  cases = _HAS_ANSWERS + _NO_ANSWERS
  predictions = {qid: p for qid, _, p in cases}
  references = {qid: golds for qid, golds, _ in cases}
  rng = np.random.default_rng(0)
  for trial in range(20):
    # Ties among the odds exercise the order of the search; negative and positive odds both occur.
    odds = {qid: float(rng.integers(-4, 5)) / 2 for qid in predictions}
    official = squad_official.evaluate_v2(_dataset(cases), predictions, odds)
    ours = squad_metrics(predictions, references, null_odds=odds)
    best = {k: v for k, v in official.items() if k.startswith("best_")}
    assert {k: ours[k] for k in best} == best, trial
    assert ours["best_f1_thresh"] in [0.0, *odds.values()] and ours["best_f1"] >= 100 * 3 / len(cases)
