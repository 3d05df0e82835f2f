"""Pairs and triplets of texts for bi-encoders (Sentence-BERT): each text a sequence of its own.

A row of K texts (a pair, an (anchor, positive, negative) triplet) becomes [K, T] inputs: `[CLS] text [SEP]`,
truncated to `max_seq_length` and padded, exactly as sentence-transformers tokenises each column on its own. The
K texts of a row are never packed together: a bi-encoder embeds them apart.
"""
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from jbert.tasks.sources import as_text, require_keys


def sentence_features(examples: Sequence[Mapping[str, Any]], tokenizer, max_seq_length: int, *,
                      text_keys: Sequence[str], label_key: str | None = None,
                      label_dtype=np.float32) -> dict[str, np.ndarray]:
  """int32 `input_ids, token_type_ids, attention_mask` [N, K, T] (K = len(text_keys)), `label` [N] (`label_dtype`;
  0 without `label_key`) and int32 `example_id` [N] (the row's `idx`, else its position)."""
  examples = list(examples)
  if examples:
    require_keys(examples[0], [*text_keys, *([label_key] if label_key else [])])
  n, k = len(examples), len(text_keys)
  input_ids = np.full((n, k, max_seq_length), tokenizer.pad_id, np.int32)
  attention_mask = np.zeros((n, k, max_seq_length), np.int32)
  for j, key in enumerate(text_keys):
    pieces = tokenizer.batch_ids([as_text(ex[key]) if ex[key] is not None else "" for ex in examples])
    for i, ids in enumerate(pieces):
      packed = tokenizer.build_inputs(ids, None, max_seq_length)["input_ids"]
      input_ids[i, j, :len(packed)] = packed
      attention_mask[i, j, :len(packed)] = 1
  labels = [ex[label_key] for ex in examples] if label_key else [0] * n
  return {
      "input_ids": input_ids,
      "token_type_ids": np.zeros_like(input_ids),
      "attention_mask": attention_mask,
      "label": np.asarray(labels, label_dtype).reshape(n),
      "example_id": np.asarray([int(ex.get("idx", i)) for i, ex in enumerate(examples)], np.int32).reshape(n),
  }
