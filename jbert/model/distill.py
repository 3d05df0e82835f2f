"""Knowledge-distillation losses, each as a `(sum, weight)` pair so that callers normalise over the global batch.

`sum / weight` over a batch is the reference implementation's loss on that batch; a caller adds both up over
micro-batches and devices and divides once. `weights` (per example, per token: 1 counts, 0 does not) default to
ones. The teacher's side gets no gradient (`stop_gradient`), everything is computed in float32.

  soft_target_sums    Hinton / DistilBERT: T^2 KL(softmax(teacher / T) || softmax(student / T)) per example; equal to
                      `nn.KLDivLoss(reduction='batchmean')(log_softmax(s / T), softmax(t / T)) * T**2`
  cosine_sums         DistilBERT's hidden-state loss: 1 - cos(student, teacher) per vector (`nn.CosineEmbeddingLoss`
                      with target 1 over the attended tokens)
  mse_sums            mean over the last axis of (student - teacher)^2 per vector: TinyBERT's hidden-state MSE (after
                      `HiddenProjection` when the widths differ) and sentence-transformers' `MSELoss` of bi-encoder
                      embeddings (`nn.MSELoss()` over [B, D])
  relation_kl_sums    MiniLM: KL(teacher || student) of self-attention relations per query token, mean over relation
                      heads: the attention distributions (`attention_log_probs` of the model's attentions) and the
                      value relations (`relation_log_probs` of `attention_projection(..., "value")`, MiniLM v1), or
                      query/key/value relations over any number of relation heads (MiniLM v2)

The functions are jitted (inlined under a caller's jit; `temperature`, `name` and `num_heads` are static).
`HiddenProjection` is TinyBERT's learned W_h from the student's width to the teacher's; `uniform_layer_map` its
mapping of student to teacher hidden states.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from jbert.model.layers import DenseGeneral

Array = jax.Array
# Masked relation logits: far below any real one, yet finite, so masked keys get probability 0 and no NaN gradient.
_MASKED = -1e9


def _prepare(student: Array, teacher: Array, weights: Array | None, name: str) -> tuple[Array, Array, Array]:
  if student.shape != teacher.shape:
    raise ValueError(f"{name}: student {student.shape} and teacher {teacher.shape} must have the same shape; map the "
                     "teacher's layers (and project hidden states with HiddenProjection) first.")
  lead = student.shape[:-1]
  weights = jnp.ones(lead, jnp.float32) if weights is None else jnp.asarray(weights).astype(jnp.float32)
  if weights.shape != lead:
    raise ValueError(f"{name}: weights {weights.shape} must have the leading shape {lead} of the inputs.")
  teacher = jax.lax.stop_gradient(jnp.asarray(teacher).astype(jnp.float32))
  return jnp.asarray(student).astype(jnp.float32), teacher, weights


def _kl(teacher_log_probs: Array, student_log_probs: Array) -> Array:
  """KL(p_t || p_s) over the last axis; classes the teacher gives probability 0 add 0 (not 0 * -inf)."""
  p = jnp.exp(teacher_log_probs)
  return jnp.sum(jnp.where(p > 0, p * (teacher_log_probs - student_log_probs), 0.0), axis=-1)


@functools.partial(jax.jit, static_argnames=("temperature",))
def soft_target_sums(student_logits: Array, teacher_logits: Array, weights: Array | None = None, *,
                     temperature: float = 1.0) -> tuple[Array, Array]:
  """(Σ w T^2 KL(softmax(teacher / T) || softmax(student / T)), Σ w) over logits [..., C] and weights [...].

  The T^2 keeps the soft targets' gradients at the scale of the hard loss's as T changes (Hinton et al., 2015).
  Logits [B, C] with weights [B] are classification; [B, T, C] with the token mask, token classification.
  """
  if not temperature > 0:
    raise ValueError(f"distillation temperature must be positive, got {temperature!r}.")
  if student_logits.shape[-1] == 1:
    raise ValueError("soft targets over one logit (a regression head) are always 0; distil a regression head with "
                     "mse_sums on its logits.")
  student, teacher, weights = _prepare(student_logits, teacher_logits, weights, "soft_target_sums")
  kl = _kl(jax.nn.log_softmax(teacher / temperature, -1), jax.nn.log_softmax(student / temperature, -1))
  return jnp.sum(weights * kl) * temperature ** 2, jnp.sum(weights)


@jax.jit
def cosine_sums(student: Array, teacher: Array, weights: Array | None = None) -> tuple[Array, Array]:
  """(Σ w (1 - cos(student, teacher)), Σ w) over vectors [..., H] and weights [...].

  The cosine is torch's: x.y / sqrt((|x|^2 + 1e-12)(|y|^2 + 1e-12)), so a zero vector gives 0, not NaN.
  """
  student, teacher, weights = _prepare(student, teacher, weights, "cosine_sums")
  dot = jnp.sum(student * teacher, -1)
  norms = jnp.sqrt((jnp.sum(student * student, -1) + 1e-12) * (jnp.sum(teacher * teacher, -1) + 1e-12))
  return jnp.sum(weights * (1.0 - dot / norms)), jnp.sum(weights)


@jax.jit
def mse_sums(student: Array, teacher: Array, weights: Array | None = None) -> tuple[Array, Array]:
  """(Σ w mean_d (student - teacher)^2, Σ w) over vectors [..., D] and weights [...]."""
  student, teacher, weights = _prepare(student, teacher, weights, "mse_sums")
  return jnp.sum(weights * jnp.mean(jnp.square(student - teacher), -1)), jnp.sum(weights)


class HiddenProjection(nn.Module):
  """TinyBERT's W_h: a learned dense layer from the student's hidden width to the teacher's (`features`).

  Its kernel [H_student, H_teacher] has logical axes ('embed', None): both widths are hidden sizes, and one
  mesh axis cannot shard two axes of one array. Initialised as BERT's dense layers (normal(0.02), zero bias).
  """
  features: int
  init_std: float = 0.02
  param_dtype: Any = jnp.float32

  @nn.compact
  def __call__(self, hidden: Array) -> Array:
    """hidden [..., H_student] -> [..., features] in float32."""
    dense = DenseGeneral(features=(self.features,), kernel_axes=("embed", None), init_std=self.init_std,
                         param_dtype=self.param_dtype, name="dense")
    return dense(hidden.astype(jnp.float32))


def uniform_layer_map(student_layers: int, teacher_layers: int) -> tuple[int, ...]:
  """TinyBERT's uniform mapping: for each student hidden state m = 0..M (0: the embeddings), the teacher hidden
  state m * N // M it learns from, so the last maps to the last (12 -> 6 layers: 0, 2, 4, ..., 12)."""
  if not 0 < student_layers <= teacher_layers:
    raise ValueError(f"A student of {student_layers} layers cannot map onto a teacher of {teacher_layers}; the student "
                     "needs between 1 and the teacher's number of layers.")
  return tuple(m * teacher_layers // student_layers for m in range(student_layers + 1))


# ------------------------------------------------------------------------------------------------- MiniLM relations
@jax.jit
def attention_log_probs(attentions: Array) -> Array:
  """Log of attention probabilities [B, N, T, T] (the model's `attentions`); zeros (masked keys) become log(tiny),
  finite, so a student's masked keys give no NaN, and a teacher's add at most ~1e-36 to `relation_kl_sums`."""
  probs = jnp.asarray(attentions).astype(jnp.float32)
  return jnp.log(jnp.maximum(probs, jnp.finfo(jnp.float32).tiny))


@functools.partial(jax.jit, static_argnames=("name",))
def attention_projection(attention_params: Mapping[str, Any], hidden: Array, name: str = "value") -> Array:
  """The `query`, `key` or `value` projection [B, T, N, D] a layer computes from its input hidden state [B, T, H].

  attention_params: one layer's `attention` subtree (`layer_params(params, i)["attention"]`, jbert.model.student);
  hidden: that layer's input, `hidden_states[i]` of the model's output. The model does not return its values, and
  this recomputes them exactly (in float32), for either parameter layout.
  """
  kernel = jnp.asarray(attention_params[name]["kernel"]).astype(jnp.float32)  # [H, N, D]
  bias = jnp.asarray(attention_params[name]["bias"]).astype(jnp.float32)  # [N, D]
  return jnp.einsum("bth,hnd->btnd", hidden.astype(jnp.float32), kernel) + bias  # [B, T, N, D]


@functools.partial(jax.jit, static_argnames=("num_heads",))
def relation_log_probs(x: Array, mask: Array, num_heads: int | None = None) -> Array:
  """MiniLM's self-attention relation: log softmax over keys of x_q . x_k / sqrt(d) per relation head, [B, R, T, T].

  x: [B, T, N, D] (the model's heads, MiniLM v1's value relation) or [B, T, H]; `num_heads` re-splits the
  concatenated width into R heads (MiniLM v2, so teacher and student relations match whatever their head counts);
  mask [B, T]: keys outside it get probability 0.
  """
  x = jnp.asarray(x).astype(jnp.float32)
  b, t = x.shape[:2]
  if num_heads is not None:
    width = math.prod(x.shape[2:])
    if width % num_heads:
      raise ValueError(f"relation_log_probs: width {width} does not split into {num_heads} relation heads.")
    x = x.reshape(b, t, num_heads, width // num_heads)
  elif x.ndim != 4:
    raise ValueError(f"relation_log_probs: x must be [B, T, N, D], or [B, T, H] with num_heads; got {x.shape}.")
  logits = jnp.einsum("bqrd,bkrd->brqk", x, x) / math.sqrt(x.shape[-1])  # [B, R, T, T]
  logits = jnp.where(jnp.asarray(mask, bool)[:, None, None, :], logits, _MASKED)
  return jax.nn.log_softmax(logits, -1)


@jax.jit
def relation_kl_sums(teacher_log_probs: Array, student_log_probs: Array, mask: Array) -> tuple[Array, Array]:
  """(Σ over the mask's query tokens of mean over heads of KL(teacher || student), Σ mask) for relations
  [B, R, T, T] (R equal on both sides) and the token mask [B, T].

  MiniLM averages over heads and the example's tokens, then over the batch; this averages over the batch's tokens,
  the same when the rows are equally long.
  """
  if teacher_log_probs.shape != student_log_probs.shape:
    raise ValueError(f"relation_kl_sums: teacher {teacher_log_probs.shape} and student {student_log_probs.shape} "
                     "relations differ; give both the same number of relation heads (num_heads).")
  teacher = jax.lax.stop_gradient(jnp.asarray(teacher_log_probs).astype(jnp.float32))
  kl = jnp.mean(_kl(teacher, jnp.asarray(student_log_probs).astype(jnp.float32)), axis=1)  # [B, T]
  weights = jnp.asarray(mask).astype(jnp.float32)
  return jnp.sum(weights * kl), jnp.sum(weights)
