"""Token classification (CoNLL-2003 NER): word labels on sub-tokens, back to words, entity-level scores.

Each word's label sits on its first sub-token; later sub-tokens, [CLS], [SEP] and padding get
`IGNORE_INDEX` so that losses and accuracies skip them, as in Hugging Face's `run_ner.py`. Entity scores
reproduce seqeval's default (non-strict) mode, which reads both IOB1 and IOB2 tags.
"""
import collections
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jbert.data.finetune.glue import as_text, require_keys

IGNORE_INDEX = -100
# TFDS conll2003 `ner` ClassLabel names, in order.
CONLL2003_NER_TAGS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")


def ner_features(examples: Iterable[Mapping[str, Any]], tokenizer, max_seq_length: int, *,
                 tokens_key: str = "tokens", tags_key: str = "ner") -> dict[str, np.ndarray]:
  """Features of pre-split sentences with one integer tag per word.

  Sub-tokens past `max_seq_length - 2` are cut; their words get no prediction (see `word_predictions`).

  Returns:
    int32 `input_ids, token_type_ids, attention_mask` [N, T]; int32 `labels` [N, T] (the word's tag on its
    first sub-token, IGNORE_INDEX elsewhere); int32 `word_ids` [N, T] (index of the word a sub-token belongs
    to, -1 on specials and padding); int32 `num_words` and `example_id` [N].
  """
  if max_seq_length < 3:
    raise ValueError(f"max_seq_length={max_seq_length} leaves no room for text; use at least 3.")
  examples = list(examples)
  n = len(examples)
  input_ids = np.full((n, max_seq_length), tokenizer.pad_id, np.int32)
  attention_mask = np.zeros((n, max_seq_length), np.int32)
  labels = np.full((n, max_seq_length), IGNORE_INDEX, np.int32)
  word_ids = np.full((n, max_seq_length), -1, np.int32)
  num_words = np.zeros(n, np.int32)
  for row, example in enumerate(examples):
    require_keys(example, (tokens_key, tags_key))
    words = [as_text(w) for w in example[tokens_key]]
    tags = np.asarray(example[tags_key]).reshape(-1)
    if len(words) != len(tags):
      raise ValueError(f"example {row} has {len(words)} words but {len(tags)} tags in {tags_key!r}; each "
                       "word needs exactly one tag.")
    num_words[row] = len(words)
    ids, owner = [tokenizer.cls_id], [-1]
    for index, pieces in enumerate(tokenizer.batch_ids(words) if words else []):
      ids += pieces
      owner += [index] * len(pieces)
    ids, owner = ids[:max_seq_length - 1] + [tokenizer.sep_id], owner[:max_seq_length - 1] + [-1]
    input_ids[row, :len(ids)] = ids
    attention_mask[row, :len(ids)] = 1
    word_ids[row, :len(owner)] = owner
    first = _first_subtokens(word_ids[row])
    labels[row, first] = tags[word_ids[row, first]]
  return {
      "input_ids": input_ids,
      "token_type_ids": np.zeros_like(input_ids),
      "attention_mask": attention_mask,
      "labels": labels,
      "word_ids": word_ids,
      "num_words": num_words,
      "example_id": np.arange(n, dtype=np.int32),
  }


def _first_subtokens(word_ids: np.ndarray) -> np.ndarray:
  """Positions of the first sub-token of each word in one row of `word_ids`."""
  previous = np.concatenate([[-1], word_ids[:-1]])
  return np.flatnonzero((word_ids >= 0) & (word_ids != previous))


def word_predictions(token_predictions: np.ndarray, word_ids: np.ndarray, num_words: np.ndarray,
                     fill_value: int = 0) -> list[list[int]]:
  """Word-level predictions [N][num_words] read from each word's first sub-token.

  Words that truncation removed get `fill_value` (tag 0, "O", for CoNLL-2003), so they count as misses.
  """
  token_predictions, word_ids = np.asarray(token_predictions), np.asarray(word_ids)
  if token_predictions.shape != word_ids.shape:
    raise ValueError(f"token_predictions {token_predictions.shape} must match word_ids {word_ids.shape}.")
  result = []
  for row in range(len(word_ids)):
    words = np.full(int(num_words[row]), fill_value, np.int64)
    first = _first_subtokens(word_ids[row])
    words[word_ids[row, first]] = token_predictions[row, first]
    result.append(words.tolist())
  return result


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """(type, first, last) chunks of one tag sequence, as seqeval's `get_entities` with prefix tags."""
  chunks = []
  previous_tag, previous_type, begin = "O", "", 0
  for i, chunk in enumerate([*tags, "O"]):
    tag, type_ = chunk[0], chunk[1:].split("-", maxsplit=1)[-1] or "_"
    if _end_of_chunk(previous_tag, tag, previous_type, type_):
      chunks.append((previous_type, begin, i - 1))
    if _start_of_chunk(previous_tag, tag, previous_type, type_):
      begin = i
    previous_tag, previous_type = tag, type_
  return chunks


def _end_of_chunk(previous_tag: str, tag: str, previous_type: str, type_: str) -> bool:
  return (previous_tag in ("E", "S")
          or (previous_tag in ("B", "I") and tag in ("B", "S", "O"))
          or (previous_tag not in ("O", ".") and previous_type != type_))


def _start_of_chunk(previous_tag: str, tag: str, previous_type: str, type_: str) -> bool:
  return (tag in ("B", "S")
          or (previous_tag in ("E", "S", "O") and tag in ("E", "I"))
          or (tag not in ("O", ".") and previous_type != type_))


def entity_scores(true_tags: Sequence[Sequence[str]],
                  predicted_tags: Sequence[Sequence[str]]) -> dict[str, Any]:
  """Entity-level micro precision, recall and F1 (and per type), as seqeval's default classification report.

  An entity counts as correct only when its type, first and last word all match. Sentences are joined with an
  "O" between them, as seqeval does, so an entity never spans two sentences. Undefined ratios are 0.
  """
  if len(true_tags) != len(predicted_tags):
    raise ValueError(f"{len(true_tags)} gold sentences but {len(predicted_tags)} predicted ones.")
  for i, (t, p) in enumerate(zip(true_tags, predicted_tags)):
    if len(t) != len(p):
      raise ValueError(f"sentence {i} has {len(t)} gold tags but {len(p)} predicted ones.")
  true_entities = set(get_entities([tag for s in true_tags for tag in [*s, "O"]]))
  predicted_entities = set(get_entities([tag for s in predicted_tags for tag in [*s, "O"]]))
  correct = true_entities & predicted_entities
  counts = collections.defaultdict(lambda: [0, 0, 0])  # type -> [correct, predicted, true]
  for index, entities in enumerate((correct, predicted_entities, true_entities)):
    for type_, _, _ in entities:
      counts[type_][index] += 1
  result = _prf(len(correct), len(predicted_entities), len(true_entities))
  result["per_type"] = {t: _prf(*c) for t, c in sorted(counts.items())}
  return result


def _prf(correct: int, predicted: int, true: int) -> dict[str, float]:
  precision = correct / predicted if predicted else 0.0
  recall = correct / true if true else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": precision, "recall": recall, "f1": f1, "support": true}
