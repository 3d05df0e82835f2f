"""SQuAD windows, span post-processing and the official EM/F1."""
import numpy as np
import pytest
import tensorflow_datasets as tfds

from jbert.data.finetune.glue import as_text
from jbert.data.finetune.squad import spans_to_answers, squad_features, squad_metrics, squad_references
from jbert.data.finetune.tasks import get_task

CONTEXT = "The cat sat on the mat. Zoë Müller lives in Paris, the capital of France."
ANSWER = "Zoë Müller"


def _example(qid="q1", question="Who lives in Paris?", answer=ANSWER, impossible=False):
  answers = {"text": [] if impossible else [answer],
             "answer_start": [] if impossible else [CONTEXT.index(answer)]}
  return {"id": qid, "question": question, "context": CONTEXT, "answers": answers,
          "is_impossible": impossible}


def _perfect_logits(features):
  """Logits that put all mass on the labelled start/end ([CLS] when the window has no answer)."""
  start = np.full(features["input_ids"].shape, -10.0)
  end = np.full(features["input_ids"].shape, -10.0)
  rows = np.arange(len(start))
  start[rows, features["start_positions"]] = 10.0
  end[rows, features["end_positions"]] = 10.0
  return start, end


def test_windows_known_layout(tiny_tokenizer):
  # Question: who lives in paris ? (5 tokens); 16 - 5 - 3 = 8 context tokens per window, begins 4 apart over
  # the 18 context tokens: windows [0, 8), [4, 12), [8, 16), [12, 18). The answer (tokens 7-8) fits only in
  # [4, 12).
  f = squad_features([_example()], tiny_tokenizer, 16, doc_stride=4, max_query_length=8)
  assert f["input_ids"].shape == (4, 16)
  assert f["window_index"].tolist() == [0, 1, 2, 3] and f["example_id"].tolist() == [0] * 4
  assert f["start_positions"].tolist() == [0, 7 + 3, 0, 0]
  assert f["end_positions"].tolist() == [0, 8 + 3, 0, 0]
  tokens = tiny_tokenizer.convert_ids_to_tokens(f["input_ids"][1].tolist())
  assert tokens == ["[CLS]", "who", "lives", "in", "paris", "?", "[SEP]",
                    "the", "mat", ".", "zoe", "muller", "lives", "in", "paris", "[SEP]"]
  assert f["token_type_ids"][1].tolist() == [0] * 7 + [1] * 9
  assert (f["offsets"][1, :7] == -1).all() and (f["offsets"][1, -1] == -1).all()
  assert f["offsets"][1, 10:12].tolist() == [[24, 27], [28, 34]]  # "Zoë", "Müller" in the original text
  # Last window: [CLS], 5 question tokens, [SEP], the last 6 context tokens, [SEP], padding.
  assert f["attention_mask"][3].tolist() == [1] * 14 + [0] * 2
  # Window 1 holds context tokens 4-11; 6-9 have more context on both sides here than in windows 0 or 2.
  assert f["token_is_max_context"][1, 7:15].tolist() == [False, False, True, True, True, True, False, False]
  assert f["qid"].tolist() == ["q1"] * 4 and f["context"][0] == CONTEXT


def test_perfect_logits_recover_original_text(tokenizer):
  examples = [_example(), _example("q2", "What is the capital of France?", "Paris"),
              _example("q3", "Where is the cat?", "on the mat")]
  f = squad_features(examples, tokenizer, 16, doc_stride=4, max_query_length=8)
  assert len(set(f["window_index"].tolist())) > 1
  for row in np.flatnonzero(f["start_positions"]):
    begin = f["offsets"][row, f["start_positions"][row], 0]
    end = f["offsets"][row, f["end_positions"][row], 1]
    assert CONTEXT[begin:end] == examples[f["example_id"][row]]["answers"]["text"][0]
  answers = spans_to_answers(f, *_perfect_logits(f), n_best=5, max_answer_length=10)
  assert answers == {"q1": ANSWER, "q2": "Paris", "q3": "on the mat"}


def test_v2_impossible_question_answers_empty(tokenizer):
  examples = [_example(), _example("q2", "Who lives in Rome?", impossible=True)]
  f = squad_features(examples, tokenizer, 16, doc_stride=4, max_query_length=8)
  impossible = f["example_id"] == 1
  assert (f["start_positions"][impossible] == 0).all() and (f["end_positions"][impossible] == 0).all()
  answers = spans_to_answers(f, *_perfect_logits(f), n_best=5, max_answer_length=10,
                             version_2_with_negative=True)
  assert answers == {"q1": ANSWER, "q2": ""}
  # Without the v2 rule some span wins even for the impossible question, as long as n_best reaches the context
  # (the top 5 starts here are [CLS] and question tokens, leaving no valid span at all).
  assert spans_to_answers(f, *_perfect_logits(f), 16, 10)["q2"] != ""
  assert spans_to_answers(f, *_perfect_logits(f), 5, 10)["q2"] == ""


def test_max_answer_length_and_question_truncation(tiny_tokenizer):
  f = squad_features([_example(question="what what what what what what?")], tiny_tokenizer, 24,
                     doc_stride=8, max_query_length=3)
  assert tiny_tokenizer.convert_ids_to_tokens(f["input_ids"][0, :5].tolist()) == [
      "[CLS]", "what", "what", "what", "[SEP]"]
  start, end = _perfect_logits(f)
  zoe = f["start_positions"][0]
  end[0, zoe] = 5.0
  # "Zoë Müller" (2 tokens) scores 20 and "Zoë" 15: the longer wins unless max_answer_length forbids it.
  assert spans_to_answers(f, start, end, 5, 2) == {"q1": ANSWER}
  assert spans_to_answers(f, start, end, 5, 1) == {"q1": "Zoë"}


def test_bad_inputs(tiny_tokenizer):
  with pytest.raises(ValueError, match="max_seq_length=8 leaves no room for the context after a 5-token"):
    squad_features([_example()], tiny_tokenizer, 8)
  f = squad_features([_example()], tiny_tokenizer, 32)
  with pytest.raises(ValueError, match=r"must match the features' input_ids \(1, 32\)"):
    spans_to_answers(f, np.zeros((2, 32)), np.zeros((2, 32)))


@pytest.mark.parametrize("name", ["squad", "squad_v2"])
def test_mock_tfds_features(tokenizer, name):
  task = get_task(name)
  with tfds.testing.mock_data(num_examples=3):
    source = task.load("validation")
    examples = [source[i] for i in range(len(source))]
  f = task.features(examples, tokenizer, 64, doc_stride=16, max_query_length=16)
  n = len(f["input_ids"])
  assert n >= 3 and sorted(set(f["example_id"].tolist())) == [0, 1, 2]
  for k in ("input_ids", "token_type_ids", "attention_mask"):
    assert f[k].shape == (n, 64) and f[k].dtype == np.int32
  for k in ("start_positions", "end_positions", "example_id", "window_index"):
    assert f[k].shape == (n,) and f[k].dtype == np.int32
  assert f["offsets"].shape == (n, 64, 2) and f["offsets"].dtype == np.int32
  assert f["token_is_max_context"].shape == (n, 64) and f["token_is_max_context"].dtype == bool
  # Every context token has its maximal context in exactly one window.
  for e, example in enumerate(examples):
    num_context_tokens = len(tokenizer.ids(as_text(example["context"])))
    assert f["token_is_max_context"][f["example_id"] == e].sum() == num_context_tokens
  answers = spans_to_answers(f, *_perfect_logits(f), version_2_with_negative=task.version_2_with_negative)
  assert sorted(answers) == sorted(squad_references(examples))


def test_squad_metrics_official_formula():
  references = {
      "exact": ["Eiffel tower"],
      "partial": ["Paris"],
      "no_answer": [],
      "no_answer_wrong": [],
      "best_of_two": ["the dog", "cat sat"],
      "missing": ["anything"],
  }
  predictions = {
      "exact": "the Eiffel Tower!",       # articles, case and punctuation are normalised away
      "partial": "in Paris France",       # P = 1/3, R = 1, F1 = 0.5
      "no_answer": "",                    # v2: empty gold and empty prediction agree
      "no_answer_wrong": "something",
      "best_of_two": "a cat",             # vs "cat sat": P = 1, R = 1/2, F1 = 2/3
  }
  m = squad_metrics(predictions, references)
  np.testing.assert_allclose(m["exact_match"], 100 * 2 / 6)
  np.testing.assert_allclose(m["f1"], 100 * (1 + 0.5 + 1 + 0 + 2 / 3 + 0) / 6)
  np.testing.assert_allclose([m["has_ans_exact_match"], m["has_ans_f1"]], [25.0, 100 * (1 + 0.5 + 2 / 3) / 4])
  np.testing.assert_allclose([m["no_ans_exact_match"], m["no_ans_f1"]], [50.0, 50.0])
  assert m["total"] == 6 and m["has_ans_total"] == 4 and m["no_ans_total"] == 2
  v1 = squad_metrics({"a": "Denver Broncos", "b": "Carolina"}, {"a": ["Denver Broncos"], "b": ["Panthers"]})
  assert v1 == {"exact_match": 50.0, "f1": 50.0, "total": 2.0}
