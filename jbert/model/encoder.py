"""The layer stack (unrolled or `nn.scan`ned, optionally rematerialised) and BertModel."""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from jbert.model import layers, registry
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
  def __call__(self, x: Array, mask: Array, deterministic: bool, output_hidden_states: bool = False,
               output_attentions: bool = False, segments: Array | None = None, positions: Array | None = None
               ) -> tuple[Array, tuple[Array, ...] | None, tuple[Array, ...] | None]:
    """x: [B, T, H] embeddings; mask: bool [B, T]; segments: None or int32 [B, T] (0 = padding), the sequence of
    each token in packed rows, which attention does not cross; positions: None or int [B, T], each token's
    position for rotary attention (None: 0..T-1).

    Returns `(output [B, T, H], hidden_states, attentions)`: hidden_states is the input followed by every
    layer's output (L + 1 arrays [B, T, H]) when `output_hidden_states`, attentions every layer's probabilities
    (L arrays [B, N, T, T]) when `output_attentions`; each is None when not asked for.
    """
    c = self.config
    layer_cls = layers.BertLayer
    if c.remat_policy != "none":
      # `deterministic` (argument 3, counting self) must stay a Python bool inside the checkpoint.
      # prevent_cse is unnecessary under scan, whose loop already stops XLA from merging recomputation.
      layer_cls = nn.remat(layer_cls, policy=_REMAT_POLICIES[c.remat_policy], prevent_cse=not c.scan_layers,
                           static_argnums=(3,))
    if c.scan_layers:
      return self._scanned(layer_cls, x, mask, deterministic, output_hidden_states, output_attentions, segments,
                           positions)
    hidden, attentions = [x], []
    for i in range(c.num_hidden_layers):
      out = layer_cls(c, output_attentions=output_attentions, index=i, name=f"layer_{i}")(
          x, mask, deterministic, segments, positions)
      x, probs = out if output_attentions else (out, None)
      hidden.append(x)
      attentions.append(probs)
    return (x, tuple(hidden) if output_hidden_states else None,
            tuple(attentions) if output_attentions else None)

  def _scanned(self, layer_cls, x, mask, deterministic, output_hidden_states, output_attentions, segments,
               positions):
    """The layers under `nn.scan`; per-layer outputs and probabilities come back as the scan's stacked ys."""
    c = self.config
    stack = nn.scan(
        layer_cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast), length=c.num_hidden_layers,
        metadata_params={nn.PARTITION_NAME: "layers"})
    first = x
    x, ys = stack(c, scanned=True, collect_hidden=output_hidden_states, output_attentions=output_attentions,
                  name="layers")(x, mask, deterministic, segments, positions)
    ys = list(ys or ())
    unstack = lambda stacked: tuple(stacked[i] for i in range(c.num_hidden_layers))  # [L, ...] -> L x [...]
    hidden = (first, *unstack(ys.pop(0))) if output_hidden_states else None
    attentions = unstack(ys.pop(0)) if output_attentions else None
    return x, hidden, attentions


@registry.register("base", pooler=True)
class BertModel(nn.Module):
  """BERT encoder: embeddings (projected to hidden_size by `embeddings_project` when `embedding_size` differs),
  layer stack (with `pre_norm`, then `final_norm`) and (optionally) the pooler on [CLS] (`pooling` "mean": on
  the mean of each sequence's tokens): dense + `pooler_act` (BERT's tanh), + `pooler_norm` (ModernBERT's head).

  `add_pooling_layer` None follows `config.use_pooler` (ELECTRA's and DistilBERT's encoders have none; their
  classification heads hold it). `pooler_dropout`: dropout on [CLS] before the pooler (RoBERTa's and ELECTRA's
  classification heads)."""
  config: BertConfig
  add_pooling_layer: bool | None = None
  pooler_dropout: bool = False

  def setup(self):
    c = self.config
    self.embeddings = layers.BertEmbeddings(c)
    if c.embedding_width != c.hidden_size:
      self.embeddings_project = layers.dense(c, c.hidden_size, (None, "embed"), "embeddings_project")
    self.encoder = BertEncoder(c)
    if c.pre_norm:
      self.final_norm = layers.layer_norm(c, "final_norm")
    if self.has_pooler:
      self.pooler = layers.dense(c, c.hidden_size, ("embed", layers.TRANSFORM), "pooler", use_bias=c.head_bias,
                                 role="out")
      if c.pooler_norm:
        self.pooler_norm = layers.layer_norm(c, "pooler_norm")
      rate = c.hidden_dropout_prob if c.classifier_dropout is None else c.classifier_dropout
      self.pooler_input_dropout = layers.Dropout(rate if self.pooler_dropout else 0.0)

  @property
  def has_pooler(self) -> bool:
    return self.config.use_pooler if self.add_pooling_layer is None else self.add_pooling_layer

  def transform(self, x: Array) -> Array:
    """The pooler's dense, `pooler_act` and `pooler_norm` on [..., H]: what the pooled output is of [CLS] (or the
    mean), and ModernBERT's token classification and QA (`token_head`) of every token."""
    h = layers.activation(self.config.pooler_act)(self.pooler(x))
    return self.pooler_norm(h) if self.config.pooler_norm else h

  def __call__(self, input_ids: Array, token_type_ids: Array | None = None,
               attention_mask: Array | None = None, deterministic: bool = True,
               output_hidden_states: bool = False, output_attentions: bool = False, *,
               segment_ids: Array | None = None, position_ids: Array | None = None,
               cls_positions: Array | None = None) -> BertModelOutput:
    """input_ids, token_type_ids, attention_mask: int [B, T]; attention_mask is 1 for real tokens.

    Packed rows (several sequences laid end to end in a row): `segment_ids` int [B, T] numbers them 1..k in each
    row, 0 for padding (where attention_mask is 0, a token is padding whatever its segment id; without an
    attention_mask, segment 0 is). Attention then never crosses a sequence boundary (`jbert.model.attention`),
    and `position_ids` [B, T] default to each token's index within its own sequence. `cls_positions` int [B, K]
    gives the pooler the [CLS] of each of the K sequences of a row: `pooled_output` is then [B, K, H].
    Without them the traced computation is the one of unpacked BERT.

    `output_hidden_states` adds `hidden_states` (the embeddings output and every layer's output, L + 1 arrays
    [B, T, H]) and `output_attentions` adds `attentions` (L arrays [B, N, T, T] of float32 probabilities), as
    transformers returns them. Both are off by default and then change nothing in the computation.
    """
    validate_inputs(self.config, input_ids, token_type_ids, attention_mask, segment_ids=segment_ids,
                    position_ids=position_ids, cls_positions=cls_positions)
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    segments = None
    if segment_ids is not None:
      real = segment_ids > 0 if attention_mask is None else (attention_mask > 0) & (segment_ids > 0)
      segments = jnp.where(real, segment_ids, 0).astype(jnp.int32)  # [B, T]
      attention_mask = real
    if attention_mask is None:
      attention_mask = jnp.ones_like(input_ids)
    positions = table_positions(self.config, input_ids, segment_ids, position_ids)
    x = self.embeddings(input_ids, token_type_ids, deterministic, positions)  # [B, T, E]
    if self.config.embedding_width != self.config.hidden_size:
      x = self.embeddings_project(x)  # [B, T, H]
    x, hidden, attentions = self.encoder(x, attention_mask.astype(bool), deterministic,
                                         output_hidden_states, output_attentions, segments, positions)  # [B, T, H]
    if self.config.pre_norm:
      x = self.final_norm(x)
    pooled = None
    if self.has_pooler:
      if self.config.pooling == "mean":
        first = _mean_per_sequence(x, attention_mask.astype(bool), segments, cls_positions)
      else:
        first = x[:, 0] if cls_positions is None else jnp.take_along_axis(x, cls_positions[..., None], axis=1)
      first = self.pooler_input_dropout(first, deterministic=deterministic)
      pooled = self.transform(first)  # [B, H] or [B, K, H]
    return BertModelOutput(last_hidden_state=x, pooled_output=pooled, hidden_states=hidden,
                           attentions=attentions)


def _mean_per_sequence(x: Array, mask: Array, segments: Array | None, cls_positions: Array | None) -> Array:
  """The mean of each sequence's real tokens (transformers' `classifier_pooling="mean"`): x [B, T, H], mask bool
  [B, T] -> [B, H]; with cls_positions [B, K], of the segment each position starts -> [B, K, H]."""
  if cls_positions is None:
    weights = mask[:, None, :]  # [B, 1, T]
  elif segments is None:  # one sequence a row, read K times
    weights = jnp.broadcast_to(mask[:, None, :], (*cls_positions.shape, mask.shape[-1]))  # [B, K, T]
  else:
    slot = jnp.take_along_axis(segments, cls_positions, axis=1)  # [B, K]: each slot's segment
    weights = (segments[:, None, :] == slot[:, :, None]) & mask[:, None, :]  # [B, K, T]
  weights = weights.astype(jnp.float32)
  total = jnp.einsum("bkt,bth->bkh", weights, x.astype(jnp.float32))  # [B, K, H]
  mean = (total / jnp.maximum(weights.sum(-1, keepdims=True), 1.0)).astype(x.dtype)
  return mean[:, 0] if cls_positions is None else mean


def table_positions(config: BertConfig, input_ids: Array, segment_ids: Array | None,
                    position_ids: Array | None) -> Array | None:
  """The rows of the position table each token reads ([B, T]; None: 0..T-1 in every row).

  `position_ids` count from 0 in each sequence, whatever the family; the table is read from
  `config.position_offset` on. With an offset (RoBERTa: pad_token_id + 1) the default positions are fairseq's:
  the non-padding tokens (input_ids != pad_token_id) counted from the offset, restarting at each sequence of a
  packed row, and padding at offset - 1, as transformers computes them.
  """
  offset = config.position_offset
  if position_ids is not None:
    return position_ids + offset if offset else position_ids
  if not offset:
    return None if segment_ids is None else segment_positions(segment_ids)
  real = (input_ids != config.pad_token_id).astype(jnp.int32)  # [B, T]
  counted = jnp.cumsum(real, axis=1)  # [B, T]
  if segment_ids is not None:  # restart the count at each sequence's first token
    start = segment_positions(segment_ids)  # [B, T]: index within the sequence
    first = jnp.arange(input_ids.shape[-1], dtype=jnp.int32)[None] - start  # [B, T]: the sequence's first token
    before = jnp.take_along_axis(counted - real, first, axis=1)  # [B, T]: real tokens before the sequence
    counted = counted - before
  return jnp.where(real > 0, counted - 1 + offset, offset - 1)


def segment_positions(segment_ids: Array) -> Array:
  """int32 [B, T]: each token's index within its run of equal segment ids (its sequence of a packed row)."""
  t = segment_ids.shape[-1]
  index = jnp.arange(t, dtype=jnp.int32)  # [T]
  starts = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]],
                           axis=1)  # [B, T]: a sequence begins here
  return index - jax.lax.cummax(jnp.where(starts, index, 0), axis=1)  # [B, T]
