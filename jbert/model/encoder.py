"""The layer stack (unrolled or `nn.scan`ned, optionally rematerialised) and BertModel."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jbert.model import layers
from jbert.model.config import BertConfig
from jbert.model.outputs import BertModelOutput
from jbert.model.validation import validate_inputs

Array = jax.Array

_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.checkpoint_dots,
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,
}


class BertEncoder(nn.Module):
  """`num_hidden_layers` BertLayers: `layer_{i}` scopes, or one `layers` scope with a leading [L] axis."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
    c = self.config
    layer_cls = layers.BertLayer
    if c.remat_policy != "none":
      # `deterministic` (argument 3, counting self) must stay a Python bool inside the checkpoint.
      # prevent_cse is unnecessary under scan, whose loop already stops XLA from merging recomputation.
      layer_cls = nn.remat(layer_cls, policy=_REMAT_POLICIES[c.remat_policy], prevent_cse=not c.scan_layers,
                           static_argnums=(3,))
    if c.scan_layers:
      stack = nn.scan(
          layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
          in_axes=(nn.broadcast, nn.broadcast), length=c.num_hidden_layers,
          metadata_params={nn.PARTITION_NAME: "layers"})
      x, _ = stack(c, scanned=True, name="layers")(x, mask, deterministic)
      return x
    for i in range(c.num_hidden_layers):
      x = layer_cls(c, name=f"layer_{i}")(x, mask, deterministic)
    return x


class BertModel(nn.Module):
  """BERT encoder: embeddings, layer stack and (optionally) the tanh pooler on [CLS]."""
  config: BertConfig
  add_pooling_layer: bool = True

  def setup(self):
    c = self.config
    self.embeddings = layers.BertEmbeddings(c)
    self.encoder = BertEncoder(c)
    if self.add_pooling_layer:
      self.pooler = layers.dense(c, c.hidden_size, ("embed", "mlp"), "pooler")

  def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
               attention_mask: Array | None = None, deterministic: bool = True) -> BertModelOutput:
    """input_ids, token_type_ids, attention_mask: int [B, T]; attention_mask is 1 for real tokens."""
    validate_inputs(self.config, input_ids, token_type_ids, attention_mask)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    x = self.embeddings(input_ids, token_type_ids, deterministic)  # [B, T, H]
    x = self.encoder(x, attention_mask.astype(bool), deterministic)  # [B, T, H]
    pooled = jnp.tanh(self.pooler(x[:, 0])) if self.add_pooling_layer else None  # [B, H]
    return BertModelOutput(last_hidden_state=x, pooled_output=pooled)
