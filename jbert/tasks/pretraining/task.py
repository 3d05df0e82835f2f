"""BERT pretraining: masked LM + (optionally) next-sentence prediction on the grain pipeline.

Two objectives: the MLM loss over the masked-position weights of the global batch and the NSP loss over its
sequences (`jbert.tasks.base.Weighted`), so k accumulated micro-batches give the gradient of one k-times larger
batch. Packed rows (`data.packing`, `jbert.data.packing`) hold several sequences each: the model reads their
segments, NSP is scored per slot and the sequence count is the sum of the slot weights (the real sequences), so a
packed batch has the losses and gradients of its sequences unpacked. Evaluation computes the same entries per
held-out row and adds them up: its metrics are per real sequence either way.
"""
from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import corpus
from jbert.data import loader as data_loader
from jbert.data import packing
from jbert.model import BertForMaskedLM, BertForPreTraining, registry
from jbert.data import streams
from jbert.tasks.base import EvalSet, Task, Weighted, mean_cross_entropy_sums, per_row, reported
from jbert.tasks.registry import register

log = logging.getLogger("jbert")

# Model inputs of packed rows beyond the standard ones.
_PACKED_INPUTS = ("segment_ids", "position_ids", "cls_positions")


@register
class Pretraining(Task):
  """MLM + NSP with `BertForPreTraining`; MLM only (`data.nsp` False) with `BertForMaskedLM`.

  `Pretraining(nsp=..., max_predictions=...)` has the losses and batch shapes only (tests, benchmarks, AOT
  compilation); `from_config` adds the corpus (`data` section), the batch size and the held-out evaluation.
  """

  name = "pretraining"
  kinds = ("pretraining",)
  config_names = ("pretraining",)  # also every config without a `task` section
  head = registry.head(BertForPreTraining)

  def __init__(self, *, nsp: bool = True, max_predictions: int = 20, packed: packing.Layout | None = None,
               data_cfg=None, tokenizer=None, global_batch_size: int = 0, seed: int = 0, eval_batches: int = 0):
    self.nsp, self.max_predictions, self.packed = bool(nsp), int(max_predictions), packed
    if not self.nsp and self.head.cls is BertForPreTraining:
      # MLM only trains and exports a masked LM: no pooler or NSP head to leave untrained, and the families
      # without a ForPreTraining class (RoBERTa) export as their ForMaskedLM.
      self.head = registry.head(BertForMaskedLM)
    self.predict_keys = tuple(self.batch_spec(1, 8))
    self.objectives = {"mlm_loss": 1.0, **({"nsp_loss": 1.0} if self.nsp else {})}
    self.data_cfg, self.tokenizer = data_cfg, tokenizer
    self.global_batch_size, self.seed, self.eval_batches = global_batch_size, seed, eval_batches

  @classmethod
  def from_config(cls, config, tokenizer=None) -> "Pretraining":
    """The corpus (`data` section), the batch size and `eval_batches` held-out batches when `eval_every_steps` is
    set; without a tokenizer the losses and batch shapes only."""
    if tokenizer is None:
      # nsp None: phase 2 before init_from's settings are read (AOT compiles); BERT's phase 2 has NSP.
      return cls(nsp=config.data.nsp is not False, max_predictions=config.data.max_predictions_per_seq,
                 packed=packing.Layout.from_config(config.data))
    return cls(nsp=config.data.nsp, max_predictions=config.data.max_predictions_per_seq,
               packed=packing.Layout.from_config(config.data), data_cfg=config.data, tokenizer=tokenizer,
               global_batch_size=config.batch_size, seed=config.seed,
               eval_batches=config.eval_batches if config.eval_every_steps else 0)

  def extra_inputs(self, batch):
    # cls_positions place NSP's [CLS] of each packed sequence; a masked LM reads none.
    names = _PACKED_INPUTS if self.nsp else tuple(k for k in _PACKED_INPUTS if k != "cls_positions")
    packed = {k: batch[k] for k in names} if self.packed else {}
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

  def _slots(self, batch) -> jax.Array:
    """float32 [B, S]: 1 for each sequence of a row, 0 for an empty slot ([B, 1] of ones unpacked)."""
    if self.packed:
      return batch["sequence_weights"].astype(jnp.float32)                   # [B, S]
    return jnp.ones((batch["input_ids"].shape[0], 1), jnp.float32)          # [B, 1]

  def loss(self, outputs, batch):
    """MLM cross-entropy and accuracy per masked-position weight; NSP's per (real) sequence."""
    weights = batch["masked_lm_weights"].astype(jnp.float32)                 # [B, P]
    mlm_nll, mlm_correct = mean_cross_entropy_sums(outputs.mlm_logits, batch["masked_lm_ids"], weights)
    masked = jnp.sum(weights)
    entries = {"mlm_loss": Weighted(mlm_nll, masked), "mlm_accuracy": Weighted(mlm_correct, masked)}
    if self.nsp:
      slots = self._slots(batch)                                               # [B, S]
      labels = batch["next_sentence_labels"].reshape(slots.shape)            # [B, S]
      logits = outputs.nsp_logits if self.packed else outputs.nsp_logits[:, None]  # [B, S, 2]
      nll, correct = mean_cross_entropy_sums(logits, labels, slots)
      sequences = jnp.sum(slots)
      entries.update(nsp_loss=Weighted(nll, sequences), nsp_accuracy=Weighted(correct, sequences))
    return entries

  # -- evaluation --

  def predictions(self, outputs, batch):
    """Each row's loss entries: `<name>` its sum, `<name>_denominator` its denominator ([B] each)."""
    rows = per_row(self, outputs, batch)
    return {**{name: e.sum for name, e in rows.items()},
            **{f"{name}_denominator": e.denominator for name, e in rows.items()}}

  def evaluate(self, eval_set, predictions):
    """The reported values of the whole held-out set: every row's sums over every row's denominators."""
    entries = {name: Weighted(np.sum(np.asarray(predictions[name], np.float64)),
                              np.sum(np.asarray(predictions[f"{name}_denominator"], np.float64)))
               for name in predictions if not name.endswith("_denominator")}
    return {k: float(v) for k, v in reported(self, entries).items()}
