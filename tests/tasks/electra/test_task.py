"""ELECTRA pretraining (jbert/tasks/electra/task.py, jbert/model/electra_pretraining.py): the loss entries' values on a
hand-made batch, the shared embeddings and the stop-gradient, and configs/electra.py:tiny through run.py: losses
fall, the exports load in transformers with equal logits, and a run killed with kill -9 resumes with the losses of
an uninterrupted one."""
import json
import math
import pathlib
import signal
import subprocess
import sys
import time

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import shared_runs
from jbert.model import BertConfig
from jbert.model.electra_pretraining import (ElectraForPreTrainingWithGenerator, ElectraOutput, generator_config,
                                             generator_params)
from jbert.tasks.electra.task import ReplacedTokenDetection

REPO = pathlib.Path(__file__).resolve().parents[3]
TOTAL = 40


def _config(**changes):
  return BertConfig.from_preset("tiny", vocab_size=50, model_type="electra", embedding_size=64, use_pooler=False,
                                pooler_act="gelu", pooler_dropout=True, lm_head_act="gelu", **changes)


def test_loss_entries_have_their_known_values_on_a_hand_made_batch():
  task = ReplacedTokenDetection(max_predictions=2)
  gen = np.full((1, 2, 3), -5.0, np.float32)
  gen[0, 0, 1] = 5.0  # predicts token 1 at both masked positions
  gen[0, 1, 1] = 5.0
  # Tokens 0..4 real, 5 padding; replaced: 1 and 2; judged replaced (logit > 0): 2 and 3, and padding (ignored).
  disc = np.array([[-2.0, -2.0, 3.0, 1.0, -4.0, 9.0]], np.float32)
  replaced = np.array([[0, 1, 1, 0, 0, 0]], np.int32)
  outputs = ElectraOutput(jnp.asarray(gen), jnp.asarray(disc), jnp.asarray(replaced), jnp.zeros((1, 2), jnp.int32))
  batch = {"masked_lm_ids": jnp.array([[1, 2]]), "masked_lm_weights": jnp.array([[1, 1]]),
           "attention_mask": jnp.array([[1, 1, 1, 1, 1, 0]])}
  entries = {k: float(e.sum / e.denominator) for k, e in task.loss(outputs, batch).items()}
  assert entries["generator_mlm_accuracy"] == 0.5
  assert entries["discriminator_accuracy"] == pytest.approx(3 / 5)  # 0, 2, 4 right; 1 missed, 3 a false alarm
  assert entries["replaced_precision"] == pytest.approx(1 / 2)
  assert entries["replaced_recall"] == pytest.approx(1 / 2)
  lse = math.log(math.exp(5) + 2 * math.exp(-5))
  assert entries["generator_mlm_loss"] == pytest.approx(((lse - 5) + (lse + 5)) / 2, rel=1e-5)
  bce = [math.log1p(math.exp(-2)), math.log1p(math.exp(2)), math.log1p(math.exp(-3)), math.log1p(math.exp(1)),
         math.log1p(math.exp(-4))]
  assert entries["discriminator_loss"] == pytest.approx(sum(bce) / 5, rel=1e-5)
  assert task.objectives == {"generator_mlm_loss": 1.0, "discriminator_loss": 50.0}


def test_generator_shares_the_embeddings_samples_under_stop_gradient_and_labels_the_replacements():
  config = _config()
  gen_config = generator_config(config, 0.25)
  assert (gen_config.hidden_size, gen_config.num_attention_heads, gen_config.intermediate_size,
          gen_config.embedding_size) == (32, 1, 128, 64)
  model = ElectraForPreTrainingWithGenerator(config, gen_config)
  ids = jnp.array([[2, 10, 4, 12, 4, 3, 0, 0]])
  params = nn.meta.unbox(model.init(jax.random.key(0), ids)["params"])
  assert "embeddings" not in params["generator"]["bert"]  # one copy, the discriminator's
  assert set(generator_params(params)["bert"]) == {"embeddings", "embeddings_project", "encoder"}
  inputs = dict(attention_mask=(ids > 0).astype(jnp.int32), masked_lm_positions=jnp.array([[2, 4, 0]]),
                masked_lm_ids=jnp.array([[11, 13, 0]]), masked_lm_weights=jnp.array([[1, 1, 0]]))
  out = model.apply({"params": params}, ids, **inputs, rngs={"dropout": jax.random.key(3)})
  fake = np.asarray(ids).copy()
  fake[0, [2, 4]] = np.asarray(out.sampled_ids)[0, :2]
  original = np.array([[2, 10, 11, 12, 13, 3, 0, 0]])
  np.testing.assert_array_equal(out.replaced, ((fake != original) & (original > 0)).astype(np.int32))

  def grads(which):
    def f(p):
      o = model.apply({"params": p}, ids, **inputs, rngs={"dropout": jax.random.key(3)})
      return jnp.sum(o.generator_logits if which == "generator" else o.discriminator_logits)
    return jax.grad(f)(params)
  norm = lambda tree: float(sum(jnp.sum(jnp.abs(x)) for x in jax.tree.leaves(tree)))
  from_generator, from_discriminator = grads("generator"), grads("discriminator")
  assert norm(from_generator["discriminator"]["bert"]["embeddings"]["word_embeddings"]) > 0  # shared tables
  assert norm(from_generator["discriminator"]["discriminator"]) == 0
  assert norm(from_discriminator["generator"]) == 0  # the samples are not differentiated through


def command(workdir):
  return [sys.executable, "run.py", "--config=configs/electra.py:tiny", f"--workdir={workdir}",
          "--config.batch_size=8", f"--config.total_steps={TOTAL}", "--config.log_every_steps=1",
          "--config.checkpoint_every_steps=4", f"--config.eval_every_steps={TOTAL}", "--config.eval_batches=2",
          "--config.data.max_seq_length=32", "--config.optim.warmup_steps=5"]


def _metrics(workdir):
  return [json.loads(l) for l in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]


def _losses(workdir):
  return {l["step"]: l["train/loss"] for l in _metrics(workdir) if "train/loss" in l}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  def build(workdir):
    subprocess.run(command(workdir), cwd=REPO, check=True, capture_output=True, timeout=900)
    return str(workdir)
  return pathlib.Path(shared_runs.once(tmp_path_factory, "electra_tiny", build))


def test_tiny_losses_fall_metrics_are_logged_and_exports_load_in_transformers(uninterrupted):
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from jbert import weights  # pylint: disable=import-outside-toplevel
  from jbert.model import BertForMaskedLM  # pylint: disable=import-outside-toplevel
  from jbert.model.discriminator import BertForReplacedTokenDetection  # pylint: disable=import-outside-toplevel
  rows = _metrics(uninterrupted)
  train = [r for r in rows if "train/loss" in r]
  first, last = train[:5], train[-5:]
  for key in ("train/generator_mlm_loss", "train/discriminator_loss", "train/loss"):
    assert np.mean([r[key] for r in last]) < 0.9 * np.mean([r[key] for r in first]), key
  for key in ("generator_mlm_accuracy", "discriminator_accuracy", "replaced_precision", "replaced_recall"):
    assert f"train/{key}" in train[-1] and any(f"eval/{key}" in r for r in rows), key
  ids = np.array([[2, 10, 11, 12, 13, 3]])
  for folder, cls, hf_cls in [(uninterrupted / "export", BertForReplacedTokenDetection,
                               transformers.ElectraForPreTraining),
                              (uninterrupted / "export_generator", BertForMaskedLM,
                               transformers.ElectraForMaskedLM)]:
    hf, info = hf_cls.from_pretrained(folder, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], (folder, info)
    config, params = weights.load_pretrained(str(folder), cls)[:2]
    out = cls(config).apply({"params": params}, jnp.asarray(ids))
    ours = out.logits if cls is BertForReplacedTokenDetection else out.mlm_logits
    with torch.no_grad():
      theirs = hf.eval()(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(np.asarray(ours), theirs, atol=1e-4)
  # The exported generator's embeddings are the discriminator's.
  disc = weights.load_pretrained(str(uninterrupted / "export"), BertForReplacedTokenDetection)[1]
  gen = weights.load_pretrained(str(uninterrupted / "export_generator"), BertForMaskedLM)[1]
  assert not (uninterrupted / "export" / "generator").exists()  # the export is the discriminator's folder only
  # init_from=WORKDIR/export continues both models: the generator is read from WORKDIR/export_generator.
  config = weights.describe(str(uninterrupted / "export")).config
  task = ReplacedTokenDetection()
  fresh = lambda: task.model(config).init(jax.random.key(0), jnp.ones((1, 8), jnp.int32))["params"]
  started = task.load_init(str(uninterrupted / "export"), config, seed=0, fresh=fresh)
  np.testing.assert_array_equal(started["generator"]["bert"]["encoder"]["layer_0"]["mlp"]["wi"]["kernel"],
                                gen["bert"]["encoder"]["layer_0"]["mlp"]["wi"]["kernel"])
  np.testing.assert_array_equal(disc["bert"]["embeddings"]["word_embeddings"]["embedding"],
                                gen["bert"]["embeddings"]["word_embeddings"]["embedding"])


def test_kill_9_then_the_same_command_resumes_with_the_uninterrupted_losses(tmp_path, uninterrupted):
  proc = subprocess.Popen(command(tmp_path), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  start = time.time()
  while not (tmp_path / "checkpoints" / "8").exists():
    assert proc.poll() is None, "the run ended before it could be killed"
    assert time.time() - start < 600
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL
  assert max(_losses(tmp_path)) < TOTAL
  rerun = subprocess.run(command(tmp_path), cwd=REPO, capture_output=True, text=True, timeout=900)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert _losses(tmp_path) == _losses(uninterrupted)
