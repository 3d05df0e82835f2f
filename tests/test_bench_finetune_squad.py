"""bench/finetune_squad.py on a tiny model: batch layout, loss parity with transformers, consistent fields."""
import json

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


# ----------------------------------------------------------------------------------------------------------
# --model: EM/F1 over seeds, jbert's run.py beside the same recipe in transformers.
# ----------------------------------------------------------------------------------------------------------

import squad_quality as quality  # noqa: E402  (bench/, on the path since the script above was loaded)


def test_the_torch_schedule_is_jberts_and_seeds_are_summarised_as_mean_and_sample_std():
  from configs import finetune
  from jbert.train import optim
  cfg = finetune.get_config("squad").optim
  cfg.warmup_steps = optim.warmup_steps(cfg, 37)
  jbert_schedule = optim.make_schedule(cfg, 37)
  factors = [quality.linear_schedule(step, cfg.warmup_steps, 37) for step in range(40)]
  np.testing.assert_allclose([cfg.learning_rate * f for f in factors], [float(jbert_schedule(s)) for s in range(40)],
                             rtol=1e-6, atol=1e-12)
  s = quality.summarise([{"exact_match": 80.0, "f1": 88.0}, {"exact_match": 82.0, "f1": 90.0},
                         {"exact_match": 81.0, "f1": 92.0}])
  assert s == {"exact_match_mean": 81.0, "exact_match_std": 1.0, "f1_mean": 90.0, "f1_std": 2.0}
  assert quality.welch_t([1.0, 2.0, 3.0], [2.0, 3.0, 4.0]) == pytest.approx(-1 / np.sqrt(2 / 3))
  assert quality.welch_t([1.0], [2.0, 3.0]) is None


def test_quality_trains_both_systems_on_the_same_windows_and_scores_them(tmp_path):
  """The machinery on a tiny random model (nothing pretrained can be downloaded here): a generated task (find the
  marked span) that both systems learn in 9 steps; the F1 > 70 budget needs a real pretrained model."""
  import torch
  import transformers
  from tasks import squad_data
  from jbert import tasks, tokenizer as tokenizer_lib
  from jbert.tasks.question_answering import features as squad
  train = squad_data.write_squad_json(tmp_path / "train.json", squad_data.marked_span_examples(240, seed=1))
  dev = squad_data.write_squad_json(tmp_path / "dev.json", squad_data.marked_span_examples(40, seed=2))
  torch.manual_seed(0)
  transformers.BertModel(transformers.BertConfig(
      vocab_size=len(squad_data.VOCAB), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
      intermediate_size=128, max_position_embeddings=64, hidden_dropout_prob=0.0,
      attention_probs_dropout_prob=0.0)).save_pretrained(tmp_path / "model")
  squad_data.write_vocab(tmp_path / "model" / "vocab.txt")
  recipe = quality.Recipe(model=str(tmp_path / "model"), train_file=train, eval_file=dev, out=str(tmp_path / "out"),
                          seeds=(0,), train_questions=200, batch=32, epochs=1.0, learning_rate=5e-3,
                          max_seq_length=32, doc_stride=12, max_query_length=8)
  examples, _ = quality.write_data(recipe)
  assert len(examples) == 200
  # run.py's task, from the recipe's config, trains on exactly the windows the transformers side is given.
  tok = tokenizer_lib.load_tokenizer(recipe.model)
  task = tasks.build_task(recipe.config(0), tok)
  torch_windows = squad.squad_features(examples, tok, 32, doc_stride=12, max_query_length=8, training=True,
                                       require_answers=True)
  np.testing.assert_array_equal(task._train["input_ids"], torch_windows["input_ids"])  # pylint: disable=protected-access

  r = quality.run(recipe)
  windows = len(torch_windows["input_ids"])
  assert (r["train_questions"], r["eval_questions"], r["train_windows"]) == (200, 40, windows)
  assert r["steps"] == -(-windows // 32) == r["torch"]["per_seed"][0]["steps"]
  for system in ("jbert", "torch"):
    seed0 = r[system]["per_seed"][0]
    assert seed0["f1"] >= 90 and seed0["exact_match"] >= 85, (system, seed0)
    assert (r[system]["f1_mean"], r[system]["f1_std"]) == (seed0["f1"], 0.0)
  steps = [json.loads(line)["step"] for line in (tmp_path / "out" / "jbert_seed0" / "metrics.jsonl").read_text(
      ).splitlines() if "train/loss" in line]
  assert steps[-1] == r["steps"]  # the same number of updates on both sides
  first, last = r["torch"]["per_seed"][0]["first_loss"], r["torch"]["per_seed"][0]["last_loss"]
  assert abs(first - np.log(32)) < 0.3 and last < 0.5 * first
  assert r["f1_difference"] == r["jbert"]["f1_mean"] - r["torch"]["f1_mean"] and r["f1_welch_t"] is None
