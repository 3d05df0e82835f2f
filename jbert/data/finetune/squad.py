"""SQuAD v1.1 / v2.0: sliding-window features, span post-processing and the official EM/F1.

Windows follow google-research/bert `run_squad.py`: the question is cut to `max_query_length` tokens, the
context is split into windows whose starts are `doc_stride` tokens apart, and a span may only start at a token
of the window that gives it the most context. Answers map back to the original text through the tokenizer's
character offsets (as Hugging Face's `run_qa.py` does), so casing, accents and spacing survive.

Besides the int32 model inputs, features carry host-side arrays for post-processing: `offsets` [N, T, 2]
(character span of each context token, -1 elsewhere), `token_is_max_context` [N, T] and the object arrays
`qid` and `context`. Send only the model inputs to devices.
"""
import collections
from collections.abc import Iterable, Mapping, Sequence
import re
import string
from typing import Any

import numpy as np

from jbert.data.finetune.glue import as_text, require_keys


def squad_features(examples: Iterable[Mapping[str, Any]], tokenizer, max_seq_length: int, *,
                   doc_stride: int = 128, max_query_length: int = 64) -> dict[str, np.ndarray]:
  """Features of TFDS `squad/v1.1` or `squad/v2.0` examples, one row per context window.

  Returns:
    int32 `input_ids, token_type_ids, attention_mask` [N, T]; int32 `start_positions, end_positions` [N]
    (token index in the window, 0 = [CLS] when the first gold answer is not inside the window or the question
    is impossible); int32 `example_id` (index into `examples`) and `window_index` [N]; int32 `offsets`
    [N, T, 2]; bool `token_is_max_context` [N, T]; object `qid`, `context` [N].
  """
  if doc_stride < 1:
    raise ValueError(f"doc_stride must be >= 1 token, got {doc_stride}.")
  rows = collections.defaultdict(list)
  for example_id, example in enumerate(examples):
    require_keys(example, ("id", "question", "context", "answers"))
    question_ids = tokenizer.ids(as_text(example["question"]))[:max_query_length]
    context = as_text(example["context"])
    context_ids, context_offsets = tokenizer.ids_with_offsets(context)
    max_context_tokens = max_seq_length - len(question_ids) - 3
    if max_context_tokens < 1:
      raise ValueError(f"max_seq_length={max_seq_length} leaves no room for the context after a "
                       f"{len(question_ids)}-token question; raise it above {len(question_ids) + 3} or lower "
                       f"max_query_length={max_query_length}.")
    answer = None if bool(example.get("is_impossible", False)) else _answer_tokens(example, context_offsets)
    prefix = [tokenizer.cls_id, *question_ids, tokenizer.sep_id]
    windows = _windows(len(context_ids), max_context_tokens, doc_stride)
    best_window = _best_windows(windows, len(context_ids))
    for window_index, (begin, length) in enumerate(windows):
      ids = prefix + context_ids[begin:begin + length] + [tokenizer.sep_id]
      pad = max_seq_length - len(ids)
      offsets = np.full((max_seq_length, 2), -1, np.int32)
      offsets[len(prefix):len(prefix) + length] = context_offsets[begin:begin + length]
      max_context = np.zeros(max_seq_length, bool)
      max_context[len(prefix):len(prefix) + length] = best_window[begin:begin + length] == window_index
      start = end = 0
      if answer is not None and begin <= answer[0] and answer[1] < begin + length:
        start, end = (p - begin + len(prefix) for p in answer)
      rows["input_ids"].append(ids + [tokenizer.pad_id] * pad)
      rows["token_type_ids"].append([0] * len(prefix) + [1] * (length + 1) + [0] * pad)
      rows["attention_mask"].append([1] * len(ids) + [0] * pad)
      rows["start_positions"].append(start)
      rows["end_positions"].append(end)
      rows["example_id"].append(example_id)
      rows["window_index"].append(window_index)
      rows["offsets"].append(offsets)
      rows["token_is_max_context"].append(max_context)
      rows["qid"].append(as_text(example["id"]))
      rows["context"].append(context)
  features = {k: np.asarray(rows[k], np.int32).reshape(-1, max_seq_length) for k in
              ("input_ids", "token_type_ids", "attention_mask")}
  for k in ("start_positions", "end_positions", "example_id", "window_index"):
    features[k] = np.asarray(rows[k], np.int32).reshape(-1)
  features["offsets"] = np.asarray(rows["offsets"], np.int32).reshape(-1, max_seq_length, 2)
  features["token_is_max_context"] = np.asarray(rows["token_is_max_context"], bool).reshape(
      -1, max_seq_length)
  for k in ("qid", "context"):
    features[k] = np.empty(len(rows[k]), object)
    features[k][:] = rows[k]
  return features


def _answer_tokens(example: Mapping[str, Any], offsets: Sequence[tuple[int, int]]) -> tuple[int, int] | None:
  """Context token span (inclusive) of the first gold answer; None if there is none or it is off the text."""
  texts, starts = example["answers"]["text"], example["answers"]["answer_start"]
  if len(texts) == 0:
    return None
  char_start = int(starts[0])
  char_end = char_start + len(as_text(texts[0]))
  covering = [i for i, (s, e) in enumerate(offsets) if s < char_end and e > char_start]
  return (covering[0], covering[-1]) if covering else None


def _windows(num_tokens: int, max_tokens: int, doc_stride: int) -> list[tuple[int, int]]:
  """(begin, length) of context windows whose begins are `doc_stride` apart; the last reaches the end."""
  windows, begin = [], 0
  while True:
    length = min(num_tokens - begin, max_tokens)
    windows.append((begin, length))
    if begin + length >= num_tokens:
      return windows
    begin += min(length, doc_stride)


def _best_windows(windows: list[tuple[int, int]], num_tokens: int) -> np.ndarray:
  """Per context token, the first window maximising min(left, right context) + 0.01 * length.

  This is run_squad.py's `_check_is_max_context`, vectorised over tokens.
  """
  position = np.arange(num_tokens)
  scores = np.full((len(windows), num_tokens), -np.inf)
  for index, (begin, length) in enumerate(windows):
    inside = (position >= begin) & (position < begin + length)
    score = np.minimum(position - begin, begin + length - 1 - position) + 0.01 * length
    scores[index] = np.where(inside, score, -np.inf)
  return np.argmax(scores, axis=0)


def spans_to_answers(features: Mapping[str, np.ndarray], start_logits: np.ndarray, end_logits: np.ndarray,
                     n_best: int = 20, max_answer_length: int = 30, null_score_diff_threshold: float = 0.0, *,
                     version_2_with_negative: bool = False) -> dict[str, str]:
  """Best answer text per question from per-window logits [N, T] aligned with `features` rows.

  For every window the `n_best` top start and end logits are paired; a span is valid when both ends are
  context tokens, end >= start, it is at most `max_answer_length` tokens long and its start has maximal
  context in this window. The highest start + end logit over all windows wins. With
  `version_2_with_negative`, "" is answered when the lowest [CLS] score over the windows exceeds the best span
  score by more than `null_score_diff_threshold`.

  Returns:
    {qid: answer text} in the original casing and spacing of the context.
  """
  start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
  expected = features["input_ids"].shape
  if start_logits.shape != expected or end_logits.shape != expected:
    raise ValueError(f"logits {start_logits.shape} / {end_logits.shape} must match the features' input_ids "
                     f"{expected}; drop padding rows (mask == 0) from eval batches first.")
  offsets, max_context = features["offsets"], features["token_is_max_context"]
  by_example = collections.defaultdict(list)
  for row, example_id in enumerate(features["example_id"]):
    by_example[int(example_id)].append(row)
  answers = {}
  for rows in by_example.values():
    best, null_score = None, np.inf
    for row in rows:
      s, e = start_logits[row], end_logits[row]
      null_score = min(null_score, s[0] + e[0])
      # Stable sorts rank tied logits by position, as run_squad.py's sorted() does.
      i = np.argsort(-s, kind="stable")[:n_best, None]  # [n_best, 1]
      j = np.argsort(-e, kind="stable")[None, :n_best]  # [1, n_best]
      valid = ((offsets[row, i, 0] >= 0) & (offsets[row, j, 0] >= 0) & max_context[row, i]
               & (j >= i) & (j - i < max_answer_length))
      if not valid.any():
        continue
      scores = np.where(valid, s[i] + e[j], -np.inf)
      # argmax keeps the first of tied pairs in (start rank, end rank) order, as run_squad.py's loop does.
      a, b = np.unravel_index(np.argmax(scores), scores.shape)
      if best is None or scores[a, b] > best[0]:
        best = (scores[a, b], row, i[a, 0], j[0, b])
    text = ""
    if best is not None:
      _, row, i, j = best
      text = features["context"][row][offsets[row, i, 0]:offsets[row, j, 1]]
      if version_2_with_negative and null_score - best[0] > null_score_diff_threshold:
        text = ""
    answers[features["qid"][rows[0]]] = text
  return answers


def squad_references(examples: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
  """{qid: gold answer texts} of SQuAD examples (empty for v2.0 impossible questions)."""
  return {as_text(ex["id"]): [as_text(t) for t in ex["answers"]["text"]] for ex in examples}


def normalize_answer(text: str) -> str:
  """Lower case, drop punctuation and the articles a/an/the, squeeze whitespace (official SQuAD script)."""
  text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", text).split())


_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def squad_metrics(predictions: Mapping[str, str],
                  references: Mapping[str, Sequence[str]]) -> dict[str, float]:
  """Exact match and F1 in percent as the official SQuAD v2.0 script (v1.1 gives the same on v1.1 data).

  Each prediction scores its best match among the gold answers; gold answers that normalise to "" are
  dropped and a question left with none is a no-answer question whose only gold answer is "". A question
  without a prediction scores 0. With no-answer questions present, `has_ans_*` and `no_ans_*` break the
  scores down as the v2.0 script does.
  """
  exact, f1, has_answer = {}, {}, {}
  for qid, golds in references.items():
    golds = [g for g in golds if normalize_answer(g)] or [""]
    has_answer[qid] = golds != [""]
    prediction = predictions.get(qid)
    if prediction is None:
      exact[qid] = f1[qid] = 0.0
      continue
    exact[qid] = max(float(normalize_answer(g) == normalize_answer(prediction)) for g in golds)
    f1[qid] = max(_f1(g, prediction) for g in golds)
  result = _averages(exact, f1, list(references))
  if not all(has_answer.values()):
    for prefix, keep in (("has_ans_", True), ("no_ans_", False)):
      subset = [q for q, h in has_answer.items() if h == keep]
      if subset:
        result.update({prefix + k: v for k, v in _averages(exact, f1, subset).items()})
  return result


def _f1(gold: str, prediction: str) -> float:
  gold_tokens, predicted_tokens = normalize_answer(gold).split(), normalize_answer(prediction).split()
  if not gold_tokens or not predicted_tokens:
    return float(gold_tokens == predicted_tokens)
  common = collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0.0
  precision, recall = num_same / len(predicted_tokens), num_same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def _averages(exact: Mapping[str, float], f1: Mapping[str, float], qids: Sequence[str]) -> dict[str, float]:
  total = len(qids)
  return {
      "exact_match": 100.0 * sum(exact[q] for q in qids) / total if total else 0.0,
      "f1": 100.0 * sum(f1[q] for q in qids) / total if total else 0.0,
      "total": float(total),
  }
