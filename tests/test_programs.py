"""The trainer's jitted programs (jbert/train/programs.py): a length-bucketed step is a gradient program per
length and one update program, and computes what the fused step does."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from jbert.runtime import sharding
from jbert.train import step as step_lib
from jbert.train import trainer
from tests.tasks import finetune_data as fd


def test_the_trainer_splits_a_bucketed_step_into_a_gradient_per_length_and_one_update(tmp_path):
  """The update does not depend on the batch's length, so it compiles once; the split step computes exactly
  what the fused one does (up to float rounding)."""
  checkpoint = fd.tiny_checkpoint(tmp_path / "ckpt")
  overrides = fd.local_overrides(tmp_path / "data", n_train=64, n_eval=8)
  config = fd.finetune_config("local", init_from=str(checkpoint), total_steps=4, batch_size=8,
                              **{**overrides, "data.packing": False})
  plan = trainer.plan(config)
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  steps = trainer.build_steps(plan.config, plan.task, plan.bert_config, mesh, plan.rules)
  assert steps.split and plan.task.buckets() == (8, 12, 16)
  with jax.set_mesh(mesh), nn.logical_axis_rules(plan.rules):
    fresh = jax.jit(lambda r: nn.meta.unbox(step_lib.init_state(steps.model, steps.tx, r, (1, 8))),
                    out_shardings=steps.shardings)
    batch = next(plan.task.train_stream(plan.shards))
    assert batch["input_ids"].shape[1] == 12
    pad = lambda x: np.pad(x, [(0, 0), (0, 16 - x.shape[1])]) if x.ndim == 2 else x
    lengths = []
    for batch in (batch, jax.tree.map(pad, batch), batch):  # bucket 12, the same rows padded to 16, 12 again
      lengths.append(batch["input_ids"].shape[1])
      split_state, split_metrics = steps.train(fresh(jax.random.key(0)), batch)
      fused_state, fused_metrics = steps.fused(fresh(jax.random.key(0)), batch)
      assert float(split_metrics["grad_norm"]) > 1e-4  # a real step
      # Equal up to float rounding: XLA fuses the gradient's last sums with the update only in one program.
      close = lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
      jax.tree.map(close, split_metrics, fused_metrics)
      jax.tree.map(close, split_state.as_dict(), fused_state.as_dict())
  assert lengths == [12, 16, 12] and steps.grad._cache_size() == 2 and steps.update._cache_size() == 1


@pytest.mark.parametrize("packing", [False, True])
def test_a_bucketed_or_packed_run_meets_only_programs_it_compiled_ahead(tmp_path, monkeypatch, packing):
  """Every gradient, update and predict call of a fine-tuning run runs a program compiled before the loop met
  it: the jitted functions behind them never compile one themselves. Packed, the gradient programs are of one or
  two row counts of max_seq_length tokens, and the evaluation one shape."""
  from jbert.train import programs
  made = []
  for name in ("compile_ahead", "compile_predict_ahead"):
    original = getattr(programs.Steps, name)
    monkeypatch.setattr(programs.Steps, name,
                        lambda self, *a, original=original: made.append(original(self, *a)) or made[-1])
  checkpoint = fd.tiny_checkpoint(tmp_path / "ckpt")
  rng = np.random.default_rng(0)

  def rows(n):  # pairs of 1 to 13 words a side: [CLS] a [SEP] b [SEP] spans buckets 8 to 32
    return [{"a": " ".join(f"w{j}" for j in rng.integers(5, 40, rng.integers(1, 14))),
             "b": " ".join(f"w{j}" for j in rng.integers(5, 40, rng.integers(1, 14))), "label": ("no", "yes")[i % 2]}
            for i in range(n)]
  overrides = fd.local_overrides(tmp_path / "data", n_train=0, n_eval=0, **{
      "task.train_file": str(fd.write_rows(tmp_path / "data" / "varied_train.csv", rows(64))),
      "task.eval_file": str(fd.write_rows(tmp_path / "data" / "varied_dev.csv", rows(24))),
      "data.max_seq_length": 32, "data.packing": packing})
  config = fd.finetune_config("local", init_from=str(checkpoint), total_steps=8, batch_size=8, **overrides)
  trainer.train_and_evaluate(config, str(tmp_path / "run"))
  train_steps, with_predict = made
  # pylint: disable=protected-access
  met = sorted(train_steps.grad._programs)
  if packing:  # 8 pairs of ~17 tokens a batch: 4 to 6 rows of 32
    assert 1 <= len(met) <= 2 and all(length == 32 and 3 <= rows <= 8 for rows, length in met), met
    assert len(with_predict.predict._programs) == 1
  else:
    assert len(met) > 2 and {length for _, length in met} <= {8, 12, 16, 24, 32} and {r for r, _ in met} == {8}
    assert len(with_predict.predict._programs) > 2, met
  for ahead in (with_predict.grad, with_predict.update, with_predict.predict):
    assert ahead._jitted._cache_size() == 0, ahead
