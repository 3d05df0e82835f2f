"""SQuAD v1.1 / v2.0 inputs: examples from TFDS or SQuAD JSON files, and sliding-window features.

Windows follow google-research/bert `run_squad.py`: the question is cut to `max_query_length` tokens, the
context is split into windows whose starts are `doc_stride` tokens apart, and a span may only start at a token
of the window that gives it the most context. Answers map back to the original text through the tokenizer's
character offsets (as Hugging Face's `run_qa.py` does), so casing, accents and spacing survive.

Evaluation features carry, besides the int32 model inputs, host-side arrays for post-processing
(`evaluation.py`): `offsets` [N, T, 2] (character span of each context token, -1 elsewhere),
`token_is_max_context` [N, T] and the object arrays `qid` and `context`. Send only the model inputs to devices.

Examples that cannot be used are never a crash: `FeatureReport` collects them by id (questions cut to
`max_query_length`, contexts without a token, answers whose text is not at their `answer_start`), and training
features leave out the last two kinds.
"""
import collections
from collections.abc import Iterable, Mapping
import dataclasses
import os
from typing import Any

import numpy as np

from jbert.data import files
from jbert.tasks.sources import as_text, require_keys

MODEL_KEYS = ("input_ids", "token_type_ids", "attention_mask")


@dataclasses.dataclass
class FeatureReport:
  """Example ids whose features differ from the raw example (filled by `squad_features`)."""
  examples: int = 0
  truncated_questions: list[str] = dataclasses.field(default_factory=list)
  empty_contexts: list[str] = dataclasses.field(default_factory=list)
  misplaced_answers: list[str] = dataclasses.field(default_factory=list)

  def messages(self, where: str, *, training: bool, max_query_length: int, shown: int = 5) -> list[str]:
    """One line per kind of problem, naming up to `shown` example ids."""
    def ids(qids):
      return ", ".join(qids[:shown]) + (f" and {len(qids) - shown} more" if len(qids) > shown else "")
    effect = "skipped" if training else "kept; the official score reads only the answer texts"
    lines = []
    if self.truncated_questions:
      lines.append(f"{where}: {len(self.truncated_questions)} of {self.examples} questions are longer than "
                   f"max_query_length={max_query_length} tokens and were cut to it ({ids(self.truncated_questions)}).")
    if self.empty_contexts:
      lines.append(f"{where}: {len(self.empty_contexts)} examples have a context without any token ("
                   f"{ids(self.empty_contexts)}); " + ("skipped." if training else "they are answered \"\"."))
    if self.misplaced_answers:
      lines.append(f"{where}: {len(self.misplaced_answers)} examples have an answer whose text is not at its "
                   f"answer_start in the context ({ids(self.misplaced_answers)}); {effect}.")
    return lines


def check_lengths(max_seq_length: int, max_query_length: int, doc_stride: int, separators: int = 1) -> None:
  """run_squad.py's condition for every window to hold at least one context token; `separators`: the tokens
  between question and context (BERT's [SEP], RoBERTa's </s></s>)."""
  if doc_stride < 1:
    raise ValueError(f"doc_stride must be >= 1 token, got {doc_stride}.")
  if max_query_length < 1:
    raise ValueError(f"max_query_length must be >= 1 token, got {max_query_length}.")
  specials = 2 + separators
  named = "[CLS] and two [SEP]" if separators == 1 else f"<s> and {separators + 1} </s>"
  if max_seq_length <= max_query_length + specials:
    raise ValueError(f"max_seq_length={max_seq_length} leaves no room for the context after a "
                     f"{max_query_length}-token question, {named}; raise it above "
                     f"{max_query_length + specials} or lower max_query_length.")


def is_impossible(example: Mapping[str, Any]) -> bool:
  """SQuAD 2.0's unanswerable questions: flagged, or without any gold answer."""
  return bool(example.get("is_impossible", False)) or len(example["answers"]["text"]) == 0


def squad_features(examples: Iterable[Mapping[str, Any]], tokenizer, max_seq_length: int, *,
                   doc_stride: int = 128, max_query_length: int = 64, training: bool = False,
                   require_answers: bool = False, report: FeatureReport | None = None) -> dict[str, np.ndarray]:
  """Features of SQuAD examples (TFDS `squad/v1.1`, `squad/v2.0` or `read_squad_json`), one row per window.

  Args:
    training: leave out examples whose context has no token or whose answer is not at its `answer_start`
      (evaluation keeps every question, so each one gets a prediction), and skip the host-only arrays.
    require_answers: every example must have a gold answer (SQuAD 1.1); a ValueError names the first without.
    report: filled with the ids of changed or unusable examples.

  Returns:
    int32 `input_ids, token_type_ids, attention_mask` [N, T]; int32 `start_positions, end_positions` [N]
    (token index in the window, 0 = [CLS] when the first gold answer is not inside the window or the question
    is impossible); int32 `example_id` (index into `examples`) and `window_index` [N]. Unless `training`: int32
    `offsets` [N, T, 2]; bool `token_is_max_context` [N, T]; object `qid`, `context` [N].
  """
  check_lengths(max_seq_length, max_query_length, doc_stride, len(tokenizer.pair_separator_ids))
  report = FeatureReport() if report is None else report
  rows = collections.defaultdict(list)
  tokenized = (None, None)  # SQuAD asks several questions about each context, one after the other.
  for example_id, example in enumerate(examples):
    require_keys(example, ("id", "question", "context", "answers"))
    qid, context = as_text(example["id"]), as_text(example["context"])
    report.examples += 1
    impossible = is_impossible(example)
    if require_answers and impossible:
      raise ValueError(f"example {qid!r} has no answer: it is a SQuAD 2.0 unanswerable question. Train and "
                       "score such data with configs/finetune.py:squad_v2.")
    question_ids = tokenizer.ids(as_text(example["question"]))
    if len(question_ids) > max_query_length:
      report.truncated_questions.append(qid)
      question_ids = question_ids[:max_query_length]
    if tokenized[0] != context:
      ids, offsets = tokenizer.ids_with_offsets(context)
      tokenized = (context, (ids, np.asarray(offsets, np.int32).reshape(-1, 2)))
    context_ids, context_offsets = tokenized[1]
    answer = None
    if not context_ids:
      report.empty_contexts.append(qid)
      if training:
        continue
    elif not impossible:
      answer = _answer_tokens(example, context, context_offsets)
      if answer is None:
        report.misplaced_answers.append(qid)
        if training:
          continue
    prefix = [tokenizer.cls_id, *question_ids, *tokenizer.pair_separator_ids]  # RoBERTa's: <s> Q </s></s>
    windows = _windows(len(context_ids), max_seq_length - len(prefix) - 1, doc_stride)
    best_window = _best_windows(windows, len(context_ids))
    for window_index, (begin, length) in enumerate(windows):
      used = len(prefix) + length + 1
      ids = np.full(max_seq_length, tokenizer.pad_id, np.int32)
      ids[:used] = prefix + context_ids[begin:begin + length] + [tokenizer.sep_id]
      types = np.zeros(max_seq_length, np.int32)
      types[len(prefix):used] = tokenizer.second_type_id
      start = end = 0
      if answer is not None and begin <= answer[0] and answer[1] < begin + length:
        start, end = (p - begin + len(prefix) for p in answer)
      rows["input_ids"].append(ids)
      rows["token_type_ids"].append(types)
      rows["attention_mask"].append((np.arange(max_seq_length) < used).astype(np.int32))
      rows["start_positions"].append(start)
      rows["end_positions"].append(end)
      rows["example_id"].append(example_id)
      rows["window_index"].append(window_index)
      if training:
        continue
      offsets = np.full((max_seq_length, 2), -1, np.int32)
      max_context = np.zeros(max_seq_length, bool)
      if length:
        offsets[len(prefix):len(prefix) + length] = context_offsets[begin:begin + length]
        max_context[len(prefix):len(prefix) + length] = best_window[begin:begin + length] == window_index
      rows["offsets"].append(offsets)
      rows["token_is_max_context"].append(max_context)
      rows["qid"].append(qid)
      rows["context"].append(context)
  return _stack(rows, max_seq_length, training)


def _stack(rows: Mapping[str, list], max_seq_length: int, training: bool) -> dict[str, np.ndarray]:
  features = {k: np.asarray(rows[k], np.int32).reshape(-1, max_seq_length) for k in MODEL_KEYS}
  for k in ("start_positions", "end_positions", "example_id", "window_index"):
    features[k] = np.asarray(rows[k], np.int32).reshape(-1)
  if training:
    return features
  features["offsets"] = np.asarray(rows["offsets"], np.int32).reshape(-1, max_seq_length, 2)
  features["token_is_max_context"] = np.asarray(rows["token_is_max_context"], bool).reshape(-1, max_seq_length)
  for k in ("qid", "context"):
    features[k] = np.empty(len(rows[k]), object)
    features[k][:] = rows[k]
  return features


def _answer_tokens(example: Mapping[str, Any], context: str, offsets: np.ndarray) -> tuple[int, int] | None:
  """Context token span (inclusive) of the first gold answer; None when its text is not at its answer_start."""
  texts, starts = example["answers"]["text"], example["answers"]["answer_start"]
  if len(starts) == 0:
    return None
  text, char_start = as_text(texts[0]), int(starts[0])
  char_end = char_start + len(text)
  if char_start < 0 or not text.strip() or context[char_start:char_end] != text:
    return None
  covering = np.flatnonzero((offsets[:, 0] < char_end) & (offsets[:, 1] > char_start))
  return (int(covering[0]), int(covering[-1])) if len(covering) else None


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


def squad_references(examples: Iterable[Mapping[str, Any]]) -> dict[str, list[str]]:
  """{qid: gold answer texts} of SQuAD examples (empty for v2.0 unanswerable questions)."""
  return {as_text(ex["id"]): [] if is_impossible(ex) else [as_text(t) for t in ex["answers"]["text"]]
          for ex in examples}


def read_squad_json(path: str | os.PathLike) -> list[dict[str, Any]]:
  """Examples of a SQuAD v1.1 / v2.0 JSON file (`{"data": [{"title", "paragraphs": [{"context", "qas"}]}]}`).

  Returns:
    dicts laid out as TFDS's `squad` examples: `id, title, context, question, answers {text, answer_start},
    is_impossible`. A question without `answers` (a test file) gets none.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"the SQuAD file {path} does not exist.")
  data = files.read_json(path, "SQuAD files are one JSON object {\"version\": ..., \"data\": [...]}")
  if not isinstance(data, dict) or not isinstance(data.get("data"), list):
    raise ValueError(f"{path} has no top-level \"data\" list; SQuAD files look like {{\"data\": [{{\"title\": ..., "
                     "\"paragraphs\": [{\"context\": ..., \"qas\": [{\"id\", \"question\", \"answers\"}]}]}]}.")
  examples, seen = [], set()
  for a, article in enumerate(data["data"]):
    for p, paragraph in enumerate(_field(article, "paragraphs", list, path, f"data[{a}]")):
      where = f"data[{a}].paragraphs[{p}]"
      context = _field(paragraph, "context", str, path, where)
      for q, qa in enumerate(_field(paragraph, "qas", list, path, where)):
        qid = str(_field(qa, "id", (str, int), path, f"{where}.qas[{q}]"))
        if qid in seen:
          raise ValueError(f"{path}: question id {qid!r} appears twice; predictions are keyed by id, so ids must "
                           "be unique.")
        seen.add(qid)
        answers = _field(qa, "answers", list, path, f"question {qid!r}", default=[])
        for answer in answers:
          _field(answer, "text", str, path, f"an answer of question {qid!r}")
          _field(answer, "answer_start", int, path, f"an answer of question {qid!r}")
        examples.append({
            "id": qid, "title": str(article.get("title", "")), "context": context,
            "question": _field(qa, "question", str, path, f"question {qid!r}"),
            "answers": {"text": [x["text"] for x in answers], "answer_start": [x["answer_start"] for x in answers]},
            "is_impossible": bool(qa.get("is_impossible", False)),
        })
  return examples


_MISSING = object()


def _field(record: Any, key: str, kind, path: str, where: str, default: Any = _MISSING) -> Any:
  """record[key], checked to be of `kind`; a ValueError names the file, the place and the key."""
  value = record.get(key, default) if isinstance(record, dict) else _MISSING
  if value is _MISSING or not isinstance(value, kind) or isinstance(value, bool):
    names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
    raise ValueError(f"{path}: {where} needs a {key!r} field holding a {names}"
                     + (f", got {value!r}." if value is not _MISSING else "."))
  return value
