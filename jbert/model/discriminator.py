"""ELECTRA's discriminator head (transformers' `ElectraForPreTraining`): per token, is it the original or a
replacement the generator sampled? dense + hidden_act, then one logit per token."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jbert.model import layers, registry
from jbert.model.config import BertConfig
from jbert.model.encoder import BertModel
from jbert.model.outputs import ClassifierOutput
from jbert.model.registry import HeadWeight


class DiscriminatorHead(nn.Module):
  """`dense` [H, H] + hidden_act, then `prediction` [H, 1]: x [B, T, H] -> float32 logits [B, T]."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    c = self.config
    h = layers.activation(c.hidden_act)(layers.dense(c, c.hidden_size, ("embed", layers.TRANSFORM), "dense")(x))
    return layers.dense(c, 1, (layers.TRANSFORM, None), "prediction")(h)[..., 0].astype(jnp.float32)


@registry.register("replaced_token_detection", pooler=False, outputs=("logits",), linear_weights=(
    HeadWeight("discriminator_predictions.dense", ("discriminator", "dense"), "H"),
    HeadWeight("discriminator_predictions.dense_prediction", ("discriminator", "prediction"), 1)))
class BertForReplacedTokenDetection(nn.Module):
  """The encoder (no pooler) and the discriminator: logits [B, T], > 0 where a token is judged replaced."""
  config: BertConfig
  num_labels: int = 1  # One logit per token; kept for a uniform constructor.

  @nn.compact
  def __call__(self, input_ids, token_type_ids=None, attention_mask=None, deterministic: bool = True,
               output_hidden_states: bool = False, output_attentions: bool = False, *, segment_ids=None,
               position_ids=None) -> ClassifierOutput:
    out = BertModel(self.config, add_pooling_layer=False, name="bert")(
        input_ids, token_type_ids, attention_mask, deterministic, output_hidden_states, output_attentions,
        segment_ids=segment_ids, position_ids=position_ids)
    logits = DiscriminatorHead(self.config, name="discriminator")(out.last_hidden_state)
    return ClassifierOutput(last_hidden_state=out.last_hidden_state, logits=logits,
                            hidden_states=out.hidden_states, attentions=out.attentions)
