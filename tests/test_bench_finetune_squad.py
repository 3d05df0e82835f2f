"""bench/finetune_squad.py on a tiny model: batch layout, loss parity with transformers, consistent fields."""
import numpy as np
import pytest

from jbert.model import BertConfig
import script_module

bench = script_module.load("bench/finetune_squad.py")


def _config(**overrides):
  # Word ids start at 1000 in make_batch, so the vocabulary must be larger than that.
  return BertConfig(vocab_size=1100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=32, scan_layers=False, **overrides)


def test_make_batch_layout():
  batch = bench.make_batch(_config(), batch=4, seq=16, question=5, seed=1)
  assert {k: v.shape for k, v in batch.items()} == {
      "input_ids": (4, 16), "token_type_ids": (4, 16), "attention_mask": (4, 16), "start_positions": (4,),
      "end_positions": (4,)}
  assert all(v.dtype == np.int32 for v in batch.values())
  np.testing.assert_array_equal(batch["input_ids"][:, [0, 6, 15]], [[101, 102, 102]] * 4)
  np.testing.assert_array_equal(batch["token_type_ids"][0], [0] * 7 + [1] * 9)
  start, end = batch["start_positions"], batch["end_positions"]
  assert np.all(7 <= start) and np.all(start <= end) and np.all(end <= 14) and np.all(end - start < 5)
  with pytest.raises(ValueError, match=r"question=13 must lie in \[1, seq - 4 = 12\]"):
    bench.make_batch(_config(), batch=1, seq=16, question=13)


def test_run_matches_torch_losses_and_reports_consistent_numbers():
  # No dropout, so both frameworks compute the same function from the same weights.
  config = _config(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  r = bench.run(config, batch=4, seq=16, question=5, steps=2, warmup=1, rounds=2)
  # Same weights and batch: the same loss before the first update, and the same AdamW updates after it.
  assert len(r["jbert_losses"]) == len(r["torch_losses"]) == 4  # warmup 1, then 1 timed, 1 untimed, 1 timed
  np.testing.assert_allclose(r["jbert_losses"], r["torch_losses"], rtol=1e-4)
  assert abs(r["jbert_losses"][0] - np.log(16)) < 0.3  # near-uniform over 16 positions at initialisation
  assert r["jbert_losses"][-1] < r["jbert_losses"][0]
  assert r["threads"] >= 1 and r["torch_attn_implementation"] == "sdpa"
  assert len(r["jbert_step_s_all"]) == len(r["torch_step_s_all"]) == 2
  assert r["jbert_step_s"] == pytest.approx(np.median(r["jbert_step_s_all"]))
  assert r["torch_step_s"] == pytest.approx(np.median(r["torch_step_s_all"]))
  assert r["jbert_spread"] == pytest.approx(max(r["jbert_step_s_all"]) / min(r["jbert_step_s_all"]))
  assert r["speedup_vs_torch"] == pytest.approx(r["torch_step_s"] / r["jbert_step_s"])
  assert r["jbert_cpu_s"] > 0 and r["cpu_ratio_vs_torch"] == pytest.approx(r["torch_cpu_s"] / r["jbert_cpu_s"])
