"""Token classification (CoNLL-2003 NER): word labels on sub-tokens, back to words (entity-level scores:
`metrics.py`).

Each word's label sits on its first sub-token; later sub-tokens, [CLS], [SEP] and padding get
`IGNORE_INDEX` so that losses and accuracies skip them, as in the BERT paper and Hugging Face's `run_ner.py`.
A sentence longer than one sequence is cut into overlapping windows that start at word boundaries; each word
is labelled and predicted in exactly one of them, the one that gives it the most context on both sides (as
`run_squad.py` picks a token's window), so no word is ever dropped. Entity scores reproduce seqeval's default
(non-strict) mode, which reads both IOB1 and IOB2 tags. Plain tags (PER, LOC: no B-/I-/E-/S-/L-/U- prefix) are IO
tags: an entity is a maximal run of words of one type (seqeval would read `ORG` as O and `PER` as a type `ER`). A
tag set mixing both is refused (`tag_scheme`): its entities have no single reading.

Local files: CoNLL column format (a word per line, the tag in the last column, blank lines between sentences,
`-DOCSTART-` lines skipped) or JSON lines with `tokens` and `tags` lists.
"""
import collections
from collections.abc import Iterable, Mapping, Sequence
import os
import re
from typing import Any

import numpy as np

from jbert import errors
from jbert.data import files
from jbert.tasks.sources import as_text, require_keys

IGNORE_INDEX = -100
# TFDS conll2003 `ner` ClassLabel names, in order.
CONLL2003_NER_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
# A tag of a prefixed scheme: IOB1/IOB2 (B, I), IOBES (E, S), BILOU (L, U), then the entity type.
_PREFIXED = re.compile(r"[BIESLU]-.")


def ner_features(examples: Iterable[Mapping[str, Any]], tokenizer, max_seq_length: int, *,
                 tokens_key: str = "tokens", tags_key: str = "ner", num_labels: int | None = None,
                 stride: int | None = None) -> dict[str, np.ndarray]:
  """Features of pre-split sentences with one integer tag per word (or `None` tags: unlabelled).

  A sentence of more than `max_seq_length - 2` sub-tokens becomes several rows (windows of whole words whose
  starts are about `stride` sub-tokens apart; default half a window). A word with no sub-token (e.g. a lone
  control character) is read as [UNK], so that every word gets a prediction.

  Returns:
    int32 `input_ids, token_type_ids, attention_mask` [N, T]; int32 `labels` [N, T] (the word's tag on the
    sub-token that predicts it, IGNORE_INDEX elsewhere); int32 `word_ids` [N, T] (index of the word a sub-token
    belongs to, -1 on specials and padding); int32 `predict_mask` [N, T] (1 on the one sub-token per word that
    predicts it: its first, in its best window); int32 `num_words` and `example_id` (index into `examples`) [N].
  """
  if max_seq_length < 3:
    raise ValueError(f"max_seq_length={max_seq_length} leaves no room for text; use at least 3.")
  width = max_seq_length - 2
  stride = stride or max(1, width // 2)
  rows = collections.defaultdict(list)
  for index, example in enumerate(examples):
    require_keys(example, (tokens_key, tags_key))
    words = [as_text(w) for w in example[tokens_key]]
    tags = None if example[tags_key] is None else np.asarray(example[tags_key]).reshape(-1)
    where = example.get("where", f"example {index}")
    if tags is not None:
      _check_tags(tags, len(words), num_labels, where, tags_key)
    pieces = [p[:width] or [tokenizer.unk_id] for p in (tokenizer.batch_word_ids(words) if words else [])]
    starts = np.cumsum([0] + [len(p) for p in pieces])  # first sub-token of each word, then the end
    ids = [i for p in pieces for i in p]
    owner = np.repeat(np.arange(len(pieces)), [len(p) for p in pieces])
    windows = _word_windows(starts, width, stride)
    best = _best_windows(windows, starts)
    for number, (first, last) in enumerate(windows):
      begin, end = starts[first], starts[last]
      row_ids = np.full(max_seq_length, tokenizer.pad_id, np.int64)
      row_ids[:end - begin + 2] = [tokenizer.cls_id, *ids[begin:end], tokenizer.sep_id]
      word_ids = np.full(max_seq_length, -1, np.int64)
      word_ids[1:end - begin + 1] = owner[begin:end]
      predict = np.zeros(max_seq_length, np.int64)
      mine = np.flatnonzero(best == number)
      predict[starts[mine] - begin + 1] = 1
      labels = np.full(max_seq_length, IGNORE_INDEX, np.int64)
      if tags is not None:
        labels[starts[mine] - begin + 1] = tags[mine]
      rows["input_ids"].append(row_ids)
      rows["attention_mask"].append(np.arange(max_seq_length) < end - begin + 2)
      rows["labels"].append(labels)
      rows["word_ids"].append(word_ids)
      rows["predict_mask"].append(predict)
      rows["num_words"].append(len(words))
      rows["example_id"].append(index)
  features = {k: np.asarray(rows[k], np.int32).reshape(-1, max_seq_length)
              for k in ("input_ids", "attention_mask", "labels", "word_ids", "predict_mask")}
  features["token_type_ids"] = np.zeros_like(features["input_ids"])
  features["num_words"] = np.asarray(rows["num_words"], np.int32)
  features["example_id"] = np.asarray(rows["example_id"], np.int32)
  return features


def _check_tags(tags: np.ndarray, num_words: int, num_labels: int | None, where: str, tags_key: str) -> None:
  if num_words != len(tags):
    raise ValueError(f"{where} has {num_words} words but {len(tags)} tags in {tags_key!r}; each word needs "
                     "exactly one tag.")
  if num_labels is not None and len(tags) and (tags.min() < 0 or tags.max() >= num_labels):
    bad = tags[(tags < 0) | (tags >= num_labels)][0]
    raise ValueError(f"{where} has tag id {bad}, outside the {num_labels} labels [0, {num_labels}).")


def _word_windows(starts: np.ndarray, width: int, stride: int) -> list[tuple[int, int]]:
  """(first word, end word) of windows of at most `width` sub-tokens; each starts at a word `stride` sub-tokens
  or more after the previous start (but never after the previous end, so windows cover every word)."""
  num_words = len(starts) - 1
  windows, first = [], 0
  while True:
    last = int(np.searchsorted(starts, starts[first] + width, side="right")) - 1  # words ending inside
    last = min(max(last, first + 1), num_words) if num_words else 0
    windows.append((first, last))
    if last >= num_words:
      return windows
    after = int(np.searchsorted(starts, starts[first] + stride, side="left"))
    first = min(max(after, first + 1), last)


def _best_windows(windows: list[tuple[int, int]], starts: np.ndarray) -> np.ndarray:
  """Per word, the first window maximising min(left, right context) of its first sub-token + 0.01 * length."""
  position = starts[:-1]
  scores = np.full((len(windows), len(position)), -np.inf)
  for index, (first, last) in enumerate(windows):
    begin, end = starts[first], starts[last]
    inside = (np.arange(len(position)) >= first) & (np.arange(len(position)) < last)
    scores[index] = np.where(inside, np.minimum(position - begin, end - 1 - position) + 0.01 * (end - begin),
                             -np.inf)
  return np.argmax(scores, axis=0) if len(position) else np.zeros(0, np.int64)


def word_predictions(token_predictions: np.ndarray, features: Mapping[str, np.ndarray]) -> list[list[int]]:
  """Per example (in `example_id` order), the predicted tag of each word, read where `predict_mask` is 1.

  Args:
    token_predictions: [N, T] tag ids of the rows of `features`.
    features: `ner_features` output (`word_ids`, `predict_mask`, `num_words`, `example_id`).
  """
  token_predictions = np.asarray(token_predictions)
  word_ids, mask = features["word_ids"], features["predict_mask"]
  if token_predictions.shape != word_ids.shape:
    raise ValueError(f"token_predictions {token_predictions.shape} must match word_ids {word_ids.shape}.")
  example_id, num_words = features["example_id"], features["num_words"]
  count = int(example_id.max()) + 1 if len(example_id) else 0
  sizes = np.zeros(count, np.int64)
  sizes[example_id] = num_words
  offsets = np.concatenate([[0], np.cumsum(sizes)])
  flat = np.full(offsets[-1], -1, np.int64)
  rows, cols = np.nonzero(mask)
  flat[offsets[example_id[rows]] + word_ids[rows, cols]] = token_predictions[rows, cols]
  if (flat < 0).any():
    raise ValueError("some words have no predicting sub-token; features must come from ner_features.")
  return [flat[offsets[i]:offsets[i + 1]].tolist() for i in range(count)]


# -- local files --


def read_ner_file(path: str | os.PathLike) -> list[dict[str, Any]]:
  """Sentences of a CoNLL column file, or of JSON lines (`.jsonl`/`.json`) with `tokens` and `tags` lists.

  Returns:
    One dict per sentence: `tokens` (list of str), `tags` (list of str, or ints indexing the label names in
    JSON; None when the file has no tags: a file to predict) and `where` (its line in the file, for messages).
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"NER file {path} does not exist.")
  if path.lower().endswith(JSONL_SUFFIXES):
    sentences = _read_jsonl(path)
  else:
    sentences = _read_columns([line for _, line in files.lines(path)], path)
  tagged = {s["tags"] is not None for s in sentences if s["tokens"]}
  if len(tagged) > 1:
    untagged = next(s["where"] for s in sentences if s["tokens"] and s["tags"] is None)
    raise ValueError(f"{untagged} has no tags but other sentences of {path} do; tag every sentence, or none "
                     "(a file to predict).")
  return sentences


def columns_or_sentences(path: str | os.PathLike, label_names: Sequence[str]) -> str:
  """How a prediction input that is not JSON lines holds its sentences: "columns" when it reads as CoNLL columns,
  as training reads every such file (a `-DOCSTART-` line; every line `word ... TAG` with TAG one of `label_names`;
  or blank lines between sentences of several lines, the same number of columns on every line; a lone sentence of
  a word per line ends with one), else "sentences" (one sentence per line). A file of one word per line without a
  blank line is both one sentence and as many one-word sentences: a ValueError says how to tell them apart."""
  rows = [line.split() for _, line in files.lines(path)]
  filled = [r for r in rows if r]
  if not filled:
    return "sentences"
  labels = set(label_names)
  if any(r[0] == "-DOCSTART-" for r in filled) or all(len(r) > 1 and r[-1] in labels for r in filled):
    return "columns"
  widths = {len(r) for r in filled}
  lines = [i for i, r in enumerate(rows) if r]
  blocks = sum(i == lines[0] or not rows[i - 1] for i in lines)  # runs of lines between blank ones
  # A blank line ends a sentence of a word per line; with more columns it must separate two sentences.
  if len(widths) == 1 and blocks < len(lines) and (1 < blocks or (widths == {1} and len(lines) < len(rows))):
    return "columns"
  if widths == {1} and blocks == 1 < len(lines):
    raise ValueError(f"{os.fspath(path)} holds one word per line and no blank line: as CoNLL columns (how training "
                     f"reads such a file) it is one sentence of {len(filled):,} words, as a sentence per line "
                     f"{len(filled):,} one-word sentences; end each sentence with a blank line, or give JSON lines "
                     "with `tokens` (.jsonl).")
  return "sentences"


def _read_columns(lines: Sequence[str], path: str) -> list[dict[str, Any]]:
  sentences, tokens, tags, first = [], [], [], 0
  for number, line in enumerate([*lines, ""], start=1):
    fields = line.split()
    if not fields or fields[0] == "-DOCSTART-":
      if tokens:
        untagged = [t is None for t in tags]
        if any(untagged) and not all(untagged):
          raise ValueError(f"line {first + untagged.index(not untagged[0])} of {path}: some words of the "
                           f"sentence starting at line {first} have a tag column and some do not.")
        sentences.append({"tokens": tokens, "tags": None if untagged[0] else tags,
                          "where": f"the sentence at line {first} of {path}"})
      tokens, tags = [], []
      continue
    if not tokens:
      first = number
    tokens.append(fields[0])
    tags.append(fields[-1] if len(fields) > 1 else None)
  return sentences


def _read_jsonl(path: str) -> list[dict[str, Any]]:
  sentences = []
  for number, row in files.jsonl_objects(path, "an object with tokens and tags"):
    where = f"line {number} of {path}"
    if not isinstance(row.get("tokens"), list):
      raise ValueError(f"{where} has no `tokens` list; each line must be {{\"tokens\": [...], \"tags\": [...]}}.")
    tags = row.get("tags")
    if tags is not None and (not isinstance(tags, list) or len(tags) != len(row["tokens"])):
      raise ValueError(f"{where} has {len(row['tokens'])} tokens but its `tags` is not a list of as many tags.")
    sentences.append({"tokens": [str(t) for t in row["tokens"]], "tags": tags, "where": where})
  return sentences


def encode_tags(sentences: Sequence[Mapping[str, Any]], label_names: Sequence[str]) -> list[dict[str, Any]]:
  """`sentences` with their tags as ids into `label_names` (names, or ids already); a tag outside the label set
  is a ValueError that names its sentence."""
  index = {name: i for i, name in enumerate(label_names)}
  encoded = []
  for sentence in sentences:
    ids = None
    if sentence["tags"] is not None:
      ids = []
      for tag in sentence["tags"]:
        tag_id = tag if isinstance(tag, int) and 0 <= tag < len(label_names) else index.get(str(tag))
        if tag_id is None:
          raise ValueError(f"{sentence['where']} has tag {tag!r}, which is not in the label set "
                           f"{list(label_names)}.")
        ids.append(tag_id)
    encoded.append({**sentence, "tags": ids})
  return encoded


def infer_label_names(sentences: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
  """The tags of `sentences`: "O" first, then by entity type with B- before I- (a stable order for a run)."""
  tags = set()
  for sentence in sentences:
    for tag in sentence["tags"] or ():
      if not isinstance(tag, str):
        raise ValueError(f"{sentence['where']} gives tag ids ({tag!r}), whose names cannot be inferred; name the "
                         "labels in id order.")
      tags.add(tag)
  tags -= {"O"}
  return ("O", *sorted(tags, key=lambda t: (t.split("-", 1)[-1], t)))


# -- scores --


def is_plain(tag: str) -> bool:
  """Whether `tag` names an entity type without a scheme prefix (an IO tag: PER, LOC); O is not a type."""
  return tag != "O" and not _PREFIXED.match(tag)


def tag_scheme(label_names: Sequence[str]) -> str:
  """"io" when every tag but O is plain (PER, LOC), "prefixed" otherwise (B-PER, I-PER, ...); a set mixing both is
  a ValueError naming examples of each."""
  names = [str(n) for n in label_names]
  plain = [n for n in names if is_plain(n)]
  prefixed = [n for n in names if n != "O" and not is_plain(n)]
  if plain and prefixed:
    raise ValueError(f"the tags mix prefixed ones ({errors.listing(prefixed, 3)}) with plain ones "
                     f"({errors.listing(plain, 3)}), so entities have no single reading; prefix every entity tag "
                     "(B-X/I-X) or none (IO tags: each word its type, an entity a run of one type).")
  return "io" if plain else "prefixed"
