"""SQuAD predictions from per-window logits, and the official v1.1 / v2.0 exact match and F1.

`postprocess` is google-research/bert `run_squad.py`'s `write_predictions` on character offsets: per window the
`n_best` top start and end logits are paired, the valid spans of all windows are ranked by start + end logit,
and the best `n_best` distinct texts form the n-best list. SQuAD 2.0 adds the null answer: its score is the
lowest [CLS] start + end over the windows, and "" is answered when it beats the best span by more than
`null_score_diff_threshold`. `squad_metrics` is the official evaluation script of either version.
"""
import collections
from collections.abc import Mapping, Sequence
import dataclasses
import math
import re
import string

import numpy as np


@dataclasses.dataclass
class SquadPredictions:
  """What `run_squad.py` writes, keyed by question id in example order.

  Attributes:
    answers: predictions.json: the answer text ("" for a predicted null).
    nbest: nbest_predictions.json: up to `n_best` entries {text, probability, start_logit, end_logit}.
    null_odds: null_odds.json (SQuAD 2.0 only): null score minus the best span's score; +inf when no window
      holds a valid span.
    best_spans: the best non-null answer text ("" when there is none), whatever the null score.
  """
  answers: dict[str, str]
  nbest: dict[str, list[dict[str, float | str]]]
  null_odds: dict[str, float]
  best_spans: dict[str, str]


def postprocess(features: Mapping[str, np.ndarray], start_logits: np.ndarray, end_logits: np.ndarray, *,
                n_best: int = 20, max_answer_length: int = 30, null_score_diff_threshold: float = 0.0,
                version_2_with_negative: bool = False) -> SquadPredictions:
  """Answers, n-best lists and null odds from logits [N, T] aligned with the rows of `squad_features`.

  A span is valid when both ends are context tokens of the window, end >= start, it is at most
  `max_answer_length` tokens long and its start has maximal context in this window. Ties keep run_squad.py's
  order: windows in order, then start rank, then end rank, and the null answer after spans of equal score.
  A question without any valid span (and, in SQuAD 1.1, without a null answer) is answered "".
  """
  start_logits, end_logits = np.asarray(start_logits), np.asarray(end_logits)
  expected = features["input_ids"].shape
  if start_logits.shape != expected or end_logits.shape != expected:
    raise ValueError(f"logits {start_logits.shape} / {end_logits.shape} must match the features' input_ids "
                     f"{expected}; drop padding rows (mask == 0) from eval batches first.")
  if n_best < 1 or max_answer_length < 1:
    raise ValueError(f"n_best={n_best} and max_answer_length={max_answer_length} must both be >= 1.")
  offsets, max_context, contexts = features["offsets"], features["token_is_max_context"], features["context"]
  by_example = collections.defaultdict(list)
  for row, example_id in enumerate(features["example_id"]):
    by_example[int(example_id)].append(row)
  out = SquadPredictions({}, {}, {}, {})
  for rows in by_example.values():
    qid = features["qid"][rows[0]]
    # (score, start logit, end logit, row, start, end) in run_squad.py's candidate order.
    candidates = []
    null = None
    for row in rows:
      s, e = start_logits[row].astype(np.float64), end_logits[row].astype(np.float64)
      if null is None or s[0] + e[0] < null[0]:
        null = (s[0] + e[0], s[0], e[0])
      # Stable sorts rank tied logits by position, as run_squad.py's sorted() does.
      i = np.argsort(-s, kind="stable")[:n_best, None]  # [n_best, 1]
      j = np.argsort(-e, kind="stable")[None, :n_best]  # [1, n_best]
      valid = ((offsets[row, i, 0] >= 0) & (offsets[row, j, 0] >= 0) & max_context[row, i]
               & (j >= i) & (j - i < max_answer_length))
      a, b = np.nonzero(valid)  # row-major: start rank, then end rank
      starts, ends = i[a, 0], j[0, b]
      candidates += [(s[x] + e[y], s[x], e[y], row, x, y) for x, y in zip(starts.tolist(), ends.tolist())]
    if version_2_with_negative:
      candidates.append((null[0], null[1], null[2], None, 0, 0))
    candidates.sort(key=lambda c: -c[0])  # stable
    entries, seen = [], set()
    for score, s, e, row, x, y in candidates:
      if len(entries) >= n_best:
        break
      text = "" if row is None else contexts[row][offsets[row, x, 0]:offsets[row, y, 1]].strip()
      if text in seen or (row is not None and not text):  # a span of only whitespace is no answer
        continue
      seen.add(text)
      entries.append((text, score, s, e))
    if version_2_with_negative and "" not in seen:
      entries.append(("", null[0], null[1], null[2]))
    probabilities = _softmax([entry[1] for entry in entries])
    out.nbest[qid] = [{"text": t, "probability": p, "start_logit": s, "end_logit": e}
                      for (t, _, s, e), p in zip(entries, probabilities)]
    best_span = next((entry for entry in entries if entry[0]), None)
    out.best_spans[qid] = best_span[0] if best_span else ""
    if version_2_with_negative:
      odds = null[0] - best_span[1] if best_span else math.inf
      out.null_odds[qid] = odds
      out.answers[qid] = "" if odds > null_score_diff_threshold else best_span[0]
    else:
      out.answers[qid] = out.best_spans[qid]
  return out


def _softmax(scores: Sequence[float]) -> list[float]:
  if not scores:
    return []
  top = max(scores)
  exps = [math.exp(s - top) for s in scores]
  total = sum(exps)
  return [x / total for x in exps]


def spans_to_answers(features: Mapping[str, np.ndarray], start_logits: np.ndarray, end_logits: np.ndarray,
                     n_best: int = 20, max_answer_length: int = 30, null_score_diff_threshold: float = 0.0, *,
                     version_2_with_negative: bool = False) -> dict[str, str]:
  """{qid: answer text} in the original casing and spacing of the context; see `postprocess`."""
  return postprocess(features, start_logits, end_logits, n_best=n_best, max_answer_length=max_answer_length,
                     null_score_diff_threshold=null_score_diff_threshold,
                     version_2_with_negative=version_2_with_negative).answers


def normalize_answer(text: str) -> str:
  """Lower case, drop punctuation and the articles a/an/the, squeeze whitespace (both official scripts)."""
  text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", text).split())


_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def squad_metrics(predictions: Mapping[str, str], references: Mapping[str, Sequence[str]], *,
                  version_2_with_negative: bool = True,
                  null_odds: Mapping[str, float] | None = None) -> dict[str, float]:
  """Exact match and F1 in percent, as the official evaluation script of SQuAD 2.0 (or 1.1) computes them.

  Each prediction scores its best match among the gold answers. A question without a prediction scores 0
  (the 1.1 script's rule; the 2.0 script would stop at it).

  2.0: gold answers that normalise to "" are dropped and a question left with none has the only gold answer
  "", which an empty prediction matches (EM and F1 1). `HasAns_*` and `NoAns_*` split the scores by whether
  the question has gold answers at all. With `null_odds` (the script's `--na-prob-file`), `best_exact`,
  `best_f1` and their thresholds come from its search over answering exactly the questions whose null odds
  are at most the threshold.

  1.1: every question needs a gold answer; F1 of two answers without tokens is 0.

  Returns:
    `exact_match`, `f1`, `total`, and for 2.0 the `HasAns_*`, `NoAns_*` and `best_*` keys of the script.
  """
  exact, f1, has_answer = {}, {}, {}
  for qid, golds in references.items():
    golds = list(golds)
    has_answer[qid] = bool(golds)
    if not version_2_with_negative and not golds:
      raise ValueError(f"question {qid!r} has no gold answer, which SQuAD 1.1 scoring cannot score; score "
                       "SQuAD 2.0 data with version_2_with_negative=True.")
    if version_2_with_negative:
      golds = [g for g in golds if normalize_answer(g)] or [""]
    prediction = predictions.get(qid)
    if prediction is None:
      exact[qid] = f1[qid] = 0.0
      continue
    score_f1 = _f1_v2 if version_2_with_negative else _f1_v1
    exact[qid] = max(float(normalize_answer(g) == normalize_answer(prediction)) for g in golds)
    f1[qid] = max(score_f1(g, prediction) for g in golds)
  result = _averages(exact, f1, list(references), "exact_match")
  if not version_2_with_negative:
    return result
  for prefix, keep in (("HasAns_", True), ("NoAns_", False)):
    subset = [q for q, h in has_answer.items() if h == keep]
    if subset:
      result.update({prefix + k: v for k, v in _averages(exact, f1, subset, "exact").items()})
  if null_odds is not None:
    for name, scores in (("exact", exact), ("f1", f1)):
      result[f"best_{name}"], result[f"best_{name}_thresh"] = _best_threshold(predictions, scores, null_odds,
                                                                              has_answer)
  return result


def _f1_v1(gold: str, prediction: str) -> float:
  common = collections.Counter(normalize_answer(gold).split()) & collections.Counter(
      normalize_answer(prediction).split())
  return _f1_of(sum(common.values()), normalize_answer(gold).split(), normalize_answer(prediction).split())


def _f1_v2(gold: str, prediction: str) -> float:
  gold_tokens, predicted_tokens = normalize_answer(gold).split(), normalize_answer(prediction).split()
  if not gold_tokens or not predicted_tokens:
    return float(gold_tokens == predicted_tokens)
  common = collections.Counter(gold_tokens) & collections.Counter(predicted_tokens)
  return _f1_of(sum(common.values()), gold_tokens, predicted_tokens)


def _f1_of(num_same: int, gold_tokens: Sequence[str], predicted_tokens: Sequence[str]) -> float:
  if num_same == 0:
    return 0.0
  precision, recall = num_same / len(predicted_tokens), num_same / len(gold_tokens)
  return 2 * precision * recall / (precision + recall)


def _averages(exact: Mapping[str, float], f1: Mapping[str, float], qids: Sequence[str],
              exact_name: str) -> dict[str, float]:
  total = len(qids)
  return {
      exact_name: 100.0 * sum(exact[q] for q in qids) / total if total else 0.0,
      "f1": 100.0 * sum(f1[q] for q in qids) / total if total else 0.0,
      "total": float(total),
  }


def _best_threshold(predictions: Mapping[str, str], scores: Mapping[str, float], null_odds: Mapping[str, float],
                    has_answer: Mapping[str, bool]) -> tuple[float, float]:
  """The v2.0 script's `find_best_thresh`: starting from "every question null", answer the questions in
  increasing null odds and keep the best score (first reached) and the odds where it was reached."""
  missing = [q for q in has_answer if q not in null_odds]
  if missing:
    raise ValueError(f"null_odds lacks question(s) {missing[:5]}; it needs one value per question.")
  score = best = float(sum(not h for h in has_answer.values()))
  threshold = 0.0
  for qid in sorted(null_odds, key=lambda q: null_odds[q]):
    if qid not in scores:
      continue
    if has_answer[qid]:
      score += scores[qid]
    elif predictions.get(qid):
      score -= 1
    if score > best:
      best, threshold = score, float(null_odds[qid])
  return 100.0 * best / len(scores), threshold
