"""Checks on model inputs at the Python boundary.

What XLA does with an out-of-range id is silent, so ids are checked before they reach a jitted function:

* `validate_inputs` runs inside every model's `__call__`. Shapes and dtypes are static, so a float `input_ids`,
  an empty sequence or mismatched shapes are refused even under `jax.jit`; id ranges are checked only when the
  arrays are concrete (an eager `model.apply`).
* `check_ids` is the per-batch range check (one min and one max per array, on the host) for code that jits the
  model itself: the training loop and the inference entry points call it on each batch before the jitted step.

Under a user's own `jax.jit(model.apply)` nothing checks the values. The embedding lookups (`nn.Embed`, i.e.
`jnp.take` with mode "fill") then wrap a negative id in [-V, 0) to V + id, so id -1 gives exactly the output of
the last vocabulary row, and turn an id >= V or < -V into a NaN embedding row. Attention spreads that NaN to every
position of the same sequence (other sequences of the batch stay finite). token_type_ids behave alike with
V = type_vocab_size, and masked_lm_positions index the sequence the same way (-1 is the last position, >= T gives
NaN logits). Call `check_ids` on batches that come from outside your program.
"""
from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np

from jbert.model.config import BertConfig


def validate_inputs(config: BertConfig, input_ids, token_type_ids=None, attention_mask=None,
                    masked_lm_positions=None, multiple_choice: bool = False, *, segment_ids=None,
                    position_ids=None, cls_positions=None) -> None:
  """Raises ValueError on a bad shape, and on out-of-range ids when the arrays are concrete.

  input_ids, token_type_ids, attention_mask, segment_ids, position_ids: [B, T] ([B, C, T] when
  `multiple_choice`); masked_lm_positions and cls_positions: [B, P] indices into T. Under `jax.jit` only shapes
  and dtypes are checked.
  """
  rank = 3 if multiple_choice else 2
  layout = "[batch, choices, length]" if multiple_choice else "[batch, length]"
  shape = tuple(np.shape(input_ids))
  if len(shape) != rank:
    raise ValueError(f"input_ids must have rank {rank} {layout}, got shape {shape}"
                     + ("; add the choices axis." if multiple_choice and len(shape) == 2 else "."))
  for name, x in (("input_ids", input_ids), ("token_type_ids", token_type_ids), ("segment_ids", segment_ids),
                  ("position_ids", position_ids), ("cls_positions", cls_positions)):
    _check_integer(name, x)
  length = shape[-1]
  if length == 0 or (multiple_choice and shape[1] == 0):
    raise ValueError(f"input_ids has shape {shape}: every sequence needs at least one token (BERT inputs start "
                     "with [CLS]); drop empty inputs before calling the model.")
  # A packed row with its own position ids may be longer than the positions (multiple choice's rows of C endings):
  # then each sequence's positions are what is bounded (below, where concrete).
  if length > config.max_length and position_ids is None:
    raise ValueError(f"Sequence length {length} exceeds {position_limit(config)}; truncate the inputs (max_length) "
                     "or use a config with more positions.")
  for name, x in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask),
                  ("segment_ids", segment_ids), ("position_ids", position_ids)):
    if x is not None and tuple(np.shape(x)) != shape:
      raise ValueError(f"{name} has shape {tuple(np.shape(x))} but input_ids has {shape}; "
                       "pass arrays of the same shape.")
  _check_range("input_ids", input_ids, config.vocab_size,
               f"vocab_size={config.vocab_size}: check the tokenizer matches the model's vocabulary")
  if config.reads_token_types:  # DistilBERT ignores them, RoBERTa reads each as type 0
    _check_range("token_type_ids", token_type_ids, config.type_vocab_size,
                 f"type_vocab_size={config.type_vocab_size}: use segment ids below it")
  _check_range("position_ids", position_ids, config.max_length,
               f"{position_limit(config)}: a sequence's positions start at 0")
  _check_range("segment_ids", segment_ids, length + 1,
               f"sequence length {length}: number a row's sequences 1..k, 0 for padding")
  if masked_lm_positions is not None:
    validate_masked_positions(input_ids, masked_lm_positions)
  if cls_positions is not None:
    validate_masked_positions(input_ids, cls_positions, "cls_positions")


def position_limit(config: BertConfig) -> str:
  """`config.max_length` in the config's terms, for messages: "max_position_embeddings=514 less
  position_offset=2" (RoBERTa), "max_position_embeddings=512" (BERT)."""
  return f"max_position_embeddings={config.max_position_embeddings}" + (
      f" less position_offset={config.position_offset}" if config.position_offset else "")


def validate_masked_positions(input_ids, masked_lm_positions, name: str = "masked_lm_positions") -> None:
  """masked_lm_positions (or the array `name`) must be [B, P] indices into the length T of input_ids [B, T]."""
  batch, length = np.shape(input_ids)[0], np.shape(input_ids)[-1]
  p_shape = tuple(np.shape(masked_lm_positions))
  if len(p_shape) != 2 or p_shape[0] != batch:
    raise ValueError(f"{name} must be [batch={batch}, P], got shape {p_shape}.")
  _check_range(name, masked_lm_positions, length, f"sequence length {length}: positions must index the sequence")


def check_ids(batch: Mapping[str, Any], vocab_size: int, type_vocab_size: int | None = 2) -> None:
  """Raises a ValueError naming the array, the value and its position if an id of `batch` is out of range.

  For host (numpy) batches before they reach a jitted step, where nothing else would notice (see the module
  docstring). Checks `input_ids` and `masked_lm_ids` against [0, vocab_size), `token_type_ids` against
  [0, type_vocab_size) (None: a model that does not read them, `BertConfig.reads_token_types`),
  `masked_lm_positions`, `position_ids` and `cls_positions` against the sequence length and `segment_ids`
  against [0, length]; arrays a batch lacks are skipped.
  Costs one min and one max per array unless something is wrong.
  """
  vocab = f"vocab_size={vocab_size}: check the tokenizer matches the model's vocabulary"
  limits = {"input_ids": (vocab_size, vocab), "masked_lm_ids": (vocab_size, vocab)}
  if type_vocab_size is not None:
    limits["token_type_ids"] = (type_vocab_size, f"type_vocab_size={type_vocab_size}: use segment ids below it")
  if "input_ids" in batch:
    length = np.shape(batch["input_ids"])[-1]
    for name in ("masked_lm_positions", "position_ids", "cls_positions"):
      limits[name] = (length, f"sequence length {length}: positions must index the sequence")
    limits["segment_ids"] = (length + 1, f"sequence length {length}: number a row's sequences 1..k, 0 for padding")
  for name, (limit, fix) in limits.items():
    x = batch.get(name)
    if x is None:
      continue
    x = np.asarray(x)
    _check_integer(name, x)
    if x.size and (x.min() < 0 or x.max() >= limit):
      _check_range(name, x, limit, fix)


def _check_integer(name: str, x) -> None:
  if x is None:
    return
  dtype = np.dtype(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype)
  if dtype == np.bool_ or not np.issubdtype(dtype, np.integer):
    raise ValueError(f"{name} must hold integer ids (int32), got dtype {dtype}; pass the tokenizer's ids as "
                     "np.int32 (a float array is not rounded, since a fractional id has no token).")


def _check_range(name: str, x, limit: int, fix: str) -> None:
  if x is None or isinstance(x, jax.core.Tracer):
    return
  x = np.asarray(x)
  bad = (x < 0) | (x >= limit)
  if bad.any():
    pos = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(f"{name} contains {x[pos]} at position {pos}, outside [0, {limit}); {fix}.")
