"""Schedules, BERT's AdamWeightDecay, the weight-decay mask, clipping and LAMB's trust ratio."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jbert.train import optim
from jbert.model import BertConfig, BertForPreTraining, init_params


def _cfg(**overrides):
  cfg = optim.default_config()
  cfg.update(overrides)
  return cfg


def _paths(tree, want):
  flat = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(str(k.key) for k in path if isinstance(k, jax.tree_util.DictKey))
          for path, value in flat if bool(value) == want}


# ---------------------------------------------------------------------------------------------------------
# Schedules.
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind, expected", [
    # step:   0    50   100  550  1000  1200
    ("linear", [0.0, 1.0, 2.0, 1.0, 0.0, 0.0]),
    # bert: decay counted from step 0, so warmup ends at 2 * (1 - 100/1000) = 1.8, not at the peak.
    ("bert", [0.0, 1.0, 1.8, 0.9, 0.0, 0.0]),
])
def test_schedule_values(kind, expected):
  schedule = optim.make_schedule(_cfg(learning_rate=2.0, warmup_steps=100, schedule=kind), total_steps=1000)
  got = [float(schedule(s)) for s in (0, 50, 100, 550, 1000, 1200)]
  np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)


def test_schedule_end_learning_rate_and_no_warmup():
  schedule = optim.make_schedule(_cfg(learning_rate=1.0, end_learning_rate=0.2, warmup_steps=0,
                                      schedule="bert"), total_steps=10)
  got = [float(schedule(s)) for s in (0, 5, 10, 20)]
  np.testing.assert_allclose(got, [1.0, 0.6, 0.2, 0.2], rtol=1e-6)


def test_schedule_jits_with_traced_int_step():
  schedule = optim.make_schedule(_cfg(learning_rate=1e-4, warmup_steps=10_000), total_steps=1_000_000)
  np.testing.assert_allclose(jax.jit(schedule)(jnp.int32(5_000)), 5e-5, rtol=1e-6)


@pytest.mark.parametrize("overrides, total, match", [
    ({"name": "sgd"}, 10, "optim.name='sgd'"),
    ({"schedule": "cosine"}, 10, "optim.schedule='cosine'"),
    ({"warmup_steps": -1}, 10, "warmup_steps=-1"),
    ({"grad_clip_norm": -1.0}, 10, "grad_clip_norm=-1.0"),
    ({}, 0, "total_steps=0"),
    ({"warmup_steps": 0, "learning_rate": 0.0}, 10, "learning_rate=0.0"),
])
def test_bad_config_is_named(overrides, total, match):
  with pytest.raises(ValueError, match=match):
    optim.make_optimizer(_cfg(**overrides), total)


# ---------------------------------------------------------------------------------------------------------
# BERT's AdamWeightDecay.
# ---------------------------------------------------------------------------------------------------------


def _reference_adam_weight_decay(params, grads_seq, lrs, *, b1, b2, eps, wd, decayed):
  """google-research/bert optimization.py AdamWeightDecayOptimizer.apply_gradients, in numpy."""
  params = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(p) for k, p in params.items()}
  for grads, lr in zip(grads_seq, lrs):
    for k in params:
      m[k] = b1 * m[k] + (1.0 - b1) * grads[k]
      v[k] = b2 * v[k] + (1.0 - b2) * np.square(grads[k])
      update = m[k] / (np.sqrt(v[k]) + eps)
      if decayed[k]:
        update += wd * params[k]
      params[k] = params[k] - lr * update
  return params


def test_bert_adam_weight_decay_two_steps_by_hand():
  cfg = _cfg(learning_rate=0.1, warmup_steps=0, schedule="bert", weight_decay=0.01, grad_clip_norm=0.0,
             bias_correction=False)
  tx = optim.make_optimizer(cfg, total_steps=10)  # lr 0.1 at step 0, 0.09 at step 1
  params = {"dense": {"kernel": jnp.array([1.0, -2.0]), "bias": jnp.array([0.5])}}
  grads = [{"dense": {"kernel": jnp.array([0.5, 0.1]), "bias": jnp.array([1.0])}},
           {"dense": {"kernel": jnp.array([-0.25, 0.1]), "bias": jnp.array([1.0])}}]
  state = tx.init(params)
  for g in grads:
    updates, state = tx.update(g, state, params)
    params = optax.apply_updates(params, updates)

  # Kernel, element 0 by hand. Step 1: m = 0.05, v = 2.5e-4, update = 0.05 / (0.0158114 + 1e-6) + 0.01 * 1.
  m1, v1 = 0.05, 0.001 * 0.25
  p1 = 1.0 - 0.1 * (m1 / (np.sqrt(v1) + 1e-6) + 0.01 * 1.0)
  m2, v2 = 0.9 * m1 + 0.1 * -0.25, 0.999 * v1 + 0.001 * 0.0625
  p2 = p1 - 0.09 * (m2 / (np.sqrt(v2) + 1e-6) + 0.01 * p1)
  np.testing.assert_allclose(params["dense"]["kernel"][0], p2, rtol=1e-6)

  ref = _reference_adam_weight_decay(
      {"kernel": [1.0, -2.0], "bias": [0.5]},
      [{k: np.asarray(v) for k, v in g["dense"].items()} for g in grads], [0.1, 0.09],
      b1=0.9, b2=0.999, eps=1e-6, wd=0.01, decayed={"kernel": True, "bias": False})
  np.testing.assert_allclose(params["dense"]["kernel"], ref["kernel"], rtol=1e-6)
  np.testing.assert_allclose(params["dense"]["bias"], ref["bias"], rtol=1e-6)


def test_bias_corrected_variant_matches_optax_adamw():
  cfg = _cfg(learning_rate=0.1, warmup_steps=0, schedule="bert", grad_clip_norm=None)
  tx = optim.make_optimizer(cfg, total_steps=10)
  ref_tx = optax.adamw(optim.make_schedule(cfg, 10), b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01,
                       mask=optim.decay_mask)
  params = {"kernel": jnp.array([1.0, -2.0]), "bias": jnp.array([0.5])}
  grads = {"kernel": jnp.array([0.3, -0.7]), "bias": jnp.array([2.0])}
  state, ref_state, ref_params = tx.init(params), ref_tx.init(params), params
  for _ in range(3):
    updates, state = tx.update(grads, state, params)
    params = optax.apply_updates(params, updates)
    ref_updates, ref_state = ref_tx.update(grads, ref_state, ref_params)
    ref_params = optax.apply_updates(ref_params, ref_updates)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), params, ref_params)


# ---------------------------------------------------------------------------------------------------------
# Decay mask.
# ---------------------------------------------------------------------------------------------------------


def _expected_excluded(layer_prefixes):
  per_layer = [f"attention/{m}/bias" for m in ("query", "key", "value", "out")] + [
      "attention_norm/scale", "attention_norm/bias", "mlp/wi/bias", "mlp/wo/bias",
      "output_norm/scale", "output_norm/bias"]
  return ({"bert/embeddings/norm/scale", "bert/embeddings/norm/bias", "bert/pooler/bias",
           "mlm/transform/bias", "mlm/norm/scale", "mlm/norm/bias", "mlm/output_bias", "nsp/bias"}
          | {f"bert/encoder/{layer}/{p}" for layer in layer_prefixes for p in per_layer})


@pytest.mark.parametrize("scan_layers", [False, True])
def test_decay_mask_on_the_pretraining_tree(scan_layers):
  config = BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=16, scan_layers=scan_layers)
  boxed = jax.eval_shape(lambda: init_params(BertForPreTraining(config), jax.random.key(0)))
  layers = ["layers"] if scan_layers else ["layer_0", "layer_1"]
  for params in (boxed, nn.meta.unbox(boxed)):
    mask = optim.decay_mask(params)
    assert jax.tree.structure(mask) == jax.tree.structure(jax.tree.map(lambda _: True, params))
    assert _paths(mask, want=False) == _expected_excluded(layers)
    decayed = _paths(mask, want=True)
    assert {p.rsplit("/", 1)[1] for p in decayed} == {"kernel", "embedding"}
    assert len(decayed) == 3 + 6 * len(layers) + 3  # embeddings, 6 kernels per layer, pooler/transform/nsp


def test_decay_mask_on_hand_made_paths():
  tree = {"bert": {"embeddings": {"word_embeddings": {"embedding": 0}, "norm": {"scale": 0, "bias": 0}},
                   "encoder": {"layer_0": {"attention_norm": {"scale": 0}, "mlp": {"wi": {"kernel": 0}}}}},
          "classifier": {"kernel": 0, "bias": 0}, "LayerNorm": {"gamma": 0}, "mlm": {"output_bias": 0}}
  assert _paths(optim.decay_mask(tree), want=True) == {
      "bert/embeddings/word_embeddings/embedding", "bert/encoder/layer_0/mlp/wi/kernel", "classifier/kernel"}


def test_decay_mask_without_embeddings_on_a_modernbert_masked_lm():
  """ModernBERT's mask (decay_embeddings=False): the kernels only; no norm, bias or table (its tied decoder)."""
  from jbert.model import BertForMaskedLM  # pylint: disable=import-outside-toplevel
  config = BertConfig.from_dict({"model_type": "modernbert", "vocab_size": 64, "hidden_size": 32,
                                 "num_hidden_layers": 3, "num_attention_heads": 2, "intermediate_size": 48})
  params = jax.eval_shape(lambda: init_params(BertForMaskedLM(config), jax.random.key(0)))
  decayed = _paths(optim.decay_mask(params, embeddings=False), want=True)
  assert decayed == {f"bert/encoder/layer_{i}/{m}/kernel" for i in range(3)
                     for m in ("attention/query", "attention/key", "attention/value", "attention/out", "mlp/wi",
                               "mlp/wo")} | {"mlm/transform/kernel"}
  assert "bert/embeddings/word_embeddings/embedding" in _paths(optim.decay_mask(params), want=True)


def test_optimizer_state_mirrors_boxed_params():
  config = BertConfig.from_preset("tiny", vocab_size=64, max_position_embeddings=16, scan_layers=True)
  boxed = jax.eval_shape(lambda: init_params(BertForPreTraining(config), jax.random.key(0)))
  tx = optim.make_optimizer(_cfg(name="lamb"), total_steps=100)
  state = jax.eval_shape(tx.init, boxed)
  mu = optax.tree_utils.tree_get(state, "mu")
  assert nn.get_partition_spec(mu) == nn.get_partition_spec(boxed)


# ---------------------------------------------------------------------------------------------------------
# Clipping and LAMB.
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("clip, scale", [(1.0, 0.1), (0.0, 1.0), (20.0, 1.0)])
def test_clip_by_global_norm(clip, scale):
  tx = optim.make_optimizer(_cfg(grad_clip_norm=clip, warmup_steps=0), total_steps=10)
  params = {"a": jnp.zeros(2), "b": jnp.zeros(1)}
  grads = {"a": jnp.array([6.0, 0.0]), "b": jnp.array([8.0])}  # global norm 10
  _, state = tx.update(grads, tx.init(params), params)
  mu = optax.tree_utils.tree_get(state, "mu")  # (1 - b1) * the gradient Adam saw
  np.testing.assert_allclose(mu["a"], 0.1 * scale * np.array([6.0, 0.0]), rtol=1e-6)
  np.testing.assert_allclose(mu["b"], 0.1 * scale * np.array([8.0]), rtol=1e-6)


@pytest.mark.parametrize("max_norm", [0.5, 1.0, 1e3])
def test_clip_by_global_norm_agrees_with_optax(max_norm):
  rng = np.random.default_rng(0)
  grads = {"w": jnp.asarray(rng.normal(size=(64, 32)), jnp.float32),
           "b": jnp.asarray(rng.normal(size=7), jnp.float32)}
  ours, _ = optim.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
  ref, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
  for k in grads:
    np.testing.assert_allclose(ours[k], ref[k], rtol=2e-7, atol=0)
  np.testing.assert_allclose(float(optax.tree.norm(ours)), min(max_norm, float(optax.tree.norm(grads))), rtol=1e-6)


def test_clip_by_global_norm_of_zero_gradients_is_zero():
  zeros = {"w": jnp.zeros((3, 2)), "b": jnp.zeros(2)}
  clipped, state = optim.clip_by_global_norm(1.0).update(zeros, optax.EmptyState())
  assert isinstance(state, optax.EmptyState)
  for leaf in jax.tree.leaves(clipped):
    np.testing.assert_array_equal(leaf, 0.0)


def test_lamb_trust_ratio_on_kernels_only():
  lr, wd, eps = 0.01, 0.01, 1e-6
  tx = optim.make_optimizer(_cfg(name="lamb", learning_rate=lr, warmup_steps=0, weight_decay=wd,
                                 grad_clip_norm=0.0), total_steps=10)
  params = {"kernel": jnp.array([3.0, 4.0]), "bias": jnp.array([0.5])}
  grads = {"kernel": jnp.array([1.0, -2.0]), "bias": jnp.array([2.0])}
  updates, _ = tx.update(grads, tx.init(params), params)
  # Step 1 with bias correction: Adam direction g / (|g| + eps).
  direction = np.array([1.0, -2.0]) / (np.array([1.0, 2.0]) + eps) + wd * np.array([3.0, 4.0])
  ratio = 5.0 / np.linalg.norm(direction)  # ||param|| / ||update||
  np.testing.assert_allclose(updates["kernel"], -lr * ratio * direction, rtol=1e-6)
  np.testing.assert_allclose(updates["bias"], [-lr * 2.0 / (2.0 + eps)], rtol=1e-5)  # no decay, no ratio
