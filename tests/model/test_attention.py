"""jbert.model.attention: every kernel that runs on CPU equals einsum (fp32) with padding and with segments; `auto`
per platform; splash's wrapper (lengths, blocks, segments, mesh) in the Pallas interpreter; cuDNN's arguments."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jbert.model import BertConfig, attention
from jbert.model.layers import BertSelfAttention
from jbert.runtime import sharding

# BERT's head size (64), so splash runs with the head dims it meets on TPU.
CONFIG = BertConfig(hidden_size=128, num_attention_heads=2, intermediate_size=64, num_hidden_layers=1,
                    vocab_size=50, attention_probs_dropout_prob=0.0)
B, T = 2, 100  # not a multiple of 128: splash pads the rows


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, T, CONFIG.hidden_size)).astype(np.float32)
  mask = np.ones((B, T), bool)
  mask[0, 70:] = False
  segments = np.zeros((B, T), np.int32)  # row 0: two sequences and padding; row 1: two sequences, no padding
  segments[0, :30], segments[0, 30:70], segments[1, :50], segments[1, 50:] = 1, 2, 1, 2
  return x, mask, segments


@pytest.fixture(scope="module")
def params():
  x, mask, _ = _inputs()
  return BertSelfAttention(CONFIG).init(jax.random.key(0), x, mask, True)["params"]


def _apply(params, impl, x, mask, segments=None, config=CONFIG):
  return np.asarray(BertSelfAttention(config.replace(attention_impl=impl)).apply(
      {"params": params}, x, mask, True, segments=segments))


@pytest.mark.parametrize("impl", ["xla", "splash", "auto"])
def test_kernels_equal_einsum_with_padding_and_with_segments(params, impl):
  x, mask, segments = _inputs()
  want_padded, want_packed = (_apply(params, "einsum", x, mask, s) for s in (None, segments))
  got_padded, got_packed = (_apply(params, impl, x, mask, s) for s in (None, segments))
  # Padding only: the real tokens' outputs (splash lets a padded query attend to padding, einsum to the real keys;
  # neither output is read).
  assert np.abs(got_padded - want_padded)[mask].max() <= 1e-5
  # Segments: every position, padding included, since padding is a segment of its own in every kernel.
  assert np.abs(got_packed - want_packed).max() <= 1e-5
  if impl != "splash":
    assert np.abs(got_padded - want_padded).max() <= 1e-5


def test_segments_make_attention_block_diagonal(params):
  x, mask, segments = _inputs()
  _, probs = BertSelfAttention(CONFIG.replace(attention_impl="einsum")).apply(
      {"params": params}, x, mask, True, return_probs=True, segments=segments)  # [B, N, T, T]
  same = segments[:, None, :, None] == segments[:, None, None, :]
  assert np.asarray(probs)[~np.broadcast_to(same, probs.shape)].max() == 0.0
  np.testing.assert_allclose(np.asarray(probs).sum(-1), 1.0, atol=1e-6)


def test_splash_gradients_equal_einsums(params):
  """The training path: splash's custom backward (dQ and dK/dV kernels) in the interpreter."""
  x, mask, segments = _inputs()

  def loss(impl):
    f = lambda p, x: jnp.sum(BertSelfAttention(CONFIG.replace(attention_impl=impl)).apply(
        {"params": p}, x, mask, True, segments=segments) ** 2)
    return jax.grad(f, argnums=(0, 1))(params, x)

  (gp_splash, gx_splash), (gp_einsum, gx_einsum) = loss("splash"), loss("einsum")
  np.testing.assert_allclose(gx_splash, gx_einsum, atol=1e-4, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(gp_splash), jax.tree.leaves(gp_einsum)):
    np.testing.assert_allclose(a, b, atol=1e-3, rtol=1e-5)  # sums over B x T rows of O(100) terms


@pytest.mark.parametrize("length,block", [(128, 128), (256, 256), (384, 128), (512, 512), (1024, 512)])
def test_splash_blocks_are_the_largest_that_divide_the_length(length, block):
  blocks = attention.splash_block_sizes(length)
  assert (blocks.block_q, blocks.block_kv, blocks.block_kv_compute, blocks.block_q_dkv, blocks.block_kv_dkv,
          blocks.block_kv_dkv_compute, blocks.block_q_dq, blocks.block_kv_dq) == (block,) * 8


def test_splash_pads_rows_into_a_segment_of_their_own():
  rng = np.random.default_rng(1)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 40, 2, 64)), jnp.float32) for _ in range(3))
  segments = np.zeros((2, 40), np.int32)
  segments[0, :25], segments[1, :] = 1, 3  # row 0 ends in padding (segment 0), which attends to padding only
  got = attention.splash_attention(q, k, v, jnp.asarray(segments), interpret=True)
  want, _ = attention.einsum_attention(q, k, v, attention.allowed_keys(segments > 0, jnp.asarray(segments)),
                                       lambda p: p)
  assert got.shape == (2, 40, 2, 64)
  assert np.abs(np.asarray(got) - np.asarray(want)).max() <= 1e-5


def test_splash_under_a_mesh_runs_in_shard_map(params, monkeypatch):
  """Under a mesh the kernel runs per device in shard_map over the batch and head axes of the logical rules."""
  x, mask, segments = _inputs()
  specs = []
  real_shard_map = jax.shard_map
  monkeypatch.setattr(jax, "shard_map", lambda f, **kw: specs.append(kw["in_specs"]) or real_shard_map(f, **kw))
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
    got = jax.jit(lambda p, x: BertSelfAttention(CONFIG.replace(attention_impl="splash")).apply(
        {"params": p}, x, mask, True, segments=segments))(params, x)
  P = jax.sharding.PartitionSpec
  assert specs == [(P(("data", "fsdp"), "tensor", None, None),) * 3 + (P(("data", "fsdp"), None),)]
  assert np.abs(np.asarray(got) - _apply(params, "einsum", x, mask, segments)).max() <= 1e-5


def test_mesh_axes_that_do_not_divide_are_left_out():
  mesh = jax.sharding.AbstractMesh((2, 1, 4), ("data", "fsdp", "tensor"))
  assert attention._mesh_axes(mesh, (("data", "fsdp"), "tensor"), (6, 12)) == [("data", "fsdp"), "tensor"]
  assert attention._mesh_axes(mesh, (("data", "fsdp"), "tensor"), (3, 2)) == [None, None]


@pytest.mark.parametrize("platform,dtype,length,want", [
    ("tpu", "bfloat16", 128, "splash"), ("tpu", "float32", 512, "splash"), ("tpu", "bfloat16", 96, "xla"),
    ("gpu", "bfloat16", 128, "cudnn"), ("gpu", "float16", 64, "cudnn"), ("gpu", "float32", 128, "xla"),
    ("gpu", "bfloat16", 33, "xla"), ("cpu", "bfloat16", 128, "xla"), ("cpu", "float32", 512, "xla"),
])
def test_auto_resolves_per_platform(platform, dtype, length, want):
  assert attention.resolve("auto", platform, dtype=dtype, head_dim=64, length=length) == want
  assert attention.resolve("einsum", platform, dtype=dtype, head_dim=64, length=length) == "einsum"


def _record_kernel(monkeypatch, platform):
  """Pretends the model is traced for `platform`; records which kernel each attention call takes."""
  taken = []
  monkeypatch.setattr(attention, "current_platform", lambda: platform)
  real_fused, real_einsum = attention.fused_attention, attention.einsum_attention
  # The kernels themselves run as on this CPU (splash in the Pallas interpreter).
  monkeypatch.setattr(attention, "fused_attention",
                      lambda impl, *a, **kw: taken.append(impl) or real_fused(impl, *a[:-1], "cpu", **kw))
  monkeypatch.setattr(attention, "einsum_attention", lambda *a: taken.append("einsum") or real_einsum(*a))
  return taken


def test_auto_on_a_tpu_takes_splash_and_dropout_takes_einsum(params, monkeypatch):
  taken = _record_kernel(monkeypatch, "tpu")
  x, mask, segments = _inputs()
  x, mask, segments = np.pad(x, ((0, 0), (0, 28), (0, 0))), np.pad(mask, ((0, 0), (0, 28))), np.pad(
      segments, ((0, 0), (0, 28)))  # 128 tokens
  _apply(params, "auto", x, mask, segments)
  _apply(params, "auto", x[:, :96], mask[:, :96], segments[:, :96])
  dropout = CONFIG.replace(attention_probs_dropout_prob=0.1, attention_impl="auto")
  BertSelfAttention(dropout).apply({"params": params}, x, mask, False, segments=segments,
                                   rngs={"dropout": jax.random.key(1)})
  BertSelfAttention(dropout).apply({"params": params}, x, mask, True, return_probs=True)
  assert taken == ["splash", "xla", "einsum", "einsum"]


def test_cudnn_gets_a_full_mask_as_its_bias(params, monkeypatch):
  """On a GPU in bf16, `auto` calls cuDNN with a [B, 1, T, S] mask (its bias), which computes what einsum does."""
  taken = _record_kernel(monkeypatch, "gpu")
  calls = []
  real = jax.nn.dot_product_attention

  def fake_cudnn(q, k, v, mask=None, implementation=None):
    calls.append((implementation, mask.shape, q.dtype))
    return real(q, k, v, mask=mask)  # XLA's kernel in place of cuDNN's, which needs a GPU

  monkeypatch.setattr(jax.nn, "dot_product_attention", fake_cudnn)
  x, mask, segments = _inputs()
  bf16 = CONFIG.replace(dtype="bfloat16")
  got = [_apply(params, "auto", x, mask, s, config=bf16) for s in (None, segments)]
  assert taken == ["cudnn", "cudnn"]
  assert calls == [("cudnn", (B, 1, T, T), jnp.bfloat16)] * 2
  monkeypatch.undo()
  for s, out in zip((None, segments), got):
    want = _apply(params, "einsum", x, mask, s, config=bf16)
    assert np.abs(out - want)[mask].max() <= 2e-2 * np.abs(want).max()


@pytest.mark.parametrize("impl,platform,dtype,message", [
    ("cudnn", "cpu", "bfloat16", r"attention_impl='cudnn' is cuDNN's kernel for NVIDIA GPUs, but the model runs on "
                                 r"cpu; use attention_impl='auto'"),
    ("cudnn", "gpu", "float16", None),
    ("splash", "gpu", "bfloat16", r"attention_impl='splash' is a TPU kernel \(the model runs on gpu\)"),
])
def test_kernels_refuse_platforms_they_cannot_run_on(impl, platform, dtype, message):
  if message is None:
    attention.check_platform(impl, platform, dtype, 64, 128)
    with pytest.raises(ValueError, match=r"needs dtype bfloat16 or float16.*got float16, 64, 127"):
      attention.check_platform(impl, platform, dtype, 64, 127)
    return
  with pytest.raises(ValueError, match=message):
    attention.check_platform(impl, platform, dtype, 64, 128)


def test_cudnn_in_float32_is_refused_by_the_config():
  with pytest.raises(ValueError, match=r"attention_impl='cudnn' computes in bfloat16 or float16.*dtype='bfloat16'"):
    BertConfig(attention_impl="cudnn")
  assert BertConfig(attention_impl="cudnn", dtype="bfloat16").attention_impl == "cudnn"


def test_platform_is_the_context_meshs(monkeypatch):
  assert attention.current_platform() == "cpu"
  tpu_mesh = type("Mesh", (), {"abstract_device": type("Device", (), {"platform": "tpu"})()})()
  monkeypatch.setattr(jax.sharding, "get_abstract_mesh", lambda: tpu_mesh)
  assert attention.current_platform() == "tpu"


def test_remat_recomputes_through_a_fused_kernel():
  """Remat (as on a GPU or TPU with little memory) around a kernel with its own backward (splash, in the
  interpreter): the gradients are einsum's without remat."""
  from jbert.model import BertModel  # pylint: disable=import-outside-toplevel
  config = CONFIG.replace(num_hidden_layers=1, hidden_dropout_prob=0.0)
  ids = np.random.default_rng(2).integers(1, 50, (2, 128)).astype(np.int32)
  segments = np.repeat([[1, 2], [1, 1]], 64, axis=1).astype(np.int32)  # two sequences in row 0, one in row 1
  params = BertModel(config).init(jax.random.key(0), ids)["params"]

  def grads(c):
    loss = lambda p: jnp.sum(BertModel(c).apply({"params": p}, ids, segment_ids=segments).last_hidden_state ** 2)
    return jax.grad(loss)(params)

  got, want = grads(config.replace(remat_policy="dots", attention_impl="splash")), grads(config.replace(
      attention_impl="einsum"))
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, atol=2e-3, rtol=1e-4)
