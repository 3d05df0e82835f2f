"""SQuAD windows, SQuAD JSON files and the examples that cannot be used as they are."""
import json

import numpy as np
import pytest
import tensorflow_datasets as tfds

from jbert.tasks.sources import as_text
from jbert.tasks.question_answering.features import (FeatureReport, read_squad_json, squad_features, squad_references)
from jbert.tasks.question_answering.evaluation import spans_to_answers
from jbert.tasks import TASKS

get_dataset = TASKS.dataset

CONTEXT = "The cat sat on the mat. Zoë Müller lives in Paris, the capital of France."
ANSWER = "Zoë Müller"


def _example(qid="q1", question="Who lives in Paris?", answer=ANSWER, impossible=False, context=CONTEXT,
             start=None):
  answers = {"text": [] if impossible else [answer],
             "answer_start": [] if impossible else [context.index(answer) if start is None else start]}
  return {"id": qid, "question": question, "context": context, "answers": answers, "is_impossible": impossible}


def perfect_logits(features):
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
  # Training features: the same model inputs and labels, without the host-side arrays.
  t = squad_features([_example()], tiny_tokenizer, 16, doc_stride=4, max_query_length=8, training=True)
  assert sorted(t) == ["attention_mask", "end_positions", "example_id", "input_ids", "start_positions",
                       "token_type_ids", "window_index"]
  for k in t:
    np.testing.assert_array_equal(t[k], f[k])


def test_perfect_logits_recover_original_text(tokenizer):
  examples = [_example(), _example("q2", "What is the capital of France?", "Paris"),
              _example("q3", "Where is the cat?", "on the mat")]
  f = squad_features(examples, tokenizer, 16, doc_stride=4, max_query_length=8)
  assert len(set(f["window_index"].tolist())) > 1
  for row in np.flatnonzero(f["start_positions"]):
    begin = f["offsets"][row, f["start_positions"][row], 0]
    end = f["offsets"][row, f["end_positions"][row], 1]
    assert CONTEXT[begin:end] == examples[f["example_id"][row]]["answers"]["text"][0]
  answers = spans_to_answers(f, *perfect_logits(f), n_best=5, max_answer_length=10)
  assert answers == {"q1": ANSWER, "q2": "Paris", "q3": "on the mat"}


def test_question_truncation_is_counted(tiny_tokenizer):
  report = FeatureReport()
  f = squad_features([_example(question="what what what what what what?"), _example("q2")], tiny_tokenizer, 24,
                     doc_stride=8, max_query_length=3, report=report)
  assert tiny_tokenizer.convert_ids_to_tokens(f["input_ids"][0, :5].tolist()) == [
      "[CLS]", "what", "what", "what", "[SEP]"]
  # "who lives in paris ?" is 5 tokens: both questions were cut.
  assert report.truncated_questions == ["q1", "q2"] and report.examples == 2
  assert report.messages("dev.json", training=False, max_query_length=3) == [
      "dev.json: 2 of 2 questions are longer than max_query_length=3 tokens and were cut to it (q1, q2)."]


def test_empty_context_and_misplaced_answer_are_skipped_in_training_only(tiny_tokenizer):
  examples = [
      _example("ok"),
      _example("empty", context="  ", answer=" ", start=0),
      _example("moved", start=3),  # "Zoë Müller" is at 24, not 3
      _example("beyond", start=500),
      _example("none", impossible=True),
  ]
  report = FeatureReport()
  train = squad_features(examples, tiny_tokenizer, 32, max_query_length=8, training=True, report=report)
  assert train["example_id"].tolist() == [0, 4]  # the impossible question trains the [CLS] answer
  assert train["start_positions"].tolist() == [7 + 7, 0]
  assert report.empty_contexts == ["empty"] and report.misplaced_answers == ["moved", "beyond"]
  lines = report.messages("train.json", training=True, max_query_length=8)
  assert lines == [
      "train.json: 1 examples have a context without any token (empty); skipped.",
      "train.json: 2 examples have an answer whose text is not at its answer_start in the context (moved, "
      "beyond); skipped."]

  report = FeatureReport()
  dev = squad_features(examples, tiny_tokenizer, 32, max_query_length=8, report=report)
  assert dev["example_id"].tolist() == [0, 1, 2, 3, 4]
  # The empty context still has its window ([CLS] question [SEP] [SEP]), and is answered "".
  assert dev["attention_mask"][1].sum() == 8 and (dev["offsets"][1] == -1).all()
  answers = spans_to_answers(dev, *perfect_logits(dev), n_best=5, max_answer_length=10)
  assert answers["ok"] == ANSWER and answers["empty"] == ""
  assert report.messages("dev.json", training=False, max_query_length=8)[1].endswith(
      "(moved, beyond); kept; the official score reads only the answer texts.")


def test_squad_1_refuses_questions_without_answers(tiny_tokenizer):
  with pytest.raises(ValueError, match=r"example 'none' has no answer: it is a SQuAD 2.0 unanswerable question. "
                                       r"Train and score such data with configs/finetune.py:squad_v2"):
    squad_features([_example(), _example("none", impossible=True)], tiny_tokenizer, 32, max_query_length=8,
                   require_answers=True)


def test_bad_lengths(tiny_tokenizer):
  with pytest.raises(ValueError, match=r"max_seq_length=67 leaves no room for the context after a 64-token "
                                       r"question, \[CLS\] and two \[SEP\]; raise it above 67"):
    squad_features([_example()], tiny_tokenizer, 67)
  with pytest.raises(ValueError, match="doc_stride must be >= 1 token, got 0"):
    squad_features([_example()], tiny_tokenizer, 128, doc_stride=0)


def run_qa_doc_stride(max_seq_length: int, question_tokens: int, overlap: int) -> int:
  """The README's arithmetic: transformers' run_qa.py windows hold W = L - 3 - Q context tokens and overlap by its
  doc_stride S, so their starts are W - S apart; jbert's doc_stride is that step."""
  return max_seq_length - 3 - question_tokens - overlap


def test_run_qa_windows_are_jbert_windows_with_the_documented_doc_stride(tiny_tokenizer, tmp_path):
  """task.doc_stride is the original BERT's step between window starts; run_qa.py's doc_stride is the overlap
  of consecutive windows. With doc_stride = L - 3 - Q - S, every window equals run_qa's (same tokens, same count),
  for each question length Q, context length and overlap tried."""
  import transformers
  from tests.tasks.tokenizers import TINY_VOCAB
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
  theirs_tokenizer = transformers.BertTokenizerFast(vocab=str(vocab))
  words = [w for w in TINY_VOCAB[5:] if not w.startswith("##")]
  rng = np.random.default_rng(0)
  compared = 0
  for length, overlap, question_words in ((16, 1, 1), (16, 4, 3), (24, 2, 5), (32, 8, 2), (32, 16, 4)):
    for context_words in range(1, 50, 3):
      question, context = (" ".join(rng.choice(words, n)) for n in (question_words, context_words))
      theirs = theirs_tokenizer(question, context, truncation="only_second", max_length=length, stride=overlap,
                                return_overflowing_tokens=True)["input_ids"]  # run_qa.py's prepare_train_features
      stride = run_qa_doc_stride(length, len(tiny_tokenizer.ids(question)), overlap)
      f = squad_features([_example(question=question, context=context, impossible=True)], tiny_tokenizer, length,
                         doc_stride=stride, max_query_length=length - 4)
      mine = [row[mask == 1].tolist() for row, mask in zip(f["input_ids"], f["attention_mask"])]
      assert mine == [list(ids) for ids in theirs], (length, overlap, question, context)
      compared += len(mine)
  assert compared > 100  # many contexts span several windows
  # The defaults differ: jbert steps 128 tokens, run_qa overlaps 128 (a step of 381 - Q - 128 at 384 tokens).
  assert run_qa_doc_stride(384, 12, 128) == 241


@pytest.mark.parametrize("name", ["squad", "squad_v2"])
def test_mock_tfds_features(tokenizer, name):
  task = get_dataset(name)
  with tfds.testing.mock_data(num_examples=3):
    source = task.load("validation")
    examples = [source[i] for i in range(len(source))]
  report = FeatureReport()
  f = task.features(examples, tokenizer, 64, doc_stride=16, max_query_length=16, report=report)
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
  # Mock answers are random strings, never at their answer_start: reported, and kept for evaluation.
  answerable = [as_text(e["id"]) for e in examples if not e.get("is_impossible", False)]
  assert report.misplaced_answers == answerable
  answers = spans_to_answers(f, *perfect_logits(f), version_2_with_negative=task.version_2_with_negative)
  assert sorted(answers) == sorted(squad_references(examples))


SQUAD_JSON = {"version": "v2.0", "data": [
    {"title": "Cats", "paragraphs": [
        {"context": CONTEXT, "qas": [
            {"id": "q1", "question": "Who lives in Paris?",
             "answers": [{"text": ANSWER, "answer_start": 24}, {"text": "Zoë", "answer_start": 24}]},
            {"id": "q2", "question": "Who lives in Rome?", "answers": [], "is_impossible": True,
             "plausible_answers": [{"text": ANSWER, "answer_start": 24}]},
        ]}]},
    {"title": "Test", "paragraphs": [{"context": "Paris.", "qas": [{"id": 7, "question": "Where?"}]}]},
]}


def test_read_squad_json(tmp_path):
  path = tmp_path / "dev.json"
  path.write_text(json.dumps(SQUAD_JSON), encoding="utf-8")
  examples = read_squad_json(path)
  assert examples == [
      {"id": "q1", "title": "Cats", "context": CONTEXT, "question": "Who lives in Paris?",
       "answers": {"text": [ANSWER, "Zoë"], "answer_start": [24, 24]}, "is_impossible": False},
      {"id": "q2", "title": "Cats", "context": CONTEXT, "question": "Who lives in Rome?",
       "answers": {"text": [], "answer_start": []}, "is_impossible": True},
      {"id": "7", "title": "Test", "context": "Paris.", "question": "Where?",
       "answers": {"text": [], "answer_start": []}, "is_impossible": False},
  ]
  assert squad_references(examples) == {"q1": [ANSWER, "Zoë"], "q2": [], "7": []}


@pytest.mark.parametrize("content, message", [
    ("{\"data\": [", r"bad.json is not JSON \(Expecting value at line 1\); SQuAD files are one JSON object"),
    ("[1, 2]", r"bad.json has no top-level \"data\" list"),
    (json.dumps({"data": [{"paragraphs": [{"qas": []}]}]}),
     r"bad.json: data\[0\].paragraphs\[0\] needs a 'context' field holding a str\."),
    (json.dumps({"data": [{"paragraphs": [{"context": "x", "qas": [{"question": "q"}]}]}]}),
     r"bad.json: data\[0\].paragraphs\[0\].qas\[0\] needs a 'id' field holding a str or int\."),
    (json.dumps({"data": [{"paragraphs": [{"context": "x", "qas": [
        {"id": "a", "question": "q", "answers": [{"text": "x", "answer_start": "0"}]}]}]}]}),
     r"bad.json: an answer of question 'a' needs a 'answer_start' field holding a int, got '0'\."),
    (json.dumps({"data": [{"paragraphs": [{"context": "x", "qas": [
        {"id": "a", "question": "q"}, {"id": "a", "question": "r"}]}]}]}),
     r"bad.json: question id 'a' appears twice; predictions are keyed by id"),
])
def test_read_squad_json_refuses_bad_files(tmp_path, content, message):
  path = tmp_path / "bad.json"
  path.write_text(content, encoding="utf-8")
  with pytest.raises(ValueError, match=message):
    read_squad_json(path)


def test_read_squad_json_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"the SQuAD file .*nope.json does not exist"):
    read_squad_json(tmp_path / "nope.json")


def test_roberta_and_xlmr_windows_are_run_qa_windows(family_folder):
  """RoBERTa's and XLM-R's layout, `<s> Q </s></s> C </s>` with one token type: every window equals transformers'
  run_qa windows (4 special tokens, so W = L - 4 - Q), and the labelled answer tokens cover the answer's text."""
  import transformers
  from jbert.tokenizer import load_tokenizer
  tok = load_tokenizer(family_folder)
  theirs_tokenizer = transformers.AutoTokenizer.from_pretrained(str(family_folder))
  question = "Who lives in Paris?"
  context = ("The cat sat on the mat. Zoë Müller lives in Paris, the capital of France. Привет, 東京は日本の首都です。 "
             "Nobody else lives there, and the river runs on.")
  compared = 0
  question_tokens = len(tok.ids(question))
  for width, overlap in ((10, 2), (20, 8), (28, 4)):  # context tokens per window
    length = question_tokens + 4 + width
    stride = width - overlap
    theirs = theirs_tokenizer(question, context, truncation="only_second", max_length=length, stride=overlap,
                              return_overflowing_tokens=True)["input_ids"]
    f = squad_features([_example(question=question, context=context)], tok, length, doc_stride=stride,
                       max_query_length=length - 5, training=False)
    mine = [row[mask == 1].tolist() for row, mask in zip(f["input_ids"], f["attention_mask"])]
    assert mine == [list(ids) for ids in theirs], length
    assert len(mine) > 1  # the context spans several windows
    assert not f["token_type_ids"].any()
    for row, start, end in zip(f["input_ids"], f["start_positions"], f["end_positions"]):
      if start:
        assert tok.decode(row[start:end + 1].tolist()).strip() == ANSWER
        compared += 1
  assert compared >= 2  # the narrowest windows may hold no answer whole
  with pytest.raises(ValueError, match=r"max_seq_length=68 leaves no room for the context after a 64-token "
                                       r"question, <s> and 3 </s>; raise it above 68"):
    squad_features([_example()], tok, 68)
