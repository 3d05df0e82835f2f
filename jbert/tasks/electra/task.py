"""ELECTRA pretraining (Clark et al. 2020): replaced-token detection on pretraining's corpus and masks.

The batches are pretraining's without NSP (`jbert.tasks.pretraining`: packing, dynamic masks, per-shard iterators,
resume and the held-out rows all as there); the model is `jbert.model.electra_pretraining`: the generator fills the
masked positions with samples from its softmax, the discriminator classifies every real token as original or
replaced. Loss: the generator's MLM cross-entropy (per masked token) + `task.discriminator_weight` (the paper's
λ = 50) × the discriminator's binary cross-entropy (per real token). A sampled token equal to the original counts
as original, as in the paper.

Metrics (train/ and eval/): `generator_mlm_accuracy`, `discriminator_accuracy` over the real tokens, and
`replaced_precision` / `replaced_recall` of the discriminator on the replaced tokens (their denominators depend
on the samples and predictions, so they are metrics only; the objectives' denominators are the batch's).

The export (WORKDIR/export) is the discriminator as transformers' `ElectraForPreTraining`, the model one fine-tunes
(`--config.init_from=WORKDIR/export`), and WORKDIR/export_generator the generator as `ElectraForMaskedLM`.
"""
from __future__ import annotations

import os

import flax.linen as nn
import jax
import jax.numpy as jnp

from jbert.data import packing
from jbert.model import BertForMaskedLM, registry
from jbert.model.discriminator import BertForReplacedTokenDetection
from jbert.model.electra_pretraining import (SHARED, ElectraForPreTrainingWithGenerator, generator_config,
                                             generator_params)
from jbert.tasks.base import MODEL_INPUTS, Weighted, mean_cross_entropy_sums
from jbert.tasks.pretraining.task import Pretraining
from jbert.tasks.registry import register

GENERATOR_DIR = "generator"  # the generator's folder in what `export` writes (keep_best's WORKDIR/best keeps it)


@register
class ReplacedTokenDetection(Pretraining):
  """ELECTRA's generator + discriminator on pretraining's batches (module docstring)."""

  name = "electra_pretraining"
  kinds = ("electra_pretraining",)
  config_names = ("electra_pretraining",)
  head = registry.head(BertForReplacedTokenDetection)
  exports = True
  export_beside = {GENERATOR_DIR: "export_generator"}  # the trainer publishes it as WORKDIR/export_generator
  pretrains = True

  @classmethod
  def config_section(cls, name: str) -> dict:
    del name
    return {
        "generator_hidden_size": 0.25,        # the generator's width as a fraction of the discriminator's (the
                                              # paper: 1/4 small and large, 1/3 base); FFN 4x, a head per 64
        "generator_layers": 1.0,              # the generator's depth as a fraction of the discriminator's
        "discriminator_weight": 50.0,         # λ: loss = generator MLM + λ · discriminator BCE (the paper's 50)
        "temperature": 1.0,                   # the softmax temperature the replacements are sampled at
    }

  def __init__(self, *, generator_hidden_size: float = 0.25, generator_layers: float = 1.0,
               discriminator_weight: float = 50.0, temperature: float = 1.0, **pretraining):
    super().__init__(nsp=False, **pretraining)
    if not 0 < generator_hidden_size <= 1 or not 0 < generator_layers <= 1:
      raise ValueError(f"task.generator_hidden_size={generator_hidden_size} and task.generator_layers="
                       f"{generator_layers} must lie in (0, 1]: the generator is the smaller model.")
    if discriminator_weight <= 0 or temperature <= 0:
      raise ValueError(f"task.discriminator_weight={discriminator_weight} and task.temperature={temperature} must "
                       "be positive (the paper: 50 and 1).")
    self.generator_hidden_size, self.generator_layers = float(generator_hidden_size), float(generator_layers)
    self.temperature = float(temperature)
    self.objectives = {"generator_mlm_loss": 1.0, "discriminator_loss": float(discriminator_weight)}

  @classmethod
  def from_config(cls, config, tokenizer=None) -> "ReplacedTokenDetection":
    if config.data.nsp:
      raise ValueError("ELECTRA has no next-sentence prediction: set --config.data.nsp=False (configs/electra.py "
                       "does).")
    t = config.task
    kwargs = {"generator_hidden_size": t.generator_hidden_size, "generator_layers": t.generator_layers,
              "discriminator_weight": t.discriminator_weight, "temperature": t.temperature,
              "max_predictions": config.data.max_predictions_per_seq,
              "packed": packing.Layout.from_config(config.data)}
    if tokenizer is None:
      return cls(**kwargs)
    return cls(**kwargs, data_cfg=config.data, tokenizer=tokenizer, global_batch_size=config.batch_size,
               seed=config.seed, eval_batches=config.eval_batches if config.eval_every_steps else 0)

  # -- model --

  def generator(self, bert_config):
    return generator_config(bert_config, self.generator_hidden_size, self.generator_layers)

  def model(self, bert_config):
    return ElectraForPreTrainingWithGenerator(bert_config, self.generator(bert_config), self.temperature)

  def extra_inputs(self, batch):
    inputs = {k: batch[k] for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")}
    if self.packed:
      inputs.update(segment_ids=batch["segment_ids"], position_ids=batch["position_ids"])
    return inputs

  def apply(self, model, params, batch, rng, *, deterministic: bool):
    kwargs = {k: batch[k] for k in MODEL_INPUTS[1:] if k in batch}
    return model.apply({"params": params}, batch["input_ids"], deterministic=deterministic, rngs={"dropout": rng},
                       **kwargs, **self.extra_inputs(batch))

  def step_flops(self, bert_config, batch_size, seq_len):
    """The generator's encoder over every token and its MLM head at the masked positions (dense to the shared
    embedding width E, decoder E x V), the discriminator's encoder and head (one dense) over every token; 3x the
    forward pass, per row of `seq_len` tokens as pretraining's."""
    from jbert.runtime import flops  # pylint: disable=g-import-not-at-top
    gen = self.generator(bert_config)
    tokens = batch_size * seq_len
    masked = batch_size * (self.packed.max_predictions if self.packed else self.max_predictions)
    e, g, h, v = bert_config.embedding_width, gen.hidden_size, bert_config.hidden_size, bert_config.vocab_size
    forward = (flops.forward_flops(gen, batch_size=batch_size, seq_len=seq_len, num_masked=0, nsp=False)
               + 2 * masked * (g * e + e * v) + 2 * tokens * e * g * (e != g)
               + flops.forward_flops(bert_config, batch_size=batch_size, seq_len=seq_len, num_masked=0, nsp=False)
               + 2 * tokens * (h * h + h) + 2 * tokens * e * h * (e != h))
    return 3 * forward

  def load_init(self, path, bert_config, *, seed, fresh):
    """The discriminator from `path` (an ElectraForPreTraining folder, or any encoder of its size), the generator
    from `path/generator` or `path_generator` when one is there (WORKDIR/best, WORKDIR/export of this task), else
    fresh."""
    from jbert import weights  # pylint: disable=g-import-not-at-top
    params = dict(nn.meta.unbox(fresh()))
    runtime = {k: getattr(bert_config, k) for k in weights.OVERRIDABLE}
    params["discriminator"] = weights.load_pretrained(path, BertForReplacedTokenDetection, rng_seed=seed,
                                                      **runtime)[1]
    found = [g for g in (os.path.join(path, GENERATOR_DIR), os.path.normpath(path) + "_generator")
             if os.path.isdir(g)]
    if found:
      params["generator"] = _own(weights.load_pretrained(found[0], BertForMaskedLM, **runtime)[1])
    return params

  def load_export(self, directory, bert_config):
    from jbert import weights  # pylint: disable=g-import-not-at-top
    runtime = {k: getattr(bert_config, k) for k in weights.OVERRIDABLE}
    return {"discriminator": weights.load_pretrained(directory, BertForReplacedTokenDetection, **runtime)[1],
            "generator": _own(weights.load_pretrained(os.path.join(directory, GENERATOR_DIR), BertForMaskedLM,
                                                      **runtime)[1])}

  def export(self, bert_config, params, out_dir, tokenizer) -> None:
    """The discriminator as `ElectraForPreTraining` in `out_dir`, the generator as `ElectraForMaskedLM` in
    `out_dir/generator` (published as WORKDIR/export_generator, `export_beside`), each with the tokenizer. No task
    kind is recorded: they are pretrained encoders."""
    from jbert import weights  # pylint: disable=g-import-not-at-top
    weights.save_pretrained(bert_config, params["discriminator"], out_dir, BertForReplacedTokenDetection,
                            tokenizer=tokenizer)
    weights.save_pretrained(self.generator(bert_config), generator_params(params),
                            os.path.join(out_dir, GENERATOR_DIR), BertForMaskedLM, tokenizer=tokenizer)

  # -- losses --

  def loss(self, outputs, batch):
    """The generator's MLM entries per masked token, the discriminator's per real token (module docstring)."""
    weights = batch["masked_lm_weights"].astype(jnp.float32)                 # [B, P]
    nll, correct = mean_cross_entropy_sums(outputs.generator_logits, batch["masked_lm_ids"], weights)
    masked = jnp.sum(weights)
    real = batch["attention_mask"].astype(jnp.float32)                       # [B, T]
    logits = outputs.discriminator_logits.astype(jnp.float32)                # [B, T]
    labels = outputs.replaced.astype(jnp.float32)                            # [B, T]
    bce = jax.nn.softplus(logits) - logits * labels                          # -log σ(±logit)
    judged = (logits > 0).astype(jnp.float32)
    hits = jnp.sum(judged * labels * real)
    return {
        "generator_mlm_loss": Weighted(nll, masked),
        "generator_mlm_accuracy": Weighted(correct, masked),
        "discriminator_loss": Weighted(jnp.sum(bce * real), jnp.sum(real)),
        "discriminator_accuracy": Weighted(jnp.sum((judged == labels) * real), jnp.sum(real)),
        "replaced_precision": Weighted(hits, jnp.sum(judged * real)),
        "replaced_recall": Weighted(hits, jnp.sum(labels * real)),
    }


def _own(generator):
  """A loaded generator's tree without the embeddings it shares with the discriminator."""
  return {**generator, "bert": {k: v for k, v in generator["bert"].items() if k != SHARED}}
