"""`train_and_evaluate` end to end on the tiny config, and its refusals before any compilation."""
import json
import pathlib
import re
import subprocess
import sys

import jax
import pytest

from jbert.runtime import metrics as metrics_lib
from jbert.train import trainer as train
from jbert.train import workdir_record
from jbert.checkpoint.manager import CheckpointError

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from configs import tiny  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

CONTRACT_KEYS = {"train/loss", "train/mlm_accuracy", "train/nsp_accuracy", "train/learning_rate",
                 "train/tokens_per_sec"}


def small_config(**overrides):
  config = tiny.get_config()
  config.batch_size = 16
  config.total_steps = 12
  config.log_every_steps = 4
  config.eval_every_steps = 12
  config.eval_batches = 2
  config.checkpoint_every_steps = 6
  config.data.max_seq_length = 32
  config.data.max_predictions_per_seq = 5
  config.update_from_flattened_dict(overrides)  # dotted keys; an unknown one raises
  return config


def read_metrics(workdir):
  return [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def _console(caplog, prefix):
  return [r.getMessage() for r in caplog.records if r.getMessage().startswith(prefix)]


def test_trains_logs_evaluates_checkpoints_and_resumes(tmp_path, monkeypatch, caplog):
  # The clock asks for a console line at every step: the console gets them, metrics.jsonl keeps its steps.
  monkeypatch.setattr(metrics_lib.Progress, "due", lambda self: True)
  workdir = str(tmp_path / "run")
  with caplog.at_level("INFO", logger="jbert"):
    last = train.train_and_evaluate(small_config(), workdir)
  compiled = _console(caplog, "step 1 done in ")
  assert len(compiled) == 1 and re.fullmatch(
      r"step 1 done in [\d.]+ s \(\d+ XLA programs? in [\d.]+ s(, \d+ of them from the compile cache)?\); training to "
      r"step 12", compiled[0]), compiled
  shown = [int(re.match(r"step (\d+)/12 \| loss ", m).group(1)) for m in _console(caplog, "step ") if "/12 |" in m]
  assert shown == list(range(1, 13))
  lines = read_metrics(workdir)
  train_lines = [l for l in lines if "train/loss" in l]
  assert [l["step"] for l in train_lines] == [4, 8, 12]
  assert CONTRACT_KEYS <= set(train_lines[0])
  assert all(l["train/tokens_per_sec"] > 0 for l in train_lines)
  assert train_lines[-1]["train/loss"] < train_lines[0]["train/loss"]
  evals = [l for l in lines if "eval/mlm_accuracy" in l]
  assert [l["step"] for l in evals] == [12] and 0 <= evals[0]["eval/nsp_accuracy"] <= 1
  assert last["train/loss"] == train_lines[-1]["train/loss"]
  assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["12", "6"]
  assert list((tmp_path / "run" / "tensorboard").iterdir())

  # The same call with more steps resumes at 12 and continues the log without repeating steps.
  caplog.clear()
  with caplog.at_level("INFO", logger="jbert"):
    train.train_and_evaluate(small_config(total_steps=16), workdir)
  assert len(_console(caplog, "step 13 done in ")) == 1
  assert [m.split(" |")[0] for m in _console(caplog, "step ") if " | " in m] == [f"step {s}/16" for s in range(13, 17)]
  steps = [l["step"] for l in read_metrics(workdir) if "train/loss" in l]
  assert steps == [4, 8, 12, 16]


@pytest.mark.devices(8)
@pytest.mark.parametrize("overrides, message", [
    ({"mesh.data": 3}, r"3×1×1 = 3 does not match the 8 available devices"),
    ({"batch_size": 12}, r"batch_size=12 \(global\) is not divisible by the data-parallel size"),
    ({"mesh.data": 1, "mesh.tensor": 8}, r"num_attention_heads=2 is not divisible by mesh.tensor=8"),
    ({"optim.grad_accum_steps": 3}, r"per-device batch 2 is not divisible by optim.grad_accum_steps=3"),
    ({"data.max_seq_length": 256}, r"max_seq_length=256 exceeds the model.s 128 positions \(max_position_embeddings=128\)"),
])
def test_bad_configs_fail_before_compiling(tmp_path, overrides, message, monkeypatch):
  compiled = []
  monkeypatch.setattr(jax, "jit", lambda *a, **k: compiled.append(a) or pytest.fail("compiled"))
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(small_config(**overrides), str(tmp_path / "w"))
  assert not compiled


def test_unwritable_workdir_fails_clearly(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises((CheckpointError, OSError), match="file/w"):
    train.train_and_evaluate(small_config(), str(blocker / "w"))


def test_unknown_config_key_is_refused_by_run_py(tmp_path):
  result = subprocess.run(
      [sys.executable, "run.py", "--config=configs/tiny.py", f"--workdir={tmp_path}", "--config.batchsize=8"],
      cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode != 0
  assert "invalid config override" in result.stderr and 'Did you mean "batch_size"' in result.stderr
  assert "Traceback" not in result.stderr
  assert not (tmp_path / "checkpoints").exists()


def test_non_finite_step_stops_and_the_named_checkpoint_is_good(tmp_path, monkeypatch):
  from jbert.train import step as step_lib
  import jax.numpy as jnp
  make_steps = step_lib.make_steps

  def poisoned(*args, **kwargs):
    fns = make_steps(*args, **kwargs)

    def with_nan(step_fn):
      def poisoned_step(state, *rest):
        new_state, metrics = step_fn(state, *rest)
        diverged = state.step >= 8  # the 9th step diverges
        metrics["loss"] = jnp.where(diverged, jnp.nan, metrics["loss"])
        metrics["nonfinite"] = jnp.where(diverged, 1, metrics["nonfinite"])
        return new_state, metrics
      return poisoned_step
    # The fused step (one batch shape) or the update of a split one (length buckets) reports the divergence.
    return fns._replace(train=with_nan(fns.train), update=with_nan(fns.update))

  monkeypatch.setattr(step_lib, "make_steps", poisoned)
  workdir = str(tmp_path / "run")
  with pytest.raises(train.TrainingError, match=r"non-finite training state at step 9 \(loss nan.*The last good "
                                                r"checkpoint is step 6"):
    train.train_and_evaluate(small_config(log_every_steps=1), workdir)
  assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["6"]
  assert max(l["step"] for l in read_metrics(workdir)) == 8  # the diverged step was never logged
  monkeypatch.setattr(step_lib, "make_steps", make_steps)
  train.train_and_evaluate(small_config(log_every_steps=1), workdir)  # resumes from the good step 6
  steps = [l["step"] for l in read_metrics(workdir) if "train/loss" in l]
  assert steps == list(range(1, 13))


def test_an_update_that_overflows_the_weights_is_never_saved(tmp_path):
  """lr 1e39: step 1's loss is finite but its update makes the weights inf; nothing of it may be saved."""
  workdir = str(tmp_path / "run")
  blowup = {"optim.learning_rate": 1e39, "optim.warmup_steps": 0, "checkpoint_every_steps": 1}
  with pytest.raises(train.TrainingError, match=r"non-finite training state at step 1 .*No checkpoint was written "
                                                r"before it"):
    train.train_and_evaluate(small_config(**blowup), workdir)
  assert not list((tmp_path / "run" / "checkpoints").iterdir())
  last = train.train_and_evaluate(small_config(checkpoint_every_steps=1), workdir)  # sane settings: trains
  assert last["train/loss"] < 10


def test_checkpoint_of_another_model_size_is_refused(tmp_path):
  workdir = str(tmp_path / "run")
  train.train_and_evaluate(small_config(total_steps=6), workdir)
  wider = {"model.intermediate_size": 256}
  with pytest.raises(workdir_record.ConfigDriftError, match=r"model.intermediate_size None -> 256\. "):
    train.train_and_evaluate(small_config(total_steps=8, **wider), workdir)
  # Allowing the change does not make the checkpoint's weights fit the wider model.
  with pytest.raises(CheckpointError, match=r"intermediate_size|mlp/wi/kernel: checkpoint \(128, 512\) vs run "
                                            r"\(128, 256\)"):
    train.train_and_evaluate(small_config(total_steps=8, allow_changes="model", **wider), workdir)


def test_a_failed_periodic_save_is_reported_and_training_goes_on(tmp_path, monkeypatch, caplog):
  from jbert.checkpoint import manager as ckpt_lib
  real_save = ckpt_lib.Checkpointer.save
  calls = []

  def flaky(self, step, *args, **kwargs):
    calls.append(step)
    if step == 6:
      raise ckpt_lib.CheckpointError("saving the checkpoint of step 6 failed: disk full")
    return real_save(self, step, *args, **kwargs)

  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", flaky)
  with caplog.at_level("ERROR", logger="jbert"):
    train.train_and_evaluate(small_config(), str(tmp_path / "run"))
  assert calls == [6, 12]
  assert "step 6 failed: disk full" in caplog.text
  assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["12"]


def test_init_from_another_run_takes_its_parameters_not_its_optimiser(tmp_path):
  first = str(tmp_path / "phase1")
  fast = {"optim.warmup_steps": 1, "optim.learning_rate": 3e-3}
  train.train_and_evaluate(small_config(total_steps=20, log_every_steps=1, **fast), first)
  trained_loss = [l["train/loss"] for l in read_metrics(first) if "train/loss" in l]

  second = str(tmp_path / "phase2")
  train.train_and_evaluate(small_config(total_steps=2, log_every_steps=1, init_from=first), second)
  fresh = str(tmp_path / "fresh")
  train.train_and_evaluate(small_config(total_steps=2, log_every_steps=1), fresh)
  started = [l for l in read_metrics(second) if "train/loss" in l]
  scratch = [l for l in read_metrics(fresh) if "train/loss" in l]
  assert started[0]["step"] == 1  # a new run: step 0, fresh optimiser and warmup
  assert started[0]["train/learning_rate"] == scratch[0]["train/learning_rate"]
  assert started[0]["train/loss"] < scratch[0]["train/loss"] - 0.2
  assert abs(started[0]["train/loss"] - trained_loss[-1]) < abs(scratch[0]["train/loss"] - trained_loss[-1])

  with pytest.raises(ValueError, match=r"another architecture \(intermediate_size: checkpoint 512 vs "
                                       r"config 256\)"):
    train.train_and_evaluate(small_config(init_from=first, **{"model.intermediate_size": 256}),
                             str(tmp_path / "bad"))


def test_zero_cadences_mean_only_the_last_step_and_negative_ones_are_refused(tmp_path):
  workdir = tmp_path / "run"
  train.train_and_evaluate(small_config(total_steps=4, log_every_steps=0, checkpoint_every_steps=0,
                                        eval_every_steps=0), str(workdir))
  assert [l["step"] for l in read_metrics(workdir)] == [4]  # logged (and evaluated) once, at the end
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["4"]
  with pytest.raises(ValueError, match=r"log_every_steps=-1 must be >= 0 \(0: only at the last step\)"):
    train.train_and_evaluate(small_config(log_every_steps=-1), str(tmp_path / "bad"))
  assert not (tmp_path / "bad").exists()


def test_an_invalid_learning_rate_leaves_no_workdir(tmp_path):
  with pytest.raises(ValueError, match=r"optim.learning_rate=-1.0"):
    train.train_and_evaluate(small_config(**{"optim.learning_rate": -1.0}), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_init_from_takes_the_architecture_and_tokenizer_from_the_checkpoint(tmp_path):
  first = tmp_path / "tiny"
  train.train_and_evaluate(small_config(total_steps=2), str(first))
  assert (first / "tokenizer" / "vocab.txt").exists()  # the run carries its tokenizer
  # A base-preset config with no model keys copied: the checkpoint's tiny architecture is used.
  config = small_config(total_steps=2, init_from=str(first), **{"model.preset": "base",
                                                               "model.max_position_embeddings": None})
  train.train_and_evaluate(config, str(tmp_path / "continued"))
  assert jbert_describe(tmp_path / "continued").config.hidden_size == 128


def jbert_describe(path):
  import jbert  # pylint: disable=import-outside-toplevel
  return jbert.describe(path)


def test_a_model_narrower_than_bert_base_at_bert_bases_fine_tuning_rate_gets_a_warning():
  import types  # pylint: disable=import-outside-toplevel
  from jbert.model import BertConfig  # pylint: disable=import-outside-toplevel
  from jbert.train import plan  # pylint: disable=import-outside-toplevel
  from configs import finetune  # pylint: disable=import-outside-toplevel
  config = finetune.get_config("sst2")  # the paper's 2e-5
  small = BertConfig.from_preset("tiny", hidden_size=128, num_hidden_layers=2)
  fine_tuning, pretraining = types.SimpleNamespace(exports=True), types.SimpleNamespace(exports=False)
  assert plan.learning_rate_note(config, fine_tuning, small) == (
      "optim.learning_rate=2e-05 is BERT-base's fine-tuning rate, and this model is 128 wide with 2 layers: a small "
      "model can learn little at it and predict the majority class (Google's small BERTs were fine-tuned at 3e-5 to "
      "3e-4); if the training accuracy stays at the majority class's share, raise --config.optim.learning_rate (e.g. "
      "1e-4 to 5e-4).")
  assert plan.learning_rate_note(config, fine_tuning, BertConfig.from_preset("base")) is None  # BERT-base's own
  assert plan.learning_rate_note(config, pretraining, small) is None
  with config.unlocked():
    config.optim.learning_rate = 5e-4
  assert plan.learning_rate_note(config, fine_tuning, small) is None
