"""Texts -> BERT features (`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]`), truncated to a length and counted."""
from __future__ import annotations

from typing import Sequence, Union

from jbert.tokenizer import Tokenizer

Record = Union[str, tuple[str, str]]


def encode_records(tokenizer: Tokenizer, records: Sequence[Record], max_length: int,
                   lowercase: bool = False) -> tuple[list[dict[str, list[int]]], int]:
  """(features with `input_ids` and `token_type_ids`, number of records that were truncated).

  A record is a text or a `(text, pair)` tuple; an empty pair means no pair, as in BERT and transformers. Texts
  are tokenized in one batched call; pairs are truncated longest-first (`Tokenizer.build_inputs`).
  """
  firsts, seconds = [], []
  for i, record in enumerate(records):
    if isinstance(record, str):
      firsts.append(record)
      seconds.append(None)
    elif isinstance(record, (tuple, list)) and len(record) == 2 and all(isinstance(t, str) for t in record):
      firsts.append(record[0])
      seconds.append(record[1] or None)
    else:
      raise TypeError(f"Input {i} is a {type(record).__name__}; pass a text or a (text, pair) tuple of texts.")
  if lowercase:
    firsts = [t.lower() for t in firsts]
    seconds = [None if t is None else t.lower() for t in seconds]
  ids_a = tokenizer.batch_ids(firsts)
  paired = [i for i, t in enumerate(seconds) if t is not None]
  ids_b: list[list[int] | None] = [None] * len(records)
  for i, ids in zip(paired, tokenizer.batch_ids([seconds[i] for i in paired]) if paired else []):
    ids_b[i] = ids
  features, truncated = [], 0
  for a, b in zip(ids_a, ids_b):
    needed = len(a) + 2 + (0 if b is None else len(b) + 1)
    truncated += needed > max_length
    encoded = tokenizer.build_inputs(a, b, max_length=max_length)
    features.append({"input_ids": encoded["input_ids"], "token_type_ids": encoded["token_type_ids"]})
  return features, truncated
