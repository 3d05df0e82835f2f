"""SentenceEncoder: BertModel + pooling + optional dense projection + optional normalisation (Sentence-BERT).

The module is sentence-transformers' Transformer -> Pooling -> [Dense] -> [Normalize] pipeline in one Flax module,
used by the bi-encoder training tasks (`jbert.tasks.sentence_embedding`) and by `jbert.embed`. Parameters:

  bert/...              BertModel (no pooler unless pooling 'pooler' reads it): what `jbert.load_pretrained(path,
                        jbert.BertModel)` gives, so any BERT / Hugging Face / sentence-transformers folder fills it
  dense/kernel [P, D]   the projection (sentence-transformers' Dense `linear.weight` transposed), `dense/bias` [D]
  classifier/kernel [3D, C], classifier/bias [C]   SoftmaxLoss's classifier over ``(u, v, |u - v|)``: trained, never
                        exported

Inputs are [B, K, T] (K texts per row: a pair, a triplet) or [B, T]; embeddings come out [B, K, D] or [B, D].
Packed rows [R, T] (`segment_ids`, `position_ids`, `cls_positions` [R, S]: every text a segment of its own) pool
each segment alone (`pooling.pool_segments`); `text_slots` [N, K] (indices into the R·S slots) then gathers the
embeddings back to [N, K, D], whose pairs the SoftmaxLoss classifier reads as unpacked; without `text_slots`
(`jbert.embed`'s packed batches) the embeddings stay per slot, [R, S, D].
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from jbert.model import pooling as pooling_lib
from jbert.model import registry
from jbert.model.config import BertConfig
from jbert.model.encoder import BertModel
from jbert.model.layers import zeros_init
from jbert.model.validation import validate_inputs

# Activations of sentence-transformers' Dense module that jbert runs (torch class names in `st_folder`).
ACTIVATIONS = {
    "tanh": jnp.tanh, "identity": lambda x: x, "relu": jax.nn.relu, "sigmoid": jax.nn.sigmoid,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
}


@dataclasses.dataclass(frozen=True)
class Projection:
  """sentence-transformers' Dense module: `activation(x @ kernel + bias)` from `in_features` to `out_features`."""
  in_features: int
  out_features: int
  bias: bool = True
  activation: str = "tanh"

  def __post_init__(self):
    if self.activation not in ACTIVATIONS:
      raise ValueError(f"dense activation {self.activation!r} is not supported; use one of "
                       f"{', '.join(ACTIVATIONS)}.")


@flax.struct.dataclass
class SentenceEncoderOutput:
  embeddings: jax.Array  # [B, K, D] ([B, D] for [B, T] inputs), float32
  logits: Optional[jax.Array] = None  # [B, C]: the SoftmaxLoss classifier of pairs (K = 2), when it has one


def pooled_width(config: BertConfig, modes, layers, layer_combine: str) -> int:
  """Width of the pooled vector before any projection."""
  per_layer = config.hidden_size * (len(layers or (0,)) if layer_combine == "concat" else 1)
  return len(modes) * per_layer


# Bi-encoders (`jbert.tasks.sentence_embedding`): the BertModel part maps as `bert`; the projection and the SoftmaxLoss
# classifier are no transformers weights (an export writes sentence-transformers' modules).
@registry.register("sentence_encoder", pooler=False, dummy_shape=(1, 2, 8), outputs=("embeddings",))
class SentenceEncoder(nn.Module):
  """Sentence embeddings of BERT.

  Attributes:
    config: the BertModel's config.
    pooling: modes of `jbert.model.pooling`, concatenated in order.
    layers: hidden states to pool (0 = embeddings output, 1..L the layers); None: the last layer.
    layer_combine: "concat" or "mean" of the chosen layers.
    projection: the Dense module, or None.
    normalize: unit-length embeddings (sentence-transformers' Normalize module).
    num_labels: a SoftmaxLoss classifier over ``(u, v, |u - v|)`` of each pair with this many classes, or None.
  """
  config: BertConfig
  pooling: tuple[str, ...] = ("mean",)
  layers: Optional[tuple[int, ...]] = None
  layer_combine: str = "concat"
  projection: Optional[Projection] = None
  normalize: bool = False
  num_labels: Optional[int] = None

  @nn.compact
  def __call__(self, input_ids, token_type_ids=None, attention_mask=None, deterministic: bool = True,
               output_hidden_states: bool = False, output_attentions: bool = False, *, segment_ids=None,
               position_ids=None, cls_positions=None, text_slots=None) -> SentenceEncoderOutput:
    del output_hidden_states, output_attentions  # Taken for the heads' uniform signature; embeddings only.
    packed = cls_positions is not None
    if packed and (segment_ids is None or input_ids.ndim != 2):
      raise ValueError("packed rows [R, T] need segment_ids and cls_positions together.")
    single = input_ids.ndim == 2 and not packed
    validate_inputs(self.config, input_ids, token_type_ids, attention_mask, multiple_choice=input_ids.ndim == 3,
                    segment_ids=segment_ids, position_ids=position_ids, cls_positions=cls_positions)
    if packed:
      lead = cls_positions.shape if text_slots is None else text_slots.shape               # [R, S] or [N, K]
    else:
      lead = input_ids.shape[:-1]
    t = input_ids.shape[-1]
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)

    def flat(x):  # [B, K, T] -> [B*K, T]
      return None if x is None else x.reshape(-1, t)

    layers = self.layers if self.layers not in (None, (self.config.num_hidden_layers,)) else None
    out = BertModel(self.config, add_pooling_layer="pooler" in self.pooling, name="bert")(
        flat(input_ids), flat(token_type_ids), flat(attention_mask), deterministic,
        output_hidden_states=layers is not None, segment_ids=segment_ids, position_ids=position_ids,
        cls_positions=cls_positions)
    if layers is None:
      x = out.last_hidden_state.astype(jnp.float32)  # [B*K, T, H]
    else:
      x = pooling_lib.combine_layers(out.hidden_states, layers, self.layer_combine)  # [B*K, T, H']
    pooled = None if out.pooled_output is None else out.pooled_output.astype(jnp.float32)
    if packed:
      e = pooling_lib.pool_all_segments(self.pooling, x, segment_ids, cls_positions, pooled)  # [R, S, P]
      e = e.reshape(-1, e.shape[-1])                                                      # [R*S, P]
      if text_slots is not None:
        e = e[text_slots.reshape(-1)]  # [N*K, P]: each text's slot
    else:
      e = pooling_lib.pool_all(self.pooling, x, flat(attention_mask).astype(jnp.float32), pooled)  # [B*K, P]
    if self.projection is not None:
      e = ACTIVATIONS[self.projection.activation](self._linear(self.projection.out_features, self.projection.bias,
                                                               "dense")(e))  # [B*K, D]
    if self.normalize:
      e = pooling_lib.normalize(e)
    e = e.reshape(*lead, e.shape[-1])  # [B, K, D]
    logits = None
    if self.num_labels is not None and not single and lead[-1] == 2 and (text_slots is not None or not packed):
      u, v = e[:, 0], e[:, 1]  # [B, D]
      logits = self._linear(self.num_labels, True, "classifier")(jnp.concatenate([u, v, jnp.abs(u - v)], -1))
    return SentenceEncoderOutput(embeddings=e, logits=logits)

  def _linear(self, features: int, bias: bool, name: str) -> "Linear":
    return Linear(features, bias, self.config.initializer_range, jnp.dtype(self.config.param_dtype), name=name)


class Linear(nn.Module):
  """float32 `x @ kernel [+ bias]`: [N, P] -> [N, features]. Small, so replicated (no sharded logical axes)."""
  features: int
  use_bias: bool = True
  init_std: float = 0.02
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: jax.Array) -> jax.Array:
    init = nn.with_logical_partitioning(nn.initializers.normal(self.init_std), (None, None))
    kernel = self.param("kernel", init, (x.shape[-1], self.features), self.param_dtype)
    y = x @ kernel.astype(jnp.float32)  # [N, P] @ [P, F]
    if self.use_bias:
      y = y + self.param("bias", zeros_init((None,)), (self.features,), self.param_dtype).astype(jnp.float32)
    return y
