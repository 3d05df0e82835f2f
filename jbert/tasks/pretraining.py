"""BERT pretraining: masked LM + (optionally) next-sentence prediction on the grain pipeline.

The MLM loss is normalised by the masked-token weight of the whole global batch and the NSP loss by its
sequence count, both computed before any micro-batching, so k accumulated micro-batches give the gradient of one
k-times larger batch. Packed rows (`data.packing`, `jbert.data.packing`) hold several sequences each: the model
reads their segments, NSP is scored per slot and the sequence count is the sum of the slot weights (the real
sequences), so a packed batch has the losses and gradients of its sequences unpacked. Evaluation runs the same
sums per held-out row and adds them up: its metrics are per real sequence either way.
"""
from __future__ import annotations

import logging
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import corpus
from jbert.data import loader as data_loader
from jbert.data import packing
from jbert.model import BertForPreTraining, registry
from jbert.tasks.base import EvalSet, Stream, Task, mean_cross_entropy_sums

log = logging.getLogger("jbert")

# Model inputs of packed rows beyond the standard ones.
_PACKED_INPUTS = ("segment_ids", "position_ids", "cls_positions")


class PretrainBatches(Stream):
  """Iterators of this process's data shards; `next()` gives the process-local rows of one global batch."""

  def __init__(self, data_cfg, tokenizer, shards, *, global_batch_size: int, seed: int):
    self.iterators = {
        s: data_loader.make_pretrain_iterator(data_cfg, tokenizer, global_batch_size=global_batch_size, seed=seed,
                                              process_index=s, process_count=shards.num_shards)
        for s in shards.shards}

  def __next__(self) -> dict[str, np.ndarray]:
    parts = [next(it) for it in self.iterators.values()]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def get_states(self) -> dict[int, Any]:
    return {s: it.get_state() for s, it in self.iterators.items()}

  def set_states(self, states: Mapping[int, Any]) -> None:
    for s, it in self.iterators.items():
      it.set_state(states[s])


class Pretraining(Task):
  """MLM (+ NSP unless `data.nsp` is False) with `BertForPreTraining`.

  `Pretraining(nsp=..., max_predictions=..., packed=...)` has the losses and batch shapes only (tests,
  benchmarks, AOT compilation); `from_config` adds the corpus (`data` section), the batch size and the held-out
  evaluation. `max_predictions` is `data.max_predictions_per_seq`; `packed` the `packing.Layout` of packed rows,
  None for one sequence per row.
  """

  name = "pretraining"
  head = registry.head(BertForPreTraining)

  def __init__(self, *, nsp: bool = True, max_predictions: int = 20, packed: packing.Layout | None = None,
               data_cfg=None, tokenizer=None, global_batch_size: int = 0, seed: int = 0, eval_batches: int = 0):
    self.nsp, self.max_predictions, self.packed = bool(nsp), int(max_predictions), packed
    self.predict_keys = tuple(self.batch_spec(1, 8))
    self.data_cfg, self.tokenizer = data_cfg, tokenizer
    self.global_batch_size, self.seed, self.eval_batches = global_batch_size, seed, eval_batches

  @classmethod
  def from_config(cls, config, tokenizer) -> "Pretraining":
    """`eval_batches` held-out batches when `eval_every_steps` is set, else none."""
    return cls(nsp=config.data.nsp, max_predictions=config.data.max_predictions_per_seq,
               packed=packing.Layout.from_config(config.data), data_cfg=config.data, tokenizer=tokenizer,
               global_batch_size=config.batch_size, seed=config.seed,
               eval_batches=config.eval_batches if config.eval_every_steps else 0)

  def extra_inputs(self, batch):
    packed = {k: batch[k] for k in _PACKED_INPUTS} if self.packed else {}
    return {"masked_lm_positions": batch["masked_lm_positions"], **packed}

  def step_flops(self, bert_config, batch_size, seq_len):
    """Per row of `seq_len` tokens, packed or not: the trainer scales it to the real tokens of each step."""
    from jbert.runtime import flops  # pylint: disable=g-import-not-at-top
    return flops.train_flops_per_step(bert_config, batch_size=batch_size, seq_len=seq_len,
                                      num_masked=self.max_predictions, nsp=self.nsp)

  def batch_spec(self, batch_size, max_seq_length):
    p = self.packed.max_predictions if self.packed else self.max_predictions
    shapes = {"input_ids": (max_seq_length,), "token_type_ids": (max_seq_length,),
              "attention_mask": (max_seq_length,), "masked_lm_positions": (p,), "masked_lm_ids": (p,),
              "masked_lm_weights": (p,), "next_sentence_labels": ()}
    if self.packed:
      shapes.update({k: (max_seq_length,) for k in ("segment_ids", "position_ids")})
      shapes.update({k: (self.packed.max_sequences,) for k in packing.SLOT_KEYS})
    return {k: jax.ShapeDtypeStruct((batch_size, *s), jnp.int32) for k, s in shapes.items()}

  def train_stream(self, shards):
    """Checks the corpus first (files, TFDS preparation, documents for every shard and the held-out split)."""
    if self.data_cfg is None:
      raise ValueError("this Pretraining task has no corpus; build it with Pretraining.from_config.")
    data_loader.check_data(self.data_cfg, bool(self.eval_batches), shards.num_shards)
    log.info("corpus: %s", corpus.describe(self.data_cfg))
    return PretrainBatches(self.data_cfg, self.tokenizer, shards, global_batch_size=self.global_batch_size,
                           seed=self.seed)

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

  def _slots(self, batch) -> jax.Array:
    """float32 [B, S]: 1 for each sequence of a row, 0 for an empty slot ([B, 1] of ones unpacked)."""
    if self.packed:
      return batch["sequence_weights"].astype(jnp.float32)                   # [B, S]
    return jnp.ones((batch["input_ids"].shape[0], 1), jnp.float32)          # [B, 1]

  def _nsp_logits(self, outputs) -> jax.Array:
    """[B, S, 2]: one NSP prediction per slot."""
    return outputs.nsp_logits if self.packed else outputs.nsp_logits[:, None]

  def loss_totals(self, batch):
    return {"mlm_weight": jnp.sum(batch["masked_lm_weights"].astype(jnp.float32)),
            "sequences": jnp.sum(self._slots(batch))}

  def loss_sums(self, outputs, batch):
    weights = batch["masked_lm_weights"].astype(jnp.float32)                 # [B, P]
    mlm_nll, mlm_correct = mean_cross_entropy_sums(outputs.mlm_logits, batch["masked_lm_ids"], weights)
    slots = self._slots(batch)                                               # [B, S]
    sums = {"mlm_nll": mlm_nll, "mlm_correct": mlm_correct, "mlm_weight": jnp.sum(weights),
            "sequences": jnp.sum(slots)}
    if self.nsp:
      labels = batch["next_sentence_labels"].reshape(slots.shape)            # [B, S]
      sums["nsp_nll"], sums["nsp_correct"] = mean_cross_entropy_sums(self._nsp_logits(outputs), labels, slots)
    return sums

  def _row_sums(self, outputs, batch) -> dict[str, jax.Array]:
    """Per-row [B] MLM (and NSP) negative log-likelihoods, hits and weights, and the row's sequences."""
    weights = batch["masked_lm_weights"].astype(jnp.float32)                 # [B, P]
    sums = {"mlm_weight": jnp.sum(weights, -1)}
    nll, correct = jax.vmap(mean_cross_entropy_sums)(outputs.mlm_logits, batch["masked_lm_ids"], weights)
    sums["mlm_nll"], sums["mlm_correct"] = nll, correct
    slots = self._slots(batch)                                               # [B, S]
    sums["sequences"] = jnp.sum(slots, -1)
    if self.nsp:
      labels = batch["next_sentence_labels"].reshape(slots.shape)            # [B, S]
      sums["nsp_nll"], sums["nsp_correct"] = jax.vmap(mean_cross_entropy_sums)(
          self._nsp_logits(outputs), labels, slots)
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
