"""scan vs unrolled layers, rematerialisation, attention implementations and bf16 compute."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jbert.model as jm

CONFIG = jm.BertConfig.from_preset("tiny", hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=48, vocab_size=50, max_position_embeddings=16)
IDS = np.random.default_rng(0).integers(0, 50, (2, 10)).astype(np.int32)
TYPES = np.repeat([[0] * 5 + [1] * 5], 2, axis=0).astype(np.int32)
MASK = np.array([[1] * 10, [1] * 7 + [0] * 3], np.int32)
POSITIONS = np.array([[1, 4, 8], [0, 2, 6]], np.int32)


def _params(config, seed=0):
  return nn.meta.unbox(jm.init_params(jm.BertForPreTraining(config), jax.random.key(seed)))


@functools.lru_cache(maxsize=None)
def _compiled(config, deterministic):
  model = jm.BertForPreTraining(config)

  @jax.jit
  def run(params, rng):
    def loss(params):
      out = model.apply({"params": params}, IDS, TYPES, MASK, deterministic=deterministic,
                        masked_lm_positions=POSITIONS, rngs={"dropout": rng})
      return jnp.sum(jnp.sin(out.mlm_logits)) + jnp.sum(out.nsp_logits ** 2), out
    return jax.grad(loss, has_aux=True)(params)

  return run


def _forward_and_grad(config, params, deterministic=True, rng=None):
  """Pretraining outputs and the gradient of a scalar that touches every output."""
  grads, out = _compiled(config, deterministic)(params, jax.random.key(0) if rng is None else rng)
  return out, grads


def _max_diff(a, b):
  diffs = jax.tree.map(lambda x, y: float(np.abs(np.asarray(x) - np.asarray(y)).max()), a, b)
  return max(jax.tree.leaves(diffs))


def test_scan_matches_unrolled_outputs_and_gradients():
  params = _params(CONFIG)
  scanned_config = CONFIG.replace(scan_layers=True)
  stacked = jm.stack_layers(params)
  # The stacked tree is exactly what a scanned model initialises.
  assert jax.tree.map(np.shape, stacked) == jax.tree.map(np.shape, _params(scanned_config))
  assert stacked["bert"]["encoder"]["layers"]["mlp"]["wi"]["kernel"].shape == (2, 32, 48)
  out, grads = _forward_and_grad(CONFIG, params)
  out_scan, grads_scan = _forward_and_grad(scanned_config, stacked)
  assert _max_diff(out, out_scan) <= 1e-5
  assert _max_diff(grads, jm.unstack_layers(grads_scan)) <= 1e-5
  assert jax.tree.all(jax.tree.map(np.array_equal, jm.unstack_layers(stacked), params))


@pytest.mark.parametrize("policy,scan", [("full", False), ("dots", True), ("dots_no_batch", True)])
def test_remat_leaves_gradients_unchanged(policy, scan):
  params = _params(CONFIG)
  _, grads = _forward_and_grad(CONFIG, params)
  config = CONFIG.replace(remat_policy=policy, scan_layers=scan)
  _, grads_remat = _forward_and_grad(config, jm.stack_layers(params) if scan else params)
  # Recomputation changes XLA's fusions and so the float32 rounding, not the values (|grad| ~ 1).
  assert _max_diff(grads, jm.unstack_layers(grads_remat)) <= 1e-5


def test_einsum_and_xla_attention_agree_in_the_model():
  params = _params(CONFIG)
  out_xla, grads_xla = _forward_and_grad(CONFIG, params)
  out_einsum, grads_einsum = _forward_and_grad(CONFIG.replace(attention_impl="einsum"), params)
  assert _max_diff(out_xla, out_einsum) <= 1e-5
  assert _max_diff(grads_xla, grads_einsum) <= 1e-5


def test_dropout_through_scan_and_remat():
  config = CONFIG.replace(scan_layers=True, remat_policy="full")
  params = jm.stack_layers(_params(CONFIG))
  a, grads = _forward_and_grad(config, params, deterministic=False, rng=jax.random.key(1))
  b, _ = _forward_and_grad(config, params, deterministic=False, rng=jax.random.key(1))
  c, _ = _forward_and_grad(config, params, deterministic=False, rng=jax.random.key(2))
  assert _max_diff(a, b) == 0.0
  assert _max_diff(a, c) > 1e-3
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
  # With every rate 0, training mode computes the evaluation function.
  no_drop = config.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  train, _ = _forward_and_grad(no_drop, params, deterministic=False, rng=jax.random.key(1))
  evaluation, _ = _forward_and_grad(config, params)
  assert _max_diff(train, evaluation) <= 1e-6


def test_bfloat16_compute_is_close_to_float32():
  params = _params(CONFIG)
  model32 = jm.BertForPreTraining(CONFIG)
  model16 = jm.BertForPreTraining(CONFIG.replace(dtype="bfloat16"))
  out32 = model32.apply({"params": params}, IDS, TYPES, MASK)
  out16 = model16.apply({"params": params}, IDS, TYPES, MASK)
  assert out16.last_hidden_state.dtype == jnp.bfloat16
  assert out16.mlm_logits.dtype == jnp.float32 and out16.nsp_logits.dtype == jnp.float32
  # Hidden states are LayerNorm outputs of unit scale; bf16 has 8 mantissa bits.
  hidden_err = np.abs(np.asarray(out16.last_hidden_state, np.float32) - np.asarray(out32.last_hidden_state))
  assert hidden_err.max() <= 0.1 and hidden_err.mean() <= 0.01
  logits_err = np.abs(np.asarray(out16.mlm_logits) - np.asarray(out32.mlm_logits)).max()
  assert logits_err <= 0.05 * np.abs(np.asarray(out32.mlm_logits)).max()
  # Parameters stay float32 unless param_dtype says otherwise.
  bf16_params = nn.meta.unbox(jax.eval_shape(
      lambda: jm.init_params(jm.BertModel(CONFIG.replace(param_dtype="bfloat16")), jax.random.key(0))))
  assert {x.dtype for x in jax.tree.leaves(bf16_params)} == {jnp.dtype(jnp.bfloat16)}
