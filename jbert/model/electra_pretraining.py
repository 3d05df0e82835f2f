"""ELECTRA's pretraining model (Clark et al. 2020): a small generator (masked LM) proposes tokens for the masked
positions, and the discriminator tells, for every token, whether it is the original or the generator's sample.

The two share the embedding tables and their LayerNorm (google-research/electra's `embeddings` scope): the
parameter tree is `discriminator` (a `BertForReplacedTokenDetection`, embeddings included) and `generator` (a
`BertForMaskedLM` WITHOUT `bert/embeddings`, which it reads from the discriminator's), so both losses train the
one copy and an export of either model is a complete transformers folder. The generator's own
`embeddings_project` maps the shared `embedding_size` to its narrower hidden size.

Sampling is Gumbel-max over the generator's logits under `stop_gradient`: the discriminator's loss does not reach
the generator (the paper trains the generator by maximum likelihood only).
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jbert.model.config import BertConfig
from jbert.model.discriminator import BertForReplacedTokenDetection
from jbert.model.heads import BertForMaskedLM

SHARED = "embeddings"  # the subtree of `bert` the generator reads from the discriminator


def generator_config(config: BertConfig, hidden_fraction: float, layer_fraction: float = 1.0) -> BertConfig:
  """google-research/electra's `get_generator_config`: hidden size × `hidden_fraction`, FFN 4× that, one head per
  64 dimensions, layers × `layer_fraction`, the discriminator's embedding width (the tables are shared)."""
  hidden = max(1, int(round(config.hidden_size * hidden_fraction)))
  heads = max(1, hidden // 64)
  if hidden % heads:
    raise ValueError(f"the generator's hidden size {hidden} (task.generator_hidden_size={hidden_fraction} of "
                     f"{config.hidden_size}) is not a multiple of its {heads} heads; pick another fraction.")
  return dataclasses.replace(config, hidden_size=hidden, num_attention_heads=heads, intermediate_size=4 * hidden,
                             num_hidden_layers=max(1, int(round(config.num_hidden_layers * layer_fraction))),
                             embedding_size=config.embedding_width)


def generator_params(params):
  """The generator's complete `BertForMaskedLM` tree: its own parameters plus the discriminator's embeddings."""
  gen = dict(params["generator"])
  gen["bert"] = {**gen["bert"], SHARED: params["discriminator"]["bert"][SHARED]}
  return gen


class ElectraOutput(NamedTuple):
  generator_logits: jax.Array      # float32 [B, P, V] at the masked positions
  discriminator_logits: jax.Array  # float32 [B, T], > 0: judged replaced
  replaced: jax.Array              # int32 [B, T]: 1 where the discriminator's input differs from the original
  sampled_ids: jax.Array           # int32 [B, P]: the generator's samples at the masked positions


def _scatter(ids: jax.Array, positions: jax.Array, values: jax.Array, weights: jax.Array) -> jax.Array:
  """ids [B, T] with values [B, P] written at positions [B, P] where weights > 0 (padding entries dropped)."""
  rows = jnp.arange(ids.shape[0])[:, None]
  where = jnp.where(weights > 0, positions, ids.shape[1])  # out of range: dropped
  return ids.at[rows, where].set(values.astype(ids.dtype), mode="drop")


class ElectraForPreTrainingWithGenerator(nn.Module):
  """Generator + discriminator over one masked batch. `config`: the discriminator's; `generator`: its generator's
  (`generator_config`); `temperature`: the sampling softmax's."""
  config: BertConfig
  generator: BertConfig
  temperature: float = 1.0

  def init(self, rngs, *args, **kwargs):  # pylint: disable=arguments-differ
    """Module.init without the generator's own embeddings, which the initialising call has to create (the
    discriminator's are not readable before they exist) and every later call replaces by the shared ones."""
    variables = super().init(rngs, *args, **kwargs)
    params = dict(variables["params"])
    params["generator"] = {**params["generator"], "bert": {
        k: v for k, v in params["generator"]["bert"].items() if k != SHARED}}
    return {**variables, "params": params}

  @nn.compact
  def __call__(self, input_ids, token_type_ids=None, attention_mask=None, deterministic: bool = True,
               masked_lm_positions=None, masked_lm_ids=None, masked_lm_weights=None, *, segment_ids=None,
               position_ids=None) -> ElectraOutput:
    """input_ids: the masked rows; masked_lm_positions/ids/weights [B, P]: where they were masked and the
    original tokens. Without masked positions (init) the generator runs on every position."""
    packed = {"segment_ids": segment_ids, "position_ids": position_ids}
    disc = BertForReplacedTokenDetection(self.config, name="discriminator")
    if masked_lm_positions is None:  # init: create both trees
      disc(input_ids, token_type_ids, attention_mask, deterministic, **packed)
    shared = self.variables["params"]["discriminator"]["bert"][SHARED] if not self.is_initializing() else None

    def with_shared(variables):  # {collection: tree}
      if shared is None:
        return variables
      tree = variables["params"]
      return {**variables, "params": {**tree, "bert": {**tree["bert"], SHARED: shared}}}

    gen_cls = nn.map_variables(BertForMaskedLM, "params", trans_in_fn=with_shared, init=True)
    gen = gen_cls(self.generator, name="generator")
    if masked_lm_positions is None:
      out = gen(input_ids, token_type_ids, attention_mask, deterministic, **packed)
      zeros = jnp.zeros_like(input_ids)
      return ElectraOutput(out.mlm_logits, jnp.zeros(input_ids.shape, jnp.float32), zeros, zeros)
    out = gen(input_ids, token_type_ids, attention_mask, deterministic, masked_lm_positions, **packed)
    logits = jax.lax.stop_gradient(out.mlm_logits) / self.temperature  # [B, P, V]
    rng = self.make_rng("dropout") if self.has_rng("dropout") else jax.random.key(0)
    gumbel = jax.random.gumbel(rng, logits.shape, jnp.float32)
    sampled = jnp.argmax(logits + gumbel, axis=-1).astype(jnp.int32)  # [B, P]
    original = _scatter(input_ids, masked_lm_positions, masked_lm_ids, masked_lm_weights)
    fake = _scatter(input_ids, masked_lm_positions, sampled, masked_lm_weights)
    real = jnp.ones_like(input_ids) if attention_mask is None else attention_mask
    replaced = ((fake != original) & (real > 0)).astype(jnp.int32)
    disc_out = disc(fake, token_type_ids, attention_mask, deterministic, **packed)
    return ElectraOutput(out.mlm_logits, disc_out.logits, replaced, sampled)
