"""Train/eval steps: loss values, learning on a repeated batch, gradient accumulation."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import flax.linen as nn

from conftest import make_pretrain_batch
from jbert.train import step as step_lib
from jbert.model import BertForPreTraining
from jbert.tasks import Pretraining

TASK = Pretraining(nsp=True, max_predictions=4)


def _state(config, tx, seed=0):
  model = BertForPreTraining(config)
  return model, nn.meta.unbox(step_lib.init_state(model, tx, jax.random.key(seed), (1, 8)))


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_losses_match_a_by_hand_computation(tiny_bert_config):
  model, state = _state(tiny_bert_config, optax.sgd(0.0))
  batch = make_pretrain_batch(0)
  rows = step_lib.predict_step(state.params, batch, model=model, task=TASK)
  out = model.apply({"params": state.params}, batch["input_ids"], token_type_ids=batch["token_type_ids"],
                    attention_mask=batch["attention_mask"], masked_lm_positions=batch["masked_lm_positions"])
  logp = _log_softmax(out.mlm_logits)
  nll = -np.take_along_axis(logp, batch["masked_lm_ids"][..., None], -1)[..., 0]
  w = batch["masked_lm_weights"]
  nsp_logp = _log_softmax(out.nsp_logits)
  nsp_nll = -nsp_logp[np.arange(8), batch["next_sentence_labels"]]
  metrics = TASK.evaluate(None, jax.device_get(rows))
  assert {k: v.shape for k, v in rows.items()} == {k: (8,) for k in rows}  # one value per row
  np.testing.assert_allclose(metrics["mlm_loss"], (nll * w).sum() / w.sum(), rtol=1e-6)
  np.testing.assert_allclose(metrics["nsp_loss"], nsp_nll.mean(), rtol=1e-5)
  np.testing.assert_allclose(metrics["loss"], metrics["mlm_loss"] + metrics["nsp_loss"], rtol=1e-6)
  hits = (np.asarray(out.mlm_logits).argmax(-1) == batch["masked_lm_ids"]) * w
  np.testing.assert_allclose(metrics["mlm_accuracy"], hits.sum() / w.sum(), rtol=1e-6)


def test_unweighted_positions_do_not_contribute(tiny_bert_config):
  model, state = _state(tiny_bert_config, optax.sgd(0.0))
  batch = make_pretrain_batch(1)
  other = dict(batch)
  other["masked_lm_ids"] = np.where(batch["masked_lm_weights"] == 1, batch["masked_lm_ids"], 7).astype(np.int32)
  a = step_lib.predict_step(state.params, batch, model=model, task=TASK)
  b = step_lib.predict_step(state.params, other, model=model, task=TASK)
  np.testing.assert_allclose(a["mlm_loss"], b["mlm_loss"], rtol=1e-6)


def test_loss_falls_on_a_repeated_batch(tiny_bert_config):
  tx = optax.adamw(3e-3)
  model, state = _state(tiny_bert_config, tx)
  step = jax.jit(lambda s, b: step_lib.train_step(s, b, model=model, task=TASK, tx=tx, schedule=lambda _: 3e-3))
  batch = make_pretrain_batch(2)
  losses = []
  for _ in range(40):
    state, metrics = step(state, batch)
    losses.append(float(metrics["loss"]))
  assert losses[-1] < 0.3 * losses[0], losses
  assert float(metrics["mlm_accuracy"]) > 0.9
  assert int(state.step) == 40


def test_gradient_accumulation_equals_one_large_batch(tiny_bert_config):
  config = dataclasses.replace(tiny_bert_config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  tx = optax.sgd(1.0)  # params_after = params - grads, so parameters compare the gradients themselves
  model, state = _state(config, tx)
  batch = make_pretrain_batch(3, batch=8)
  results = {}
  for k in (1, 4):
    fn = jax.jit(lambda s, b, k=k: step_lib.train_step(s, b, model=model, task=TASK, tx=tx, schedule=lambda _: 1.0,
                                                        grad_accum_steps=k))
    results[k] = fn(state, batch)
  (s1, m1), (s4, m4) = results[1], results[4]
  for key in ("loss", "mlm_accuracy", "nsp_accuracy", "grad_norm"):
    np.testing.assert_allclose(m4[key], m1[key], rtol=1e-5, atol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), s4.params, s1.params)
  delta = jax.tree.leaves(jax.tree.map(lambda a, b: jnp.abs(a - b).max(), s1.params, state.params))
  assert max(float(d) for d in delta) > 1e-3  # the step did change the parameters


def test_dropout_key_depends_on_step_only(tiny_bert_config):
  tx = optax.sgd(0.0)
  model, state = _state(tiny_bert_config, tx)
  step = jax.jit(lambda s, b: step_lib.train_step(s, b, model=model, task=TASK, tx=tx, schedule=lambda _: 0.0))
  batch = make_pretrain_batch(4)
  _, first = step(state, batch)
  _, again = step(state, batch)
  _, later = step(state.replace(step=jnp.asarray(5, jnp.int32)), batch)
  assert float(first["loss"]) == float(again["loss"])
  assert float(first["loss"]) != float(later["loss"])
