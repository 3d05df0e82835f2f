"""Named model outputs (pytrees, so they pass through `jax.jit`).

Every output has `hidden_states` and `attentions`, None unless the call asked for them with
`output_hidden_states=True` / `output_attentions=True`: `hidden_states` is the embeddings output followed by
every layer's output (L + 1 arrays [B, T, H]), `attentions` every layer's attention probabilities (L float32
arrays [B, N, T, T]), as transformers returns them. Multiple choice keeps its choices axis: [B, C, T, H] and
[B, C, N, T, T].
"""
from __future__ import annotations

from typing import Optional

import flax.struct
import jax

Array = jax.Array
Arrays = Optional[tuple[Array, ...]]


@flax.struct.dataclass
class BertModelOutput:
  last_hidden_state: Array  # [B, T, H]
  pooled_output: Optional[Array] = None  # [B, H]; None without the pooler.
  hidden_states: Arrays = None  # L + 1 x [B, T, H]
  attentions: Arrays = None  # L x [B, N, T, T]


@flax.struct.dataclass
class PreTrainingOutput:
  last_hidden_state: Array  # [B, T, H]
  pooled_output: Array  # [B, H]
  mlm_logits: Array  # [B, T, V], or [B, P, V] with masked_lm_positions.
  nsp_logits: Array  # [B, 2]
  hidden_states: Arrays = None
  attentions: Arrays = None


@flax.struct.dataclass
class MaskedLMOutput:
  last_hidden_state: Array  # [B, T, H]
  mlm_logits: Array  # [B, T, V], or [B, P, V] with masked_lm_positions.
  pooled_output: Optional[Array] = None  # Always None: this head has no pooler.
  hidden_states: Arrays = None
  attentions: Arrays = None


@flax.struct.dataclass
class ClassifierOutput:
  """Sequence ([B, num_labels]), token ([B, T, num_labels]) and multiple-choice ([B, C]) logits."""
  last_hidden_state: Array  # [B, T, H]; [B, C, T, H] for multiple choice.
  logits: Array
  pooled_output: Optional[Array] = None  # [B, H] ([B, C, H]) where the head has a pooler.
  hidden_states: Arrays = None
  attentions: Arrays = None


@flax.struct.dataclass
class QuestionAnsweringOutput:
  last_hidden_state: Array  # [B, T, H]
  start_logits: Array  # [B, T]
  end_logits: Array  # [B, T]
  pooled_output: Optional[Array] = None  # Always None: this head has no pooler.
  hidden_states: Arrays = None
  attentions: Arrays = None
