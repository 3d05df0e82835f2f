"""ModernBERT's layers as BertConfig data: the sliding window and rotary positions in every attention kernel, with
packed rows (a window never crosses a sequence, positions restart at each), and the local and global splash kernels
compiled for a TPU. Parity with transformers is tests/weights/test_modernbert.py's."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jbert.model as jm
from jbert.model import attention, rotary
from jbert.model.encoder import segment_positions
from jbert.model.layers import BertSelfAttention
from jbert.runtime import sharding

CONFIG = jm.BertConfig.from_dict({
    "model_type": "modernbert", "vocab_size": 99, "hidden_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 2, "intermediate_size": 96, "local_attention": 16, "global_attn_every_n_layers": 2,
    "pad_token_id": 0})
WINDOW = 8


def _inputs(length=40, seed=0):
  """Row 0: one sequence of 25 tokens, then padding; row 1: sequences of 18 and 22 tokens."""
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(2, length, CONFIG.hidden_size)).astype(np.float32)
  segments = np.zeros((2, length), np.int32)
  segments[0, :25], segments[1, :18], segments[1, 18:] = 1, 1, 2
  return x, segments > 0, segments


def _reference(q, k, v, segments, window):
  """Attention of each query over the keys of its own segment within `window` tokens, one query at a time."""
  b, t, n, d = q.shape
  out = np.zeros_like(q)
  for r in range(b):
    for i in range(t):
      keys = [j for j in range(t) if segments[r, j] == segments[r, i] and abs(i - j) <= window]
      logits = np.einsum("nd,snd->ns", q[r, i], k[r, keys]) / np.sqrt(d)
      p = np.exp(logits - logits.max(-1, keepdims=True))
      out[r, i] = np.einsum("ns,snd->nd", p / p.sum(-1, keepdims=True), v[r, keys])
  return out


@pytest.mark.parametrize("impl", ["einsum", "xla", "splash"])
def test_every_kernel_computes_the_window_within_each_sequence(impl):
  rng = np.random.default_rng(0)
  q, k, v = (rng.normal(size=(2, 40, 2, 64)).astype(np.float32) for _ in range(3))
  _, mask, segments = _inputs()
  want = _reference(q, k, v, segments, WINDOW)
  if impl == "einsum":
    got, _ = attention.einsum_attention(q, k, v, attention.allowed_keys(jnp.asarray(mask), jnp.asarray(segments),
                                                                        WINDOW), lambda p: p)
  else:
    got = attention.fused_attention(impl, q, k, v, jnp.asarray(mask), jnp.asarray(segments), "cpu", window=WINDOW)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("index,window", [(0, None), (1, WINDOW)])
def test_the_attention_layer_is_the_same_in_every_kernel_global_and_local(index, window):
  """Layer 0 is global (rope_theta), layer 1 local (local_rope_theta, the window); packed rows with positions
  restarting per sequence, and an unpacked row with padding."""
  assert (CONFIG.layer_window(index), CONFIG.layer_rope_theta(index)) == (window, (160000.0, 10000.0)[index])
  x, mask, segments = _inputs()
  positions = segment_positions(jnp.asarray(segments))
  layer = lambda impl: BertSelfAttention(CONFIG.replace(attention_impl=impl), index=index)
  params = layer("einsum").init(jax.random.key(0), x, mask, True)["params"]
  outs = {impl: np.asarray(layer(impl).apply({"params": params}, x, mask, True, segments=segments,
                                            positions=positions)) for impl in ("einsum", "xla", "splash")}
  for impl in ("xla", "splash"):
    np.testing.assert_allclose(outs[impl], outs["einsum"], atol=1e-5, rtol=0)
  plain = {impl: np.asarray(layer(impl).apply({"params": params}, x, mask, True)) for impl in ("einsum", "xla")}
  np.testing.assert_allclose(plain["xla"][mask], plain["einsum"][mask], atol=1e-5, rtol=0)


def test_rotary_logits_depend_on_the_distance_only():
  rng = np.random.default_rng(0)
  q, k = (jnp.asarray(rng.normal(size=(1, 1, 1, 64)), jnp.float32) for _ in range(2))
  logit = lambda i, j: float(jnp.sum(rotary.rotate(q, jnp.array([[i]]), 10000.0)
                                     * rotary.rotate(k, jnp.array([[j]]), 10000.0)))
  assert logit(3, 10) == pytest.approx(logit(103, 110), abs=1e-4)
  assert logit(3, 10) != pytest.approx(logit(3, 11), abs=1e-3)


def test_a_packed_row_is_its_sequences_alone_and_a_neighbour_changes_nothing():
  """Windows and positions stop at a sequence's end: sequence 2 at offset 30 of a packed row is what it is alone,
  and changing sequence 2 leaves sequence 1 bit-identical (both far longer than the window)."""
  model = jm.BertModel(CONFIG)
  rng = np.random.default_rng(0)
  a, b = rng.integers(3, 99, 30).astype(np.int32), rng.integers(3, 99, 26).astype(np.int32)
  row = np.concatenate([a, b])[None]
  seg = np.concatenate([np.full(30, 1), np.full(26, 2)])[None].astype(np.int32)
  params = model.init(jax.random.key(0), row)["params"]
  packed = np.asarray(model.apply({"params": params}, row, segment_ids=seg).last_hidden_state)
  alone = np.asarray(model.apply({"params": params}, b[None]).last_hidden_state)
  np.testing.assert_allclose(packed[0, 30:], alone[0], atol=1e-5, rtol=0)
  changed = row.copy()
  changed[0, 30:] = rng.integers(3, 99, 26)
  other = np.asarray(model.apply({"params": params}, changed, segment_ids=seg).last_hidden_state)
  assert np.array_equal(other[0, :30], packed[0, :30])


def test_the_parameter_tree_has_no_positions_biases_or_first_attention_norm():
  params = jm.BertForMaskedLM(CONFIG).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
  shapes = jax.tree.map(np.shape, nn.meta.unbox(params))
  assert shapes["bert"]["embeddings"] == {"word_embeddings": {"embedding": (99, 128)}, "norm": {"scale": (128,)}}
  assert "attention_norm" not in shapes["bert"]["encoder"]["layer_0"]
  assert shapes["bert"]["encoder"]["layer_1"]["attention_norm"] == {"scale": (128,)}
  assert shapes["bert"]["encoder"]["layer_1"]["mlp"] == {"wi": {"kernel": (128, 2, 96)}, "wo": {"kernel": (96, 128)}}
  assert shapes["bert"]["encoder"]["layer_1"]["attention"]["query"] == {"kernel": (128, 2, 64)}
  assert shapes["bert"]["final_norm"] == {"scale": (128,)}
  assert shapes["mlm"] == {"transform": {"kernel": (128, 128)}, "norm": {"scale": (128,)}, "output_bias": (99,)}


def test_local_and_global_splash_kernels_compile_for_a_tpu():
  """The forward of a 2-layer ModernBERT (one global, one local layer) at 2,048 tokens with splash attention,
  lowered and compiled for a v5e:2x2 by libtpu on this CPU (the backward's dQ and dK/dV kernels take the same
  block masks; compiling them too costs a minute): one Mosaic kernel per layer. Splash's blocks are 512 tokens:
  the global layer's kernel visits all 4 x 4 blocks of a head, the local layer's (a window of 128 tokens each
  side) only the 3 key blocks a query block's windows reach: O(T w) work."""
  import script_module  # pylint: disable=g-import-not-at-top
  aot = script_module.load("tpu/aot_compile.py")
  devices, _ = aot.topology_devices("v5e:2x2")
  config = CONFIG.replace(attention_impl="splash", dtype="bfloat16", local_attention=256)
  mesh = sharding.make_mesh(data=2, tensor=2, devices=devices)
  model = jm.BertModel(config)
  ids = jax.ShapeDtypeStruct((4, 2048), jnp.int32)
  abstract = jax.eval_shape(lambda: nn.meta.unbox(jm.init_params(model, jax.random.key(0), (4, 2048))))

  forward = lambda params, ids: model.apply({"params": params}, ids).last_hidden_state
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
    text = jax.jit(forward).lower(abstract, ids).compile().as_text()
  calls = [line for line in text.splitlines() if 'custom_call_target="tpu_custom_call"' in line]
  assert len(calls) == 2 and all("splash_mha_fwd" in line for line in calls)
  # The block mask (per head on this device, query blocks, key blocks visited) is the first operand's layout.
  assert sorted(line.split("operand_layout_constraints={")[1][:10] for line in calls) == [
      "s8[1,4,3]{", "s8[1,4,4]{"]


def test_fresh_weights_follow_modernberts_initialisation():
  """transformers' ModernBERT init: every kernel a normal cut at 2 std devs (initializer_cutoff_factor), the
  attention and MLP outputs and the head's dense at 0.02 / sqrt(2 L), the classifier at H^-0.5; BERT keeps its
  uncut normal(0.02). A normal cut at 2 std devs has a std of 0.88 of the uncut one."""
  assert (CONFIG.initializer_cutoff_factor, CONFIG.scaled_init) == (2.0, True)
  params = nn.meta.unbox(jm.BertForSequenceClassification(CONFIG, num_labels=64).init(
      jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"])
  layer = params["bert"]["encoder"]["layer_1"]
  out = 0.02 / np.sqrt(2 * CONFIG.num_hidden_layers)
  for kernel, std in ((layer["attention"]["query"]["kernel"], 0.02), (layer["mlp"]["wi"]["kernel"], 0.02),
                      (layer["attention"]["out"]["kernel"], out), (layer["mlp"]["wo"]["kernel"], out),
                      (params["bert"]["pooler"]["kernel"], out), (params["classifier"]["kernel"], 128 ** -0.5),
                      (params["bert"]["embeddings"]["word_embeddings"]["embedding"], 0.02)):
    kernel = np.asarray(kernel)
    assert np.abs(kernel).max() <= 2 * std * (1 + 1e-6)
    assert np.std(kernel) == pytest.approx(0.8796 * std, rel=0.1)
  bert = jm.BertConfig(vocab_size=99, hidden_size=128, num_hidden_layers=2, num_attention_heads=2)
  wo = np.asarray(nn.meta.unbox(jm.BertModel(bert).init(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))[
      "params"])["encoder"]["layer_1"]["mlp"]["wo"]["kernel"])
  assert np.std(wo) == pytest.approx(0.02, rel=0.05) and np.abs(wo).max() > 2 * 0.02
