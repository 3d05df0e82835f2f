"""bench/train_step.py on a tiny model: batch layout, loss parity with transformers, consistent fields."""
import math

import numpy as np
import pytest

from jbert.runtime import flops
from jbert.model import BertConfig
import script_module

bench = script_module.load("bench/train_step.py")


def _config(**overrides):
  # Word ids start at 1000 in make_batch, so the vocabulary must be larger than that.
  return BertConfig(vocab_size=1100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=32, **overrides)


def test_make_batch_layout():
  batch = bench.make_batch(_config(), batch=3, seq=16, masked=4, seed=1)
  ids, positions = batch["input_ids"], batch["masked_lm_positions"]
  assert {k: v.shape for k, v in batch.items()} == {
      "input_ids": (3, 16), "token_type_ids": (3, 16), "attention_mask": (3, 16),
      "masked_lm_positions": (3, 4), "masked_lm_ids": (3, 4), "masked_lm_weights": (3, 4),
      "next_sentence_labels": (3,)}
  assert all(v.dtype == np.int32 for v in batch.values())
  np.testing.assert_array_equal(ids[:, [0, 8, 15]], [[101, 102, 102]] * 3)
  np.testing.assert_array_equal(batch["token_type_ids"][0], [0] * 9 + [1] * 7)
  np.testing.assert_array_equal(np.take_along_axis(ids, positions, 1), np.full((3, 4), 103))
  assert all(len(set(row)) == 4 and not set(row) & {0, 8, 15} for row in positions.tolist())
  assert np.all(batch["masked_lm_ids"] >= 1000) and np.all(batch["masked_lm_ids"] < 1100)
  assert np.sum(ids == 103) == 12 and np.all(batch["masked_lm_weights"] == 1)


def test_make_batch_rejects_too_many_masked_positions():
  with pytest.raises(ValueError, match=r"masked=14 must lie in \[1, seq - 3 = 13\]"):
    bench.make_batch(_config(), batch=1, seq=16, masked=14)


def test_run_matches_torch_losses_and_reports_consistent_numbers():
  # No dropout, so both frameworks compute the same function from the same weights.
  config = _config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  r = bench.run(config, batch=2, seq=16, masked=3, steps=2, warmup=1, compile_layers=(1, 2))

  # Same weights and batch: the same loss before the first update, and the same AdamW updates after it.
  assert len(r["jbert_losses"]) == len(r["torch_losses"]) == 4  # warmup 1, then 1 timed, 1 untimed, 1 timed
  np.testing.assert_allclose(r["jbert_losses"], r["torch_losses"], rtol=1e-4)
  assert abs(r["jbert_losses"][0] - math.log(1100) - math.log(2)) < 0.3  # Near-uniform at initialisation.
  assert r["jbert_losses"][2] < r["jbert_losses"][0]

  assert r["threads"] >= 1 and r["torch_attn_implementation"] == "sdpa"
  assert len(r["jbert_step_s_all"]) == len(r["torch_step_s_all"]) == 2
  assert r["jbert_step_s"] == pytest.approx(np.median(r["jbert_step_s_all"]))
  assert r["torch_step_s"] == pytest.approx(np.median(r["torch_step_s_all"]))
  assert r["speedup_vs_torch"] == pytest.approx(r["torch_step_s"] / r["jbert_step_s"])
  assert r["model_flops_per_step"] == flops.train_flops_per_step(config, batch_size=2, seq_len=16,
                                                                  num_masked=3)
  assert 1e8 < r["peak_flops"] < 1e15
  assert r["mfu"] == pytest.approx(r["model_flops_per_step"] / r["jbert_step_s"] / r["peak_flops"])
  assert r["compile_s_1_layers"] > 0 and r["compile_s_2_layers"] > 0
  assert r["compile_ratio"] == pytest.approx(r["compile_s_2_layers"] / r["compile_s_1_layers"])
