"""The values of a training config that can only be typos, refused before a tokenizer or a data file is read.

Each message names the key as the command line spells it and a value that works. Checks that need more than the
config (batch divisibility by the mesh, sequence length against the model's positions, the optimiser's schedule)
stay with the code that knows the rest; these are the ones a run would otherwise meet only after reading its data.
"""
from __future__ import annotations

import ml_collections

from jbert.data import packing
from jbert.errors import UserError

# Shortest sequence any run accepts: [CLS], one token, [SEP]. Pretraining asks for more (jbert.data.loader: 8).
MIN_SEQ_LENGTH = 3
# The data keys that are references (`jbert.data.config`) because others are computed from them, or they from
# others: run.py's `--config.KEY=None` takes every reference, and these mean nothing by None unless data.source is
# unset too, when init_from's workdir fills them (configs/phase2.py, `jbert.data.corpus.inherit`).
_COMPUTED_DATA_KEYS = (
    ("max_seq_length", "the tokens per sequence (128 is BERT's)"),
    ("masked_lm_prob", "the fraction of tokens masked (0.15 is BERT's)"),
    ("max_predictions_per_seq", "the cap on masked positions per sequence (20 at 128 tokens)"),
    ("max_sequences_per_row", "the sequences a packed row holds at most (16 at 128 tokens)"),
)
_DROPOUTS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")


def check_ranges(config: ml_collections.ConfigDict) -> None:
  """A UserError naming the first key whose value is out of range."""
  _positive(config, "batch_size", "the global sequences per optimiser step, e.g. 32")
  if config.get("total_steps") is not None:
    epochs = ", or None to train num_epochs" if "num_epochs" in config else ""
    _positive(config, "total_steps", f"the optimiser steps of the run{epochs}")
  if config.get("num_epochs") is not None and not config.num_epochs > 0:
    raise UserError(f"--config.num_epochs={config.num_epochs} must be positive (passes over the training set).")
  optim = config.get("optim")
  if optim is not None:
    if not optim.learning_rate > 0:
      raise UserError(f"--config.optim.learning_rate={optim.learning_rate} must be positive, e.g. 1e-4 for "
                      "pretraining or 2e-5 for fine-tuning.")
    if optim.get("warmup_steps") is not None and optim.warmup_steps < 0:
      raise UserError(f"--config.optim.warmup_steps={optim.warmup_steps} must be >= 0 (0: no warmup).")
  data = config.get("data")
  for key, meaning in _COMPUTED_DATA_KEYS:  # the first: reading the others computes them from it
    if data is not None and data.get("source") is not None and key in data and data[key] is None:
      raise UserError(f"--config.data.{key}=None: it takes a value, {meaning}.")
  if data is not None and data.get("max_seq_length") is not None and data.max_seq_length < MIN_SEQ_LENGTH:
    raise UserError(f"--config.data.max_seq_length={data.max_seq_length} is too short; use at least "
                    f"{MIN_SEQ_LENGTH} (128 is BERT's).")
  if data is not None and data.get("max_sequences_per_row") is not None and data.get("max_seq_length"):
    packing.check(data)  # slots no row can fill
  model = config.get("model")
  for key in _DROPOUTS:
    value = model.get(key) if model is not None else None
    if value is not None and not 0 <= value < 1:
      raise UserError(f"--config.model.{key}={value} must lie in [0, 1) (a probability of dropping; 0.1 is "
                      "BERT's).")


def _positive(config: ml_collections.ConfigDict, key: str, meaning: str) -> None:
  value = config.get(key)
  if value is None or not value > 0:
    raise UserError(f"--config.{key}={value} must be positive ({meaning}).")
