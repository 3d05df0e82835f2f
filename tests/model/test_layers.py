"""Layers against NumPy references, with random (non-trivial) injected parameters."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from jbert.model import BertConfig
from jbert.model.layers import BertEmbeddings, BertLayer, BertMlp, BertSelfAttention, DenseGeneral, Dropout

B, T = 2, 6
CONFIG = BertConfig.from_preset("tiny", hidden_size=16, num_attention_heads=4, intermediate_size=24,
                                vocab_size=11, max_position_embeddings=8, type_vocab_size=3,
                                layer_norm_eps=1e-6)
N, D, H = 4, 4, 16


def _random_params(module, *args, seed=0):
  """Init for the structure, then random values everywhere (LayerNorm scales and biases included)."""
  params = nn.meta.unbox(module.init(jax.random.key(0), *args)["params"])
  rng = np.random.default_rng(seed)
  return jax.tree.map(lambda x: rng.normal(0.0, 0.5, x.shape).astype(np.float32), params)


def _inputs(seed=1):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, T, H)).astype(np.float32)
  mask = np.ones((B, T), bool)
  mask[0, 4:] = False
  return x, mask


def _np_norm(x, p, eps=CONFIG.layer_norm_eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * p["scale"] + p["bias"]


def _np_gelu(x, name):
  if name == "gelu":
    return 0.5 * x * (1 + erf(x / np.sqrt(2)))
  return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _np_attention(x, p, mask):
  q, k, v = (np.einsum("bth,hnd->btnd", x, p[n]["kernel"]) + p[n]["bias"] for n in ("query", "key", "value"))
  logits = np.einsum("btnd,bsnd->bnts", q, k) / np.sqrt(q.shape[-1])
  logits = np.where(mask[:, None, None, :], logits, -1e30)
  probs = np.exp(logits - logits.max(-1, keepdims=True))
  probs /= probs.sum(-1, keepdims=True)
  ctx = np.einsum("bnts,bsnd->btnd", probs, v)
  return np.einsum("btnd,ndh->bth", ctx, p["out"]["kernel"]) + p["out"]["bias"]


def _np_mlp(x, p, act):
  return _np_gelu(x @ p["wi"]["kernel"] + p["wi"]["bias"], act) @ p["wo"]["kernel"] + p["wo"]["bias"]


def test_embeddings_match_reference():
  ids = np.array([[1, 2, 3, 10, 0, 0], [4, 4, 5, 6, 7, 8]], np.int32)
  types = np.array([[0, 0, 1, 1, 2, 2], [0, 1, 0, 1, 0, 1]], np.int32)
  module = BertEmbeddings(CONFIG)
  p = _random_params(module, ids, types, True)
  got = module.apply({"params": p}, ids, types, True)
  want = _np_norm(p["word_embeddings"]["embedding"][ids] + p["token_type_embeddings"]["embedding"][types]
                  + p["position_embeddings"]["embedding"][:T], p["norm"])
  np.testing.assert_allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("impl", ["xla", "einsum"])
def test_attention_matches_reference(impl):
  x, mask = _inputs()
  module = BertSelfAttention(CONFIG.replace(attention_impl=impl))
  p = _random_params(module, x, mask, True)
  got = module.apply({"params": p}, x, mask, True)
  assert got.shape == (B, T, H)
  np.testing.assert_allclose(got, _np_attention(x, p, mask), atol=1e-5)


@pytest.mark.parametrize("head_dim", [4, 6])  # scale 1/2 (q scaled exactly) and 1/sqrt(6)
@pytest.mark.parametrize("dtype, tol", [("float32", 1e-6), ("bfloat16", 2e-2)])
def test_einsum_attention_scale_for_any_head_size(head_dim, dtype, tol):
  x, mask = _inputs()
  x = np.concatenate([x, x[..., : 4 * head_dim - H]], -1) if 4 * head_dim > H else x[..., : 4 * head_dim]
  config = CONFIG.replace(hidden_size=4 * head_dim, attention_impl="einsum", dtype=dtype)
  module = BertSelfAttention(config)
  p = _random_params(module, x, mask, True)
  got = np.asarray(module.apply({"params": p}, x, mask, True), np.float32)
  want = _np_attention(x, p, mask)
  assert np.abs(got - want).max() <= tol * np.abs(want).max()  # relative to the output's scale


def test_einsum_and_xla_attention_agree():
  x, mask = _inputs()
  p = _random_params(BertSelfAttention(CONFIG), x, mask, True)
  xla, einsum = (BertSelfAttention(CONFIG.replace(attention_impl=i)).apply({"params": p}, x, mask, True)
                 for i in ("xla", "einsum"))
  assert np.abs(np.asarray(xla) - np.asarray(einsum)).max() <= 1e-6


def test_padded_keys_are_ignored():
  x, mask = _inputs()
  module = BertSelfAttention(CONFIG)
  p = _random_params(module, x, mask, True)
  changed = x.copy()
  changed[0, 4:] += 7.0  # Only the padded positions of row 0.
  a, b = (np.asarray(module.apply({"params": p}, v, mask, True)) for v in (x, changed))
  np.testing.assert_allclose(a[0, :4], b[0, :4], atol=1e-6)
  np.testing.assert_array_equal(a[1], b[1])
  assert np.abs(a[0, 4:] - b[0, 4:]).max() > 1e-2  # Padded queries still change: only keys are masked.


def test_attention_dropout_takes_einsum_path():
  x, mask = _inputs()
  p = _random_params(BertSelfAttention(CONFIG), x, mask, True)
  rngs = {"dropout": jax.random.key(3)}
  eval_out = BertSelfAttention(CONFIG).apply({"params": p}, x, mask, True)
  no_drop = BertSelfAttention(CONFIG.replace(attention_probs_dropout_prob=0.0)).apply(
      {"params": p}, x, mask, False, rngs=rngs)
  dropped = BertSelfAttention(CONFIG.replace(attention_probs_dropout_prob=0.5)).apply(
      {"params": p}, x, mask, False, rngs=rngs)
  np.testing.assert_allclose(no_drop, eval_out, atol=1e-6)
  assert np.abs(np.asarray(dropped) - np.asarray(eval_out)).max() > 1e-2


def _kept_scale(rate):
  """1 / the realised keep probability: an element drops when its 16-bit draw is below round(rate * 2**16)."""
  return np.float32(65536 / (65536 - round(rate * 65536)))


def _dropout(x, rate, seed=0, deterministic=False):
  return np.asarray(Dropout(rate).apply({}, x, deterministic, rngs={"dropout": jax.random.key(seed)}))


@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_rate_scale_and_independent_halves(rate):
  out = _dropout(np.ones((64, 128, 128), np.float32), rate)  # 1M elements: the rate to ~1e-3
  dropped = round(rate * 65536)
  kept = out != 0
  np.testing.assert_array_equal(out[kept], _kept_scale(rate))  # E[out] = x exactly
  p = dropped / 65536
  sigma = np.sqrt(p * (1 - p) / out.size)
  assert abs((~kept).mean() - p) < 5 * sigma
  # Neighbours share a 32-bit word (one 16-bit half each): their drops must still be independent.
  both = (~kept[..., 0::2] & ~kept[..., 1::2]).mean()
  assert abs(both - p * p) < 5 * np.sqrt(p * p * (1 - p * p) / (out.size // 2))


def test_dropout_is_reproducible_per_key_and_handles_odd_shapes():
  x = np.arange(1, 7 * 5 + 1, dtype=np.float32).reshape(7, 5)
  a, b, c = _dropout(x, 0.3, seed=1), _dropout(x, 0.3, seed=1), _dropout(x, 0.3, seed=2)
  assert a.shape == x.shape
  np.testing.assert_array_equal(a, b)
  assert (a != c).any()
  np.testing.assert_array_equal(a[a != 0], x[a != 0] * _kept_scale(0.3))
  np.testing.assert_array_equal(_dropout(x, 0.3, deterministic=True), x)
  np.testing.assert_array_equal(_dropout(x, 0.0), x)


def test_dropout_of_bfloat16_and_scalars():
  x = np.linspace(1, 2, 4096, dtype=np.float32).astype(jnp.bfloat16)
  out = _dropout(x, 0.1)
  assert out.dtype == jnp.bfloat16
  kept = out != 0
  # Each kept value is x / keep rounded once to bfloat16, not x times a bfloat16-rounded 1 / keep.
  expected = (x.astype(np.float32) * _kept_scale(0.1)).astype(jnp.bfloat16)
  np.testing.assert_array_equal(out[kept], expected[kept])
  assert _dropout(np.float32(3.0), 0.5).shape == ()


def test_dropout_gradient_is_the_scaled_mask():
  x = np.random.default_rng(0).normal(size=(4, 32)).astype(np.float32)
  key = jax.random.key(5)
  f = lambda v: Dropout(0.2).apply({}, v, False, rngs={"dropout": key})  # noqa: E731
  out, grad = f(x), jax.grad(lambda v: f(v).sum())(x)
  np.testing.assert_array_equal(np.asarray(grad), np.where(np.asarray(out) != 0, _kept_scale(0.2), 0.0))


def test_dense_general_contracts_trailing_axes_with_nd_kernel():
  x = np.random.default_rng(0).normal(size=(B, T, N, D)).astype(np.float32)
  module = DenseGeneral(features=(H,), kernel_axes=("heads", "kv", "embed"), axis=(-2, -1))
  p = _random_params(module, x)
  assert p["kernel"].shape == (N, D, H)
  want = np.einsum("btnd,nde->bte", x, p["kernel"]) + p["bias"]
  np.testing.assert_allclose(module.apply({"params": p}, x), want, atol=1e-5)
  grad = jax.grad(lambda k: module.apply({"params": {**p, "kernel": k}}, x).sum())(p["kernel"])
  np.testing.assert_allclose(grad, np.einsum("btnd->nd", x)[..., None].repeat(H, -1), rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="trailing axes"):
    DenseGeneral(features=(H,), kernel_axes=("heads", "embed"), axis=(1,)).init(jax.random.key(0), x)


@pytest.mark.parametrize("act", ["gelu", "gelu_new"])
def test_mlp_matches_reference(act):
  x, _ = _inputs()
  module = BertMlp(CONFIG.replace(hidden_act=act))
  p = _random_params(module, x)
  np.testing.assert_allclose(module.apply({"params": p}, x), _np_mlp(x, p, act), atol=1e-5)


def test_layer_is_post_layernorm():
  x, mask = _inputs()
  module = BertLayer(CONFIG)
  p = _random_params(module, x, mask, True)
  h = _np_norm(x + _np_attention(x, p["attention"], mask), p["attention_norm"])
  want = _np_norm(h + _np_mlp(h, p["mlp"], "gelu"), p["output_norm"])
  np.testing.assert_allclose(module.apply({"params": p}, x, mask, True), want, atol=1e-4)
  carry, out = BertLayer(CONFIG, scanned=True).apply({"params": p}, x, mask, True)
  assert out is None
  np.testing.assert_allclose(carry, want, atol=1e-4)
