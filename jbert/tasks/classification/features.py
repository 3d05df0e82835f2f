"""Sentence(-pair) classification and regression: GLUE-style features (the metrics: `metrics.py`).

Features follow google-research/bert `run_classifier.py`: `[CLS] a [SEP] b [SEP]`, the pair truncated one
token at a time from the longer side (the second on ties; `Tokenizer.build_inputs`), then padded to
`max_seq_length`.
"""
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jbert.tasks.sources import as_text, require_keys


def classification_features(examples: Iterable[Mapping[str, Any]], tokenizer, max_seq_length: int, *,
                            text_keys: Sequence[str], label_key: str | None = "label",
                            regression: bool = False, id_key: str | None = "idx") -> dict[str, np.ndarray]:
  """Tokenised, packed, padded features of (sentence or sentence pair, label) examples.

  Args:
    examples: dicts with `text_keys` (one or two) and, when `label_key` is set, a label (int class index, or
      float for regression; GLUE test sets carry -1).
    tokenizer: a `jbert.tokenizer.Tokenizer`.
    max_seq_length: padded length T, including [CLS] and [SEP]s.
    text_keys: one key (single sentence) or two keys (pair).
    label_key: the label key, or None for unlabelled data (labels then are -1).
    regression: float32 labels instead of int32.
    id_key: key of an integer example id (TFDS GLUE `idx`); missing ids become the running index.

  Returns:
    int32 `input_ids, token_type_ids, attention_mask` [N, T], `label` [N] (int32, float32 if regression) and
    int32 `example_id` [N].
  """
  if len(text_keys) not in (1, 2):
    raise ValueError(f"text_keys must name one or two text fields, got {list(text_keys)}.")
  examples = list(examples)
  if examples:
    require_keys(examples[0], [*text_keys, *([label_key] if label_key else [])])
  texts = [[as_text(ex[k]) for ex in examples] for k in text_keys]
  pieces = [tokenizer.batch_ids(t) for t in texts]
  n = len(examples)
  input_ids = np.full((n, max_seq_length), tokenizer.pad_id, np.int32)
  token_type_ids = np.zeros((n, max_seq_length), np.int32)
  attention_mask = np.zeros((n, max_seq_length), np.int32)
  for i in range(n):
    packed = tokenizer.build_inputs(pieces[0][i], pieces[1][i] if len(pieces) == 2 else None, max_seq_length)
    length = len(packed["input_ids"])
    input_ids[i, :length] = packed["input_ids"]
    token_type_ids[i, :length] = packed["token_type_ids"]
    attention_mask[i, :length] = 1
  label_dtype = np.float32 if regression else np.int32
  labels = [ex[label_key] if label_key else -1 for ex in examples]
  ids = [int(ex[id_key]) if id_key and id_key in ex else i for i, ex in enumerate(examples)]
  return {
      "input_ids": input_ids,
      "token_type_ids": token_type_ids,
      "attention_mask": attention_mask,
      "label": np.asarray(labels, label_dtype).reshape(n),
      "example_id": np.asarray(ids, np.int32).reshape(n),
  }
