"""Checks on model inputs at the Python boundary.

XLA clamps out-of-range gather indices silently, so an id outside the vocabulary would give a plausible
but wrong embedding; these checks turn such input into one clear error before tracing.
"""
from __future__ import annotations

import jax
import numpy as np

from jbert.model.config import BertConfig


def validate_inputs(config: BertConfig, input_ids, token_type_ids=None, attention_mask=None,
                    masked_lm_positions=None, multiple_choice: bool = False) -> None:
  """Raises ValueError on a bad shape, and on out-of-range ids when the arrays are concrete.

  input_ids, token_type_ids, attention_mask: [B, T] ([B, C, T] when `multiple_choice`);
  masked_lm_positions: [B, P] indices into T. Under `jax.jit` only shapes are checked.
  """
  rank = 3 if multiple_choice else 2
  layout = "[batch, choices, length]" if multiple_choice else "[batch, length]"
  shape = tuple(np.shape(input_ids))
  if len(shape) != rank:
    raise ValueError(f"input_ids must have rank {rank} {layout}, got shape {shape}"
                     + ("; add the choices axis." if multiple_choice and len(shape) == 2 else "."))
  length = shape[-1]
  if length > config.max_position_embeddings:
    raise ValueError(
        f"Sequence length {length} exceeds max_position_embeddings={config.max_position_embeddings}; "
        "truncate the inputs (max_length) or use a config with more positions.")
  for name, x in (("token_type_ids", token_type_ids), ("attention_mask", attention_mask)):
    if x is not None and tuple(np.shape(x)) != shape:
      raise ValueError(f"{name} has shape {tuple(np.shape(x))} but input_ids has {shape}; "
                       "pass arrays of the same shape.")
  _check_range("input_ids", input_ids, config.vocab_size,
               f"vocab_size={config.vocab_size}: check the tokenizer matches the model's vocabulary")
  _check_range("token_type_ids", token_type_ids, config.type_vocab_size,
               f"type_vocab_size={config.type_vocab_size}: use segment ids below it")
  if masked_lm_positions is not None:
    validate_masked_positions(input_ids, masked_lm_positions)


def validate_masked_positions(input_ids, masked_lm_positions) -> None:
  """masked_lm_positions must be [B, P] indices into the length T of input_ids [B, T]."""
  batch, length = np.shape(input_ids)[0], np.shape(input_ids)[-1]
  p_shape = tuple(np.shape(masked_lm_positions))
  if len(p_shape) != 2 or p_shape[0] != batch:
    raise ValueError(f"masked_lm_positions must be [batch={batch}, P], got shape {p_shape}.")
  _check_range("masked_lm_positions", masked_lm_positions, length,
               f"sequence length {length}: positions must index the sequence")


def _check_range(name: str, x, limit: int, fix: str) -> None:
  if x is None or isinstance(x, jax.core.Tracer):
    return
  x = np.asarray(x)
  bad = (x < 0) | (x >= limit)
  if bad.any():
    pos = tuple(int(i) for i in np.argwhere(bad)[0])
    raise ValueError(f"{name} contains {x[pos]} at position {pos}, outside [0, {limit}); {fix}.")
