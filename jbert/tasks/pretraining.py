"""BERT pretraining: masked LM + (optionally) next-sentence prediction on the grain pipeline.

The MLM loss is normalised by the masked-token weight of the whole global batch and the NSP loss by its
sequence count, both computed before any micro-batching, so k accumulated micro-batches give the gradient of one
k-times larger batch. Evaluation runs the same sums per held-out row and adds them up.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import loader as data_loader
from jbert.model import BertForPreTraining, registry
from jbert.data import streams
from jbert.tasks.base import EvalSet, Task, mean_cross_entropy_sums

_PRETRAIN_KEYS = ("input_ids", "token_type_ids", "attention_mask", "masked_lm_positions", "masked_lm_ids",
                  "masked_lm_weights", "next_sentence_labels")


class Pretraining(Task):
  """MLM (+ NSP unless `data.nsp` is False) with `BertForPreTraining`.

  `Pretraining(nsp=..., max_predictions=...)` has the losses and batch shapes only (tests, benchmarks, AOT
  compilation); `from_config` adds the corpus (`data` section), the batch size and the held-out evaluation.
  """

  name = "pretraining"
  head = registry.head(BertForPreTraining)
  predict_keys = _PRETRAIN_KEYS

  def __init__(self, *, nsp: bool = True, max_predictions: int = 20, data_cfg=None, tokenizer=None,
               global_batch_size: int = 0, seed: int = 0, eval_batches: int = 0):
    self.nsp, self.max_predictions = bool(nsp), int(max_predictions)
    self.data_cfg, self.tokenizer = data_cfg, tokenizer
    self.global_batch_size, self.seed, self.eval_batches = global_batch_size, seed, eval_batches

  @classmethod
  def from_config(cls, config, tokenizer) -> "Pretraining":
    """`eval_batches` held-out batches when `eval_every_steps` is set, else none."""
    return cls(nsp=config.data.nsp, max_predictions=config.data.max_predictions_per_seq, data_cfg=config.data,
               tokenizer=tokenizer, global_batch_size=config.batch_size, seed=config.seed,
               eval_batches=config.eval_batches if config.eval_every_steps else 0)

  def extra_inputs(self, batch):
    return {"masked_lm_positions": batch["masked_lm_positions"]}

  def step_flops(self, bert_config, batch_size, seq_len):
    from jbert.runtime import flops  # pylint: disable=g-import-not-at-top
    return flops.train_flops_per_step(bert_config, batch_size=batch_size, seq_len=seq_len,
                                      num_masked=self.max_predictions, nsp=self.nsp)

  def batch_spec(self, batch_size, max_seq_length):
    p = self.max_predictions
    shapes = {"input_ids": (max_seq_length,), "token_type_ids": (max_seq_length,),
              "attention_mask": (max_seq_length,), "masked_lm_positions": (p,), "masked_lm_ids": (p,),
              "masked_lm_weights": (p,), "next_sentence_labels": ()}
    return {k: jax.ShapeDtypeStruct((batch_size, *s), jnp.int32) for k, s in shapes.items()}

  def train_stream(self, shards):
    """Checks the corpus first (files, TFDS preparation, documents for every shard and the held-out split)."""
    if self.data_cfg is None:
      raise ValueError("this Pretraining task has no corpus; build it with Pretraining.from_config.")
    data_loader.check_data(self.data_cfg, bool(self.eval_batches), shards.num_shards)
    make = functools.partial(self._iterator, self.data_cfg, self.tokenizer, self.global_batch_size, self.seed)
    return streams.PretrainBatches(make, shards)

  @staticmethod
  def _iterator(data_cfg, tokenizer, global_batch_size, seed, shard, num_shards):
    return data_loader.make_pretrain_iterator(data_cfg, tokenizer, global_batch_size=global_batch_size, seed=seed,
                                              process_index=shard, process_count=num_shards)

  def eval_sets(self, shards=None):
    """The held-out batches of every data shard, laid out in global-batch order (shard s's rows of batch i
    follow shard s-1's), so each process feeds exactly the rows it would have trained on."""
    if not self.eval_batches:
      return []
    per_shard = [data_loader.make_eval_batches(
        self.data_cfg, self.tokenizer, global_batch_size=self.global_batch_size, process_index=s,
        process_count=shards.num_shards, num_batches=self.eval_batches) for s in range(shards.num_shards)]
    features = {k: np.concatenate([b[i][k] for i in range(self.eval_batches) for b in per_shard])
                for k in per_shard[0][0]}
    return [EvalSet("held_out", features, labelled=True)]

  # -- losses --

  def loss_totals(self, batch):
    return {"mlm_weight": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "sequences": jnp.asarray(batch["input_ids"].shape[0], jnp.float32)}

  def loss_sums(self, outputs, batch):
    weights = batch["masked_lm_weights"].astype(jnp.float32)                 # [B, P]
    mlm_nll, mlm_correct = mean_cross_entropy_sums(outputs.mlm_logits, batch["masked_lm_ids"], weights)
    sums = {"mlm_nll": mlm_nll, "mlm_correct": mlm_correct, "mlm_weight": jnp.sum(weights),
            "sequences": jnp.asarray(weights.shape[0], jnp.float32)}
    if self.nsp:
      labels = batch["next_sentence_labels"].reshape(-1)                      # [B]
      sums["nsp_nll"], sums["nsp_correct"] = mean_cross_entropy_sums(
          outputs.nsp_logits, labels, jnp.ones(labels.shape, jnp.float32))
    return sums

  def _row_sums(self, outputs, batch) -> dict[str, jax.Array]:
    """Per-row [B] MLM (and NSP) negative log-likelihoods, hits and weights."""
    weights = batch["masked_lm_weights"].astype(jnp.float32)                 # [B, P]
    sums = {"mlm_weight": jnp.sum(weights, -1)}
    nll, correct = jax.vmap(mean_cross_entropy_sums)(outputs.mlm_logits, batch["masked_lm_ids"], weights)
    sums["mlm_nll"], sums["mlm_correct"] = nll, correct
    sums["sequences"] = jnp.ones(weights.shape[:1], jnp.float32)
    if self.nsp:
      labels = batch["next_sentence_labels"].reshape(-1, 1)                   # [B, 1]
      ones = jnp.ones(labels.shape, jnp.float32)
      sums["nsp_nll"], sums["nsp_correct"] = jax.vmap(mean_cross_entropy_sums)(
          outputs.nsp_logits[:, None], labels, ones)
    return sums

  def loss(self, sums, totals):
    # The 1e-5 mirrors the original BERT denominator and keeps an all-padding batch finite.
    loss = sums["mlm_nll"] / (totals["mlm_weight"] + 1e-5)
    if self.nsp:
      loss = loss + sums["nsp_nll"] / totals["sequences"]
    return loss

  def train_metrics(self, sums):
    mlm_loss = sums["mlm_nll"] / (sums["mlm_weight"] + 1e-5)
    metrics = {"mlm_loss": mlm_loss, "mlm_accuracy": sums["mlm_correct"] / jnp.maximum(sums["mlm_weight"], 1.0)}
    loss = mlm_loss
    if self.nsp:
      metrics["nsp_loss"] = sums["nsp_nll"] / sums["sequences"]
      metrics["nsp_accuracy"] = sums["nsp_correct"] / sums["sequences"]
      loss = loss + metrics["nsp_loss"]
    metrics["loss"] = loss
    return metrics

  # -- evaluation --

  def predictions(self, outputs, batch):
    return self._row_sums(outputs, batch)

  def evaluate(self, eval_set, predictions):
    sums = {k: np.sum(v.astype(np.float64)) for k, v in predictions.items()}
    return {k: float(v) for k, v in self.train_metrics(sums).items()}
