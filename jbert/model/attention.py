"""The attention kernels behind `BertConfig.attention_impl`, and which keys a query may attend to.

Every kernel computes softmax(q k^T / sqrt(D)) v over the allowed keys, with float32 logits and softmax:

  einsum  explicit logits [B, N, T, S] and softmax: the only one with attention dropout and probabilities
  xla     einsum's arithmetic without dropout or probabilities, the softmax's division after the second matmul
          (`xla_attention`); any platform
  cudnn   `jax.nn.dot_product_attention(implementation="cudnn")`: cuDNN flash attention, NVIDIA GPUs, bf16/fp16
  splash  Pallas splash attention (`jax.experimental.pallas.ops.tpu.splash_attention`), TPU, in `shard_map` over
          the mesh axes of the batch and the heads as MaxText runs it; off TPU it runs in the Pallas interpreter
          (exact, slow: for tests)
  auto    `resolve`: splash on TPU when the length is a multiple of 128 (its blocks), cudnn on GPUs in
          bf16/fp16, xla otherwise

Which keys a query attends to:
  without segment ids, every key the padding mask keeps (BERT's key padding mask: a padded query attends to the
    real keys; its output is never read);
  with segment ids [B, T] (several sequences laid end to end in a row, 0 = padding), the keys of its own segment:
    attention is block-diagonal, padding attends to padding only, so no softmax row is empty and no real token
    sees padding or another sequence;
  with a local window w (ModernBERT's sliding-window layers: `BertConfig.layer_window`), only the keys within w
    tokens of the query on either side, composed with the above, so a window never crosses a packed row's
    sequences. einsum composes it into its boolean mask; xla computes blocks of w queries against their
    neighbouring keys (`local_attention`: O(T w)) once the row is longer than 3 w, else the mask; cudnn takes it
    in its bias (JAX's cuDNN binding has causal windows only, so a bidirectional one costs the full T x S there);
    splash in its block mask (`LocalMask`), whose empty blocks it skips: O(T w) work.
"""
from __future__ import annotations

import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jbert.model import local_attention
from jbert.model.axes import BATCH, HEADS

Array = jax.Array

# Splash attention tiles the sequence in blocks of whole TPU lane widths; a row is padded to a multiple of it.
SPLASH_LANES = 128
_SPLASH_BLOCKS = (512, 256, 128)  # MaxText's default block is 512; the largest that divides the length
_CUDNN_DTYPES = ("bfloat16", "float16")


def current_platform() -> str:
  """The platform the model is traced for: the context mesh's (an AOT topology's too), else JAX's backend."""
  device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
  name = jax.default_backend() if device is None else device.platform
  return "gpu" if name == "cuda" else name


def cudnn_supports(dtype: str, head_dim: int, length: int) -> bool:
  """cuDNN's flash attention in JAX: bf16/fp16 inputs, head dims that are multiples of 8 up to 128 (256 from
  Hopper on), and even lengths when a mask (our padding or segments) is applied in training."""
  return jnp.dtype(dtype).name in _CUDNN_DTYPES and head_dim % 8 == 0 and head_dim <= 128 and length % 2 == 0


def resolve(impl: str, platform: str, *, dtype: str, head_dim: int, length: int) -> str:
  """The kernel `impl` names on `platform` for a sequence of `length`: `auto` becomes the fastest exact one."""
  if impl != "auto":
    return impl
  if platform == "tpu":
    # Shorter or odd lengths would pad to the next block; XLA's fusion handles those without the waste.
    return "splash" if length % SPLASH_LANES == 0 else "xla"
  if platform == "gpu" and cudnn_supports(dtype, head_dim, length):
    return "cudnn"
  return "xla"


def kernel(config, platform: str, length: int, training: bool, return_probs: bool = False) -> str:
  """The kernel a BertConfig's attention runs: einsum whenever attention dropout is active (training with
  `attention_probs_dropout_prob` > 0) or the probabilities are asked for, else `resolve` of its attention_impl."""
  if return_probs or (training and config.attention_probs_dropout_prob > 0):
    return "einsum"
  return resolve(config.attention_impl, platform, dtype=config.dtype, head_dim=config.head_dim, length=length)


def check_platform(impl: str, platform: str, dtype: str, head_dim: int, length: int) -> None:
  """Refuses a kernel its platform cannot run, in one line naming the fix."""
  if impl == "cudnn" and platform != "gpu":
    raise ValueError(f"attention_impl='cudnn' is cuDNN's kernel for NVIDIA GPUs, but the model runs on {platform}; "
                     "use attention_impl='auto' (the platform's fastest kernel) or 'xla'.")
  if impl == "cudnn" and not cudnn_supports(dtype, head_dim, length):
    raise ValueError(f"attention_impl='cudnn' needs dtype bfloat16 or float16, a head size that is a multiple of "
                     f"8 up to 128 and an even length (got {dtype}, {head_dim}, {length}); use "
                     "attention_impl='auto' or 'xla'.")
  if impl == "splash" and platform not in ("tpu", "cpu"):
    raise ValueError(f"attention_impl='splash' is a TPU kernel (the model runs on {platform}); use "
                     "attention_impl='auto'.")


def allowed_keys(mask: Array, segments: Array | None, window: int | None = None) -> Array:
  """bool [B, 1, 1, S] (the padding mask of the keys) or, with segments, [B, 1, T, S] (same segment); a local
  `window` keeps the keys within that many tokens of the query ([B, 1, T, S])."""
  if segments is None:
    allowed = mask[:, None, None, :]  # [B, 1, 1, S]: broadcast over heads and queries.
  else:
    allowed = (segments[:, :, None] == segments[:, None, :])[:, None]  # [B, 1, T, S]
  if window is None:
    return allowed
  index = jnp.arange(mask.shape[-1], dtype=jnp.int32)  # [T]
  near = jnp.abs(index[:, None] - index[None, :]) <= window  # [T, S]
  return allowed & near  # [B, 1, T, S]


def einsum_attention(q: Array, k: Array, v: Array, allowed: Array,
                     dropout: Callable[[Array], Array]) -> tuple[Array, Array]:
  """q, k, v: [B, T, N, D]; allowed: bool broadcastable to [B, N, T, S]; `dropout` is applied to the
  probabilities. Returns the context [B, T, N, D] and the probabilities [B, N, T, S] (float32, before dropout)."""
  probs = jax.nn.softmax(_masked_logits(q, k, allowed), axis=-1)  # [B, N, T, S]
  return jnp.einsum("bnts,bsnd->btnd", dropout(probs).astype(v.dtype), v), probs  # [B, T, N, D]


def xla_attention(q: Array, k: Array, v: Array, allowed: Array) -> Array:
  """einsum_attention's context without dropout or probabilities, divided by the softmax's sum after the second
  matmul: on the context [B, N, T, D] (D numbers a query) rather than on the probabilities [B, N, T, S] (S), as
  `jax.nn.dot_product_attention`'s XLA formula does, and head-major, transposed once. On XLA:CPU the forward is
  2-4x faster at 256 tokens (`bench/attention_cpu.py`), within 2e-6. (With dropout the division could move too,
  dropout scaling each weight alone, but the backward pass then gained nothing on XLA:CPU.)"""
  weights, total = local_attention.exp_weights(_masked_logits(q, k, allowed))  # [B, N, T, S], [B, N, T, 1]
  context = jnp.einsum("bnts,bsnd->bntd", weights.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return (context / total).astype(v.dtype).transpose(0, 2, 1, 3)  # [B, N, T, D] -> [B, T, N, D]


def _masked_logits(q: Array, k: Array, allowed: Array) -> Array:
  """float32 logits [B, N, T, S] of q, k [B, T, N, D], the keys not `allowed` at float32's minimum."""
  scale = 1 / math.sqrt(q.shape[-1])
  # Scaling q [B, T, N, D] rather than the logits [B, N, T, S] touches half as many elements. It is exact when
  # the scale is a power of two (head size 64 in every BERT: 1/8) and within an ulp in float32; a
  # low-precision q with another head size scales the float32 logits instead.
  scale_q = math.log2(scale).is_integer() or jnp.dtype(q.dtype) == jnp.float32
  if scale_q:
    q = q * jnp.asarray(scale, q.dtype)
  # Logits and softmax in float32 whatever the compute dtype.
  logits = jnp.einsum("btnd,bsnd->bnts", q, k, preferred_element_type=jnp.float32)  # [B, N, T, S]
  if not scale_q:
    logits = logits * jnp.float32(scale)
  return jnp.where(allowed, logits, jnp.finfo(jnp.float32).min)


def fused_attention(impl: str, q: Array, k: Array, v: Array, mask: Array, segments: Array | None,
                    platform: str, window: int | None = None) -> Array:
  """The context [B, T, N, D] of the dropout-free kernel `impl` (xla, cudnn, splash); q, k, v: [B, T, N, D];
  mask: bool [B, T]; segments: int32 [B, T] (0 = padding) or None; window: a local window's half width or None."""
  if impl == "splash":
    # Without segments, padding is segment 0 and the rest one segment: the real tokens attend as with the mask.
    return splash_attention(q, k, v, mask.astype(jnp.int32) if segments is None else segments,
                            interpret=platform != "tpu", window=window)
  if impl == "xla" and window is not None and local_attention.worthwhile(q.shape[1], window):
    return local_attention.blocked_attention(q, k, v, mask, segments, window)
  allowed = allowed_keys(mask, segments, window)
  if impl == "cudnn":
    # cuDNN takes a mask as an additive [B, 1, T, S] bias: the key mask is broadcast over the queries.
    b, t = mask.shape
    allowed = jnp.broadcast_to(allowed, (b, 1, t, t))
    return jax.nn.dot_product_attention(q, k, v, mask=allowed, implementation="cudnn")
  return xla_attention(q, k, v, allowed)


def _splash_modules():
  """Pallas' splash attention (kernel, masks), imported when first used: Pallas costs every model a second."""
  # pylint: disable=g-import-not-at-top
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as kernel
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
  return kernel, masks


def splash_block_sizes(length: int):
  """Splash's tiles for a length that is a multiple of 128: the largest of 512, 256, 128 that divides it, in
  every pass (forward, dK/dV, dQ)."""
  splash, _ = _splash_modules()
  block = next(b for b in _SPLASH_BLOCKS if length % b == 0)
  return splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                           block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)


def splash_attention(q: Array, k: Array, v: Array, segments: Array, interpret: bool = False,
                     window: int | None = None) -> Array:
  """Splash attention of q, k, v [B, T, N, D] within segments [B, T] (int32, equal ids attend to each other) and,
  with a `window`, within that many tokens on either side (splash's `LocalMask`, both bounds inclusive, as
  transformers' sliding window): the kernel skips the blocks outside it.

  The kernel neither scales the logits nor takes lengths off its blocks, so q is scaled here (exactly, for a
  power-of-two scale such as BERT's 1/8) and the rows are padded to a multiple of 128 in a segment of their own.
  Head sizes below 128 (BERT's 64) go in as they are: Mosaic compiles them for TPU (checked by AOT compilation
  for v5e), the kernel's tiles padding the lanes. Under a mesh the kernel
  runs in `shard_map` over the mesh axes that the logical rules give `activation_batch` and `activation_heads`
  (an axis that does not divide its dimension is left out), each device on its own rows and heads.
  """
  splash, masks = _splash_modules()
  b, t, n, d = q.shape
  q = q * jnp.asarray(1 / math.sqrt(d), q.dtype)
  padded = -(-t // SPLASH_LANES) * SPLASH_LANES
  if padded != t:
    pad = lambda x, value=0: jnp.pad(x, [(0, 0), (0, padded - t)] + [(0, 0)] * (x.ndim - 2), constant_values=value)
    # The added positions form a segment of their own (-1), so every original token, padding included, attends
    # to exactly the keys it would unpadded.
    q, k, v, segments = pad(q), pad(k), pad(v), pad(segments, -1)
  q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))  # [B, N, T', D]: the kernel's layout per row
  segments = segments.astype(jnp.int32)
  blocks = splash_block_sizes(padded)

  def local(q, k, v, segments):  # [b, n, T', D] x 3, [b, T']: one device's rows and heads
    heads = q.shape[1]
    shape = (padded, padded)
    head_mask = masks.FullMask(shape) if window is None else masks.LocalMask(shape, (window, window), offset=0)
    kernel = splash.make_splash_mha_single_device(
        masks.MultiHeadMask([head_mask] * heads), block_sizes=blocks, interpret=interpret)
    per_row = lambda q, k, v, s: kernel(q, k, v, segment_ids=splash.SegmentIds(q=s, kv=s))  # [n, T', D]
    return jax.vmap(per_row)(q, k, v, segments)

  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    out = local(q, k, v, segments)
  else:
    rows, heads = _mesh_axes(mesh, nn.logical_to_mesh_axes((BATCH, HEADS)), (b, n))
    spec = jax.sharding.PartitionSpec(rows, heads, None, None)
    out = jax.shard_map(local, in_specs=(spec, spec, spec, jax.sharding.PartitionSpec(rows, None)),
                        out_specs=spec, check_vma=False)(q, k, v, segments)
  return out.transpose(0, 2, 1, 3)[:, :t]  # [B, T, N, D]


def _mesh_axes(mesh, spec, dims):
  """The entries of `spec` whose mesh axes divide their dimension in `dims`; the others None (replicated)."""
  fitted = []
  for axes, dim in zip(tuple(spec) + (None,) * (len(dims) - len(spec)), dims):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    fitted.append(axes if names and dim % math.prod(mesh.shape[a] for a in names) == 0 else None)
  return fitted
