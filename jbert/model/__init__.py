"""BERT in Flax linen: config, BertModel and the pretraining / task heads."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jbert.model.config import PRESETS, BertConfig
from jbert.model.encoder import BertEncoder, BertModel
from jbert.model.heads import (BertForMaskedLM, BertForMultipleChoice, BertForPreTraining,
                               BertForQuestionAnswering, BertForSequenceClassification,
                               BertForTokenClassification)
from jbert.model.layout import stack_layers, unstack_layers
from jbert.model.outputs import (BertModelOutput, ClassifierOutput, MaskedLMOutput, PreTrainingOutput,
                                 QuestionAnsweringOutput)
from jbert.model.sentence import Projection, SentenceEncoder, SentenceEncoderOutput
from jbert.model.registry import Head, head, heads
# After the BERT heads, so the registry lists them first.
from jbert.model.discriminator import BertForReplacedTokenDetection  # noqa: E402  pylint: disable=wrong-import-order
from jbert.model.validation import validate_inputs


def init_params(model: nn.Module, rng: jax.Array, input_shape: tuple[int, ...] | None = None):
  """Jitted init; returns the boxed (`nn.LogicallyPartitioned`) params.

  input_shape defaults to (1, 8), or (1, 2, 8) for BertForMultipleChoice. Wrap in `jax.eval_shape` for
  shapes and axis names without allocating.
  """
  if input_shape is None:
    input_shape = head(type(model)).dummy_shape

  @jax.jit
  def init(rng):
    return model.init(rng, jnp.zeros(input_shape, jnp.int32))["params"]

  return init(rng)


__all__ = [
    "PRESETS", "BertConfig", "BertEncoder", "BertModel", "BertForPreTraining", "BertForMaskedLM",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
    "BertForMultipleChoice", "BertForReplacedTokenDetection", "Head", "head", "heads", "BertModelOutput", "PreTrainingOutput",
    "MaskedLMOutput", "ClassifierOutput", "QuestionAnsweringOutput", "init_params", "validate_inputs",
    "stack_layers", "unstack_layers", "Projection", "SentenceEncoder", "SentenceEncoderOutput",
]
