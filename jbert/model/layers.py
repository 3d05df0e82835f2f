"""BERT building blocks: embeddings, self-attention, feed-forward and the post-LN encoder layer.

Every parameter carries logical axis names (docs/ARCHITECTURE.md) and every large activation a logical
sharding constraint; both are no-ops until `jbert.runtime.sharding` supplies a mesh and rules. Initialisation
follows BERT: normal(initializer_range) kernels and embeddings (plain normal, as Hugging Face; the original
TF code truncates at 2 sigma), zero biases, unit LayerNorm scales.
"""
from __future__ import annotations

import functools
import math
from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jbert.model import attention as attention_lib
from jbert.model import rotary, threefry
from jbert.model.axes import BATCH, EMBED, HEADS, KV, LENGTH, MLP, TRANSFORM  # noqa: F401  (heads use them)
from jbert.model.config import BertConfig

Array = jax.Array


def _gelu_erf(x: Array) -> Array:
  # BERT's and PyTorch's formula. jax.nn.gelu(approximate=False) goes through erfc, which XLA:CPU evaluates
  # several times slower than erf.
  return 0.5 * x * (1.0 + jax.lax.erf(x * math.sqrt(0.5)))


def activation(name: str) -> Callable[[Array], Array]:
  """BERT's `hidden_act`: "gelu" is exact (erf); "gelu_new" / "gelu_pytorch_tanh" the tanh approximation."""
  if name == "gelu":
    return _gelu_erf
  if name in ("gelu_new", "gelu_pytorch_tanh"):
    return functools.partial(jax.nn.gelu, approximate=True)
  if name == "relu":  # DistilBERT's `activation` option and its pre_classifier
    return jax.nn.relu
  if name == "tanh":  # BERT's pooler
    return jnp.tanh
  raise ValueError(f"hidden_act={name!r} is not supported; use gelu, gelu_new, gelu_pytorch_tanh or relu.")


class Dropout(nn.Module):
  """Inverted dropout drawing two 16-bit uniforms from each 32-bit random word.

  Random bits are a visible share of a CPU train step (a BERT-base step drops ~40M elements, most of them
  attention probabilities), and `nn.Dropout` spends a whole threefry word per element: two 16-bit draws per word
  halve that work. The words come from `threefry.random_bits`, which XLA fuses into the select below rather
  than storing them.
  An element is dropped when its 16-bit draw is below `round(rate * 2**16)`, so the realised rate is that
  count / 2**16 (0.1 -> 0.100006), and kept elements are scaled by the inverse of the realised keep
  probability, so the expectation is exactly the input. Bits are drawn over the input's own leading axes, so a
  sharded activation gets a mask sharded alike.
  """
  rate: float

  @nn.compact
  def __call__(self, x: Array, deterministic: bool) -> Array:
    if deterministic or self.rate == 0.0:
      return x
    dropped = round(self.rate * _UNIFORM16)
    if dropped >= _UNIFORM16:
      return jnp.zeros_like(x)
    *lead, last = x.shape or (1,)
    words = threefry.random_bits(self.make_rng("dropout"), (*lead, (last + 1) // 2))
    draws = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(*lead, -1)[..., :last]  # [..., last]
    # Scaled in at least float32, so a bfloat16 input is rounded once rather than scaled by a rounded factor.
    wide = jnp.promote_types(x.dtype, jnp.float32)
    kept = (x.astype(wide) * (_UNIFORM16 / (_UNIFORM16 - dropped))).astype(x.dtype)
    return jnp.where(draws.reshape(x.shape) >= dropped, kept, jnp.zeros_like(x))


_UNIFORM16 = 1 << 16


def init_std(config: BertConfig, role: str = "in") -> float:
  """The standard deviation of a new kernel: initializer_range; with `scaled_init` (ModernBERT's, after Megatron)
  the kernels writing into the residual stream and the heads' dense ("out") at initializer_range / sqrt(2 L),
  the classifiers ("final") at hidden_size ** -0.5."""
  if not config.scaled_init or role == "in":
    return config.initializer_range
  if role == "out":
    return config.initializer_range / math.sqrt(2 * config.num_hidden_layers)
  return config.hidden_size ** -0.5


def normal_init(std: float, cutoff: float | None):
  """normal(std), cut at `cutoff` std devs where given (transformers' trunc_normal_ bounds, no rescaling)."""
  if cutoff is None:
    return nn.initializers.normal(std)
  return nn.initializers.truncated_normal(std, lower=-cutoff, upper=cutoff)


def kernel_init(config: BertConfig, axes: tuple[str | None, ...]):
  return nn.with_logical_partitioning(normal_init(config.initializer_range, config.initializer_cutoff_factor), axes)


def zeros_init(axes: tuple[str | None, ...]):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), axes)


class DenseGeneral(nn.Module):
  """`x @ kernel + bias` contracting the trailing `axis` of x with the leading kernel axes.

  Unlike `nn.DenseGeneral`, the kernel is created in its final N-d shape (e.g. [H, N, D]): Flax's version
  initialises a flattened kernel and reshapes it, so a 3-name logical partitioning would be applied to a
  rank-2 array and fail as soon as a mesh is active. The product itself is one 2-D matmul over flattened
  views: for the backward of an N-d kernel XLA:CPU makes a transposed copy of the kernel, a 2-D kernel it
  takes as it is. With the default rules no flattened group has a sharded axis after its first, so the
  shardings carry over without communication.
  """
  features: tuple[int, ...]
  kernel_axes: tuple[str | None, ...]
  axis: tuple[int, ...] = (-1,)
  init_std: float = 0.02
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  use_bias: bool = True
  init_cutoff: float | None = None

  @nn.compact
  def __call__(self, x: Array) -> Array:
    axis = tuple(a % x.ndim for a in self.axis)
    lead = x.ndim - len(axis)
    if axis != tuple(range(lead, x.ndim)):
      raise ValueError(f"DenseGeneral contracts trailing axes; got axis={self.axis} for an input of rank "
                       f"{x.ndim}. Move the contracted axes last.")
    in_shape = x.shape[lead:]
    kernel = self.param("kernel", nn.with_logical_partitioning(normal_init(self.init_std, self.init_cutoff),
                                                               self.kernel_axes),
                        in_shape + self.features, self.param_dtype)
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.dtype)
    k = math.prod(in_shape)
    y = (x.reshape(-1, k) @ kernel.reshape(k, -1)).reshape(x.shape[:lead] + self.features)  # [B * T, K] @ [K, F]
    if not self.use_bias:
      return y
    bias = self.param("bias", zeros_init(self.kernel_axes[len(in_shape):]), self.features, self.param_dtype)
    return y + jnp.asarray(bias, self.dtype)


def dense(config: BertConfig, features, axes: tuple[str | None, ...], name: str, axis=-1,
          use_bias: bool = True, role: str = "in") -> DenseGeneral:
  """A dense layer whose kernel has logical `axes` and whose bias (unless `use_bias` is False: ModernBERT's
  `*_bias` fields) takes the output axes; `role` ("in", "out", "final") picks its initial std (`init_std`)."""
  return DenseGeneral(
      features=features if isinstance(features, tuple) else (features,),
      axis=axis if isinstance(axis, tuple) else (axis,), kernel_axes=tuple(axes),
      init_std=init_std(config, role), init_cutoff=config.initializer_cutoff_factor, dtype=jnp.dtype(config.dtype),
      param_dtype=jnp.dtype(config.param_dtype), use_bias=use_bias, name=name)


def layer_norm(config: BertConfig, name: str) -> nn.LayerNorm:
  # Flax computes the mean and variance in at least float32 whatever `dtype` is.
  return nn.LayerNorm(
      epsilon=config.layer_norm_eps, use_bias=config.norm_bias, dtype=jnp.dtype(config.dtype),
      param_dtype=jnp.dtype(config.param_dtype),
      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
      bias_init=zeros_init(("embed",)), name=name)


def embed(config: BertConfig, num: int, axes: tuple[str | None, ...], name: str) -> nn.Embed:
  return nn.Embed(
      num, config.embedding_width, dtype=jnp.dtype(config.dtype), param_dtype=jnp.dtype(config.param_dtype),
      embedding_init=kernel_init(config, axes), name=name)


class BertEmbeddings(nn.Module):
  """word + position + token type embeddings, then LayerNorm and dropout; `embedding_width` wide (ELECTRA's
  `embedding_size`: BertModel projects them). Without `use_token_types` (DistilBERT) there is no token type
  table and token_type_ids are ignored; with one token type (RoBERTa) every token reads its one row
  (`BertConfig.reads_token_types`)."""
  config: BertConfig

  def setup(self):
    c = self.config
    self.word_embeddings = embed(c, c.vocab_size, ("vocab", "embed"), "word_embeddings")
    if c.rope_theta is None:  # else the layers rotate queries and keys by the positions (ModernBERT)
      self.position_embeddings = embed(c, c.max_position_embeddings, (None, "embed"), "position_embeddings")
    if c.use_token_types:
      self.token_type_embeddings = embed(c, c.type_vocab_size, (None, "embed"), "token_type_embeddings")
    self.norm = layer_norm(c, "norm")
    self.dropout = Dropout(c.hidden_dropout_prob)

  def __call__(self, input_ids: Array, token_type_ids: Array, deterministic: bool,
               position_ids: Array | None = None) -> Array:
    """position_ids [B, T]: rows of the position table (`encoder.table_positions`); default 0..T-1 in every row."""
    positions = jnp.arange(input_ids.shape[-1])[None] if position_ids is None else position_ids  # [1 | B, T]
    x = self.word_embeddings(input_ids)
    if self.config.use_token_types:
      x = x + self.token_type_embeddings(
          token_type_ids if self.config.reads_token_types else jnp.zeros_like(input_ids))
    if self.config.rope_theta is None:
      x = x + self.position_embeddings(positions)  # [B, T, E]
    x = nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))
    return self.dropout(self.norm(x), deterministic=deterministic)


class BertSelfAttention(nn.Module):
  """Multi-head self-attention with a key padding mask or segments, including the output projection; layer
  `index`'s rotary base and local window where the config sets them (`BertConfig.layer_rope_theta`,
  `layer_window`)."""
  config: BertConfig
  index: int = 0

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool, return_probs: bool = False,
               segments: Array | None = None, positions: Array | None = None):
    """x: [B, T, H]; mask: bool [B, T], True for keys that may be attended to; segments: None, or int32 [B, T]
    sequence ids of packed rows (0 = padding): a query then attends to its own segment only
    (`jbert.model.attention`); positions: int [B | 1, T], the rotary positions (None: 0..T-1).

    Returns the output [B, T, H], or `(output, probs)` with `return_probs`: the float32 attention
    probabilities [B, N, T, T] before dropout (rows sum to 1 over the allowed keys).
    """
    c = self.config
    qkv_shape = (c.num_attention_heads, c.head_dim)
    bias = c.attention_bias
    q = dense(c, qkv_shape, ("embed", "heads", "kv"), "query", use_bias=bias)(x)  # [B, T, N, D]
    k = dense(c, qkv_shape, ("embed", "heads", "kv"), "key", use_bias=bias)(x)  # [B, T, N, D]
    v = dense(c, qkv_shape, ("embed", "heads", "kv"), "value", use_bias=bias)(x)  # [B, T, N, D]
    theta, window = c.layer_rope_theta(self.index), c.layer_window(self.index)
    if theta is not None:
      positions = jnp.arange(x.shape[1])[None] if positions is None else positions  # [B | 1, T]
      q, k = rotary.rotate(q, positions, theta), rotary.rotate(k, positions, theta)
    q, k, v = (nn.with_logical_constraint(t, (BATCH, LENGTH, HEADS, KV)) for t in (q, k, v))
    # The fused kernels neither apply dropout to the probabilities nor return them, so training with attention
    # dropout and asking for the probabilities take the explicit einsum path; every path computes the same
    # function otherwise.
    probs = None
    platform = attention_lib.current_platform()
    impl = attention_lib.kernel(c, platform, x.shape[1], training=not deterministic, return_probs=return_probs)
    if impl == "einsum":
      drop = lambda p: Dropout(c.attention_probs_dropout_prob)(p, deterministic=deterministic)
      ctx, probs = attention_lib.einsum_attention(q, k, v, attention_lib.allowed_keys(mask, segments, window),
                                                  drop)
    else:
      attention_lib.check_platform(impl, platform, c.dtype, c.head_dim, x.shape[1])
      ctx = attention_lib.fused_attention(impl, q, k, v, mask, segments, platform, window=window)  # [B, T, N, D]
    ctx = nn.with_logical_constraint(ctx, (BATCH, LENGTH, HEADS, KV))
    out = dense(c, c.hidden_size, ("heads", "kv", "embed"), "out", axis=(-2, -1), use_bias=bias, role="out")(
        ctx)  # [B, T, H]
    out = nn.with_logical_constraint(out, (BATCH, LENGTH, EMBED))
    return (out, probs) if return_probs else out


class BertMlp(nn.Module):
  """Feed-forward block: wi (Hugging Face `intermediate.dense`), activation, wo (`output.dense`). With
  `gated_mlp` (ModernBERT's GeGLU) wi gives an input and a gate, [H, 2, F] so that a sharded F keeps each pair
  on one device, and the block is wo(act(input) * gate)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: Array) -> Array:
    c = self.config
    if c.gated_mlp:
      h = dense(c, (2, c.intermediate_size), ("embed", None, "mlp"), "wi", use_bias=c.mlp_bias)(x)  # [B, T, 2, F]
      h = activation(c.hidden_act)(h[..., 0, :]) * h[..., 1, :]  # [B, T, F]
    else:
      h = activation(c.hidden_act)(dense(c, c.intermediate_size, ("embed", "mlp"), "wi", use_bias=c.mlp_bias)(x))
    h = nn.with_logical_constraint(h, (BATCH, LENGTH, MLP))  # [B, T, F]
    return dense(c, c.hidden_size, ("mlp", "embed"), "wo", use_bias=c.mlp_bias, role="out")(h)  # [B, T, H]


class BertLayer(nn.Module):
  """Post-LN transformer layer exactly as BERT; with `pre_norm`, ModernBERT's pre-LN layer (norm, attention,
  residual; norm, MLP, residual), whose first layer (`index` 0) reads the embeddings' norm instead of its own.

  Unscanned it returns the output [B, T, H], or `(output, probs)` with `output_attentions`. `scanned=True` gives
  the `(carry, ys)` signature that `nn.scan` needs; `ys` holds what is asked to be collected per layer (the
  output when `collect_hidden`, the attention probabilities when `output_attentions`), None otherwise, so the
  scan stacks them along a leading [L] axis.
  """
  config: BertConfig
  scanned: bool = False
  collect_hidden: bool = False
  output_attentions: bool = False
  index: int = 0  # the layer's place in the stack: its attention window and rotary base, its first norm

  @nn.compact
  def __call__(self, x: Array, mask: Array, deterministic: bool, segments: Array | None = None,
               positions: Array | None = None):
    """positions: int [B | 1, T], what rotary attention rotates by (None: 0..T-1)."""
    c = self.config
    dropout = Dropout(c.hidden_dropout_prob)
    drop = lambda y: dropout(y, deterministic=deterministic)
    attention = BertSelfAttention(c, index=self.index, name="attention")
    h = x if not c.pre_norm or self.index == 0 else layer_norm(c, "attention_norm")(x)
    out = attention(h, mask, deterministic, return_probs=self.output_attentions, segments=segments,
                    positions=positions)
    attn, probs = out if self.output_attentions else (out, None)
    if c.pre_norm:
      x = x + drop(attn)
      x = x + drop(BertMlp(c, name="mlp")(layer_norm(c, "mlp_norm")(x)))
    else:
      x = layer_norm(c, "attention_norm")(x + drop(attn))
      x = layer_norm(c, "output_norm")(x + drop(BertMlp(c, name="mlp")(x)))
    x = nn.with_logical_constraint(x, (BATCH, LENGTH, EMBED))
    if self.scanned:
      ys = tuple(y for y, wanted in ((x, self.collect_hidden), (probs, self.output_attentions)) if wanted)
      return x, (ys or None)
    return (x, probs) if self.output_attentions else x
