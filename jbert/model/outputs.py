"""Named model outputs (pytrees, so they pass through `jax.jit`)."""
from __future__ import annotations

from typing import Optional

import flax.struct
import jax

Array = jax.Array


@flax.struct.dataclass
class BertModelOutput:
  last_hidden_state: Array  # [B, T, H]
  pooled_output: Optional[Array] = None  # [B, H]; None without the pooler.


@flax.struct.dataclass
class PreTrainingOutput:
  last_hidden_state: Array  # [B, T, H]
  pooled_output: Array  # [B, H]
  mlm_logits: Array  # [B, T, V], or [B, P, V] with masked_lm_positions.
  nsp_logits: Array  # [B, 2]


@flax.struct.dataclass
class MaskedLMOutput:
  last_hidden_state: Array  # [B, T, H]
  mlm_logits: Array  # [B, T, V], or [B, P, V] with masked_lm_positions.
  pooled_output: Optional[Array] = None  # Always None: this head has no pooler.


@flax.struct.dataclass
class ClassifierOutput:
  """Sequence ([B, num_labels]), token ([B, T, num_labels]) and multiple-choice ([B, C]) logits."""
  last_hidden_state: Array  # [B, T, H]; [B, C, T, H] for multiple choice.
  logits: Array
  pooled_output: Optional[Array] = None  # [B, H] ([B, C, H]) where the head has a pooler.


@flax.struct.dataclass
class QuestionAnsweringOutput:
  last_hidden_state: Array  # [B, T, H]
  start_logits: Array  # [B, T]
  end_logits: Array  # [B, T]
  pooled_output: Optional[Array] = None  # Always None: this head has no pooler.
