"""Token classification's entity-level scores, as seqeval's default (non-strict) mode: IOB1 and IOB2 tags, and plain
tags (IO: an entity is a maximal run of words of one type; `features.tag_scheme` refuses a mix)."""
import collections
from collections.abc import Sequence
from typing import Any

from jbert.tasks.token_classification.features import is_plain


def get_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
  """(type, first, last) chunks of one tag sequence, as seqeval's `get_entities` with prefix tags; a plain tag X
  reads as I-X, which makes an entity of each maximal run of X (IO tags)."""
  chunks = []
  previous_tag, previous_type, begin = "O", "", 0
  for i, chunk in enumerate([*tags, "O"]):
    if is_plain(chunk):
      tag, type_ = "I", chunk
    else:
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
  """Entity-level micro precision, recall and F1 (and per type), as seqeval's default classification report,
  plus seqeval's `accuracy_score` (the fraction of words whose tag is right).

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
  words = sum(len(s) for s in true_tags)
  result["accuracy"] = sum(t == p for ts, ps in zip(true_tags, predicted_tags) for t, p in zip(ts, ps)) / max(
      words, 1)
  result["per_type"] = {t: _prf(*c) for t, c in sorted(counts.items())}
  return result


def _prf(correct: int, predicted: int, true: int) -> dict[str, float]:
  precision = correct / predicted if predicted else 0.0
  recall = correct / true if true else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": precision, "recall": recall, "f1": f1, "support": true}
