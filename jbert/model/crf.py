"""A linear-chain CRF over per-position tag scores: log-likelihood and Viterbi decoding, under transition constraints.

Parameters of `CRF` (pytorch-crf's names and layout, so its state dicts map one to one; AllenNLP has the same three):

  transitions        [C, C]  score of tag j right after tag i (row: the previous tag)
  start_transitions  [C]     score of a sequence starting with tag j
  end_transitions    [C]     score of a sequence ending with tag j

Their logical axes are None: a few hundred numbers, replicated on every device. They start at zero (pytorch-crf draws
uniform(-0.1, 0.1), AllenNLP Xavier-normal): at zero transitions and without constraints the log-likelihood is exactly
the sum of the positions' log-softmax, so a fresh CRF head starts where the softmax head does (with constraints, the
softmax renormalised over the allowed sequences), and the init needs no random key. Every operation is per row, so
batch-sharded inputs stay sharded.

`mask` [B, T] marks the positions the chain runs over, in order; the others are skipped exactly (the chain goes from
one marked position straight to the next), as NER needs when only each word's first sub-token is scored. A row with
no marked position has log-likelihood 0, finite gradients, Viterbi score 0 and every tag `fill_value`. Tags at
unmarked positions are never read (-100, the ignore index, is fine).

`Constraints` (`jbert.model.tagging_schemes`: IOB2, IOBES or IO from the label names) forbid transitions. The
forward algorithm gives a forbidden transition the score NEG = -1e4, as AllenNLP does: exp(NEG) is 0 in float32, so
the partition function is the sum over allowed sequences (while logits stay far below 1e4), and nothing is -inf, so
gradients stay finite even for a gold sequence that breaks a constraint (its loss is then ~1e4; `violations` finds
such rows). Viterbi uses -inf, so no decoded sequence ever takes a forbidden transition.

Every algorithm adds a virtual start state (index C): the start scores are its transitions, nothing goes back to it,
and its end score is 0. A chain that never leaves it is the empty row, which therefore needs no special case.
Everything runs in float32 whatever the emissions' dtype.
"""
from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jbert.model.tagging_schemes import Constraints

Array = jax.Array
NEG = -1e4


@flax.struct.dataclass
class Potentials:
  """The CRF's scores: transitions [C, C] (previous tag, next tag), start [C], end [C]."""
  transitions: Array
  start: Array
  end: Array


# ---------------------------------------------------------------------------------------------------- algorithms
def _augmented(potentials: Potentials, constraints: Constraints | None, forbidden: float) -> tuple[Array, Array]:
  """(transitions [K, K], end [K]) over the tags and the virtual start state K - 1, forbidden entries `forbidden`."""
  trans = potentials.transitions.astype(jnp.float32)
  start, end = potentials.start.astype(jnp.float32), potentials.end.astype(jnp.float32)
  if constraints is not None:
    allowed, allowed_start, allowed_end = constraints.arrays()
    trans = jnp.where(allowed, trans, forbidden)
    start, end = jnp.where(allowed_start, start, forbidden), jnp.where(allowed_end, end, forbidden)
  c = trans.shape[0]
  into_start = jnp.full((c + 1, 1), forbidden, jnp.float32)  # nothing goes back to the start state
  trans = jnp.concatenate([jnp.concatenate([trans, start[None]], 0), into_start], 1)  # [K, K]
  return trans, jnp.concatenate([end, jnp.zeros((1,), jnp.float32)])  # [K, K], [K]


def _check(emissions, mask, tags, potentials: Potentials, constraints: Constraints | None) -> None:
  """Shapes and dtypes always; tag values when the arrays are concrete (not under the caller's `jax.jit`)."""
  if emissions.ndim != 3 or mask.shape != emissions.shape[:2] or (tags is not None and tags.shape != mask.shape):
    raise ValueError(f"CRF inputs: emissions must be [B, T, C] and mask (and tags) [B, T]; got emissions "
                     f"{emissions.shape}, mask {mask.shape}" + ("" if tags is None else f", tags {tags.shape}") + ".")
  c = emissions.shape[-1]
  if potentials.transitions.shape != (c, c):
    raise ValueError(f"CRF: emissions have {c} tags but the transitions are {potentials.transitions.shape}.")
  if constraints is not None and constraints.num_tags != c:
    raise ValueError(f"CRF: constraints for {constraints.num_tags} tags used with {c} tags.")
  if tags is not None:
    if not jnp.issubdtype(tags.dtype, jnp.integer):
      raise ValueError(f"CRF tags must be integers, got {tags.dtype}.")
    if not isinstance(tags, jax.core.Tracer) and not isinstance(mask, jax.core.Tracer):
      marked = np.asarray(tags)[np.asarray(mask).astype(bool)]
      bad = marked[(marked < 0) | (marked >= c)]
      if bad.size:
        raise ValueError(f"CRF tags at marked positions must lie in [0, {c}); found {int(bad[0])}. Mask out the "
                         "positions that carry no tag.")


def _steps(emissions: Array) -> Array:
  """Emissions [B, T, C] -> [T, B, K] in float32, with the start state's column NEG (it is never emitted)."""
  e = emissions.astype(jnp.float32)
  e = jnp.concatenate([e, jnp.full(e.shape[:2] + (1,), NEG, jnp.float32)], -1)  # [B, T, K]
  return jnp.swapaxes(e, 0, 1)


def log_partition(emissions: Array, mask: Array, potentials: Potentials, constraints: Constraints | None = None,
                  *, parallel: bool = False) -> Array:
  """log Z [B]: logsumexp over every tag sequence of the marked positions of its score (forward algorithm).

  `parallel=False` runs a `lax.scan` over T (T steps of a [B, K, K] logsumexp); `parallel=True` multiplies the
  positions' [K, K] matrices in the log semiring as a balanced tree (log2 T steps, K times the work), meant for
  accelerators, where a sequential loop is latency-bound; on CPU the scan is ~50x faster (bench/crf.py).
  """
  emissions, mask, potentials = _arrays(emissions, mask, potentials)
  _check(emissions, mask, None, potentials, constraints)
  return _log_partition(emissions, mask, potentials, constraints, parallel)


def sequence_score(emissions: Array, tags: Array, mask: Array, potentials: Potentials,
                   constraints: Constraints | None = None) -> Array:
  """[B]: the score of `tags` over the marked positions (emissions + start + transitions between consecutive marked
  positions + end); a forbidden transition adds NEG, as in `log_partition`."""
  emissions, mask, potentials = _arrays(emissions, mask, potentials)
  tags = jnp.asarray(tags)
  _check(emissions, mask, tags, potentials, constraints)
  return _sequence_score(emissions, tags, mask, potentials, constraints)


def log_likelihood(emissions: Array, tags: Array, mask: Array, potentials: Potentials,
                   constraints: Constraints | None = None, *, parallel: bool = False) -> Array:
  """log p(tags | emissions) [B] over the marked positions; 0 for rows with none. The loss is its negative."""
  emissions, mask, potentials = _arrays(emissions, mask, potentials)
  tags = jnp.asarray(tags)
  _check(emissions, mask, tags, potentials, constraints)
  return _log_likelihood(emissions, tags, mask, potentials, constraints, parallel)


def viterbi_decode(emissions: Array, mask: Array, potentials: Potentials, constraints: Constraints | None = None,
                   *, fill_value: int = -1) -> tuple[Array, Array]:
  """(tags int32 [B, T], score [B]): the highest-scoring allowed sequence over the marked positions, `fill_value` at
  the others; its score is `sequence_score` of those tags (0 for an empty row, -inf if the constraints leave no
  sequence of that row's length). Ties go to the lower tag index."""
  emissions, mask, potentials = _arrays(emissions, mask, potentials)
  _check(emissions, mask, None, potentials, constraints)
  return _viterbi(emissions, mask, potentials, constraints, int(fill_value))


def violations(tags: Array, mask: Array, constraints: Constraints) -> Array:
  """bool [B]: whether the tags of a row's marked positions take a transition (or start or end) that `constraints`
  forbid; for checking gold tags (IOB1 data under IOB2 constraints) before training on them."""
  allowed, allowed_start, allowed_end = constraints.arrays()
  penalty = lambda ok: np.where(ok, 0.0, NEG).astype(np.float32)
  potentials = Potentials(penalty(allowed), penalty(allowed_start), penalty(allowed_end))
  tags, mask = jnp.asarray(tags), jnp.asarray(mask)
  zeros = jnp.zeros(tuple(tags.shape) + (constraints.num_tags,), jnp.float32)
  return sequence_score(zeros, tags, mask, potentials) < NEG / 2


def _arrays(emissions, mask, potentials: Potentials):
  return jnp.asarray(emissions), jnp.asarray(mask), jax.tree.map(jnp.asarray, potentials)


# The checked functions above call these compiled ones: eager calls then compile once per shape, and under a caller's
# jit they are inlined.
@functools.partial(jax.jit, static_argnums=(3, 4))
def _log_partition(emissions, mask, potentials, constraints, parallel):
  trans, end = _augmented(potentials, constraints, NEG)
  e, m = _steps(emissions), jnp.swapaxes(mask.astype(bool), 0, 1)  # [T, B, K], [T, B]
  k = trans.shape[0]
  if parallel:
    return _tree_log_partition(e, m, trans, end)
  alpha0 = jnp.full((e.shape[1], k), NEG, jnp.float32).at[:, k - 1].set(0.0)  # [B, K]: in the start state

  def step(alpha, xs):
    e_t, m_t = xs  # [B, K], [B]
    nxt = jax.nn.logsumexp(alpha[:, :, None] + trans[None], axis=1) + e_t  # [B, K(prev), K(next)] -> [B, K]
    return jnp.where(m_t[:, None], nxt, alpha), None

  alpha, _ = jax.lax.scan(step, alpha0, (e, m))
  return jax.nn.logsumexp(alpha + end, axis=-1)


def _log_matmul(a: Array, b: Array) -> Array:
  """[..., K, K] x [..., K, K] in the (logsumexp, +) semiring."""
  return jax.nn.logsumexp(a[..., :, :, None] + b[..., None, :, :], axis=-2)  # [..., K(i), K(j), K(l)] -> [..., K, K]


def _tree_log_partition(e: Array, m: Array, trans: Array, end: Array) -> Array:
  t, b, k = e.shape
  identity = jnp.where(jnp.eye(k, dtype=bool), 0.0, NEG).astype(jnp.float32)  # a skipped position
  mats = jnp.where(m[:, :, None, None], trans[None, None] + e[:, :, None, :], identity)  # [T, B, K, K]
  width = 1 << max(t - 1, 0).bit_length()
  mats = jnp.concatenate([mats, jnp.broadcast_to(identity, (width - t, b, k, k))], 0)
  while mats.shape[0] > 1:
    mats = _log_matmul(mats[0::2], mats[1::2])  # [T/2, B, K, K]: neighbours multiplied, order kept
  return jax.nn.logsumexp(mats[0, :, k - 1] + end, axis=-1)  # from the start state, to the end


@functools.partial(jax.jit, static_argnums=(4,))
def _sequence_score(emissions, tags, mask, potentials, constraints):
  trans, end = _augmented(potentials, constraints, NEG)
  b, t, c = emissions.shape
  mask = mask.astype(bool)
  safe = jnp.where(mask, tags, 0).astype(jnp.int32)  # [B, T]
  emitted = jnp.take_along_axis(emissions.astype(jnp.float32), safe[..., None], -1)[..., 0]  # [B, T]
  # The marked tags moved to the front of the row, in order, after the start state: [B, 1 + T].
  order = jnp.argsort(~mask, axis=1, stable=True)
  chain = jnp.concatenate([jnp.full((b, 1), c, jnp.int32), jnp.take_along_axis(safe, order, 1)], 1)
  count = jnp.sum(mask, axis=1)  # [B]
  steps = trans[chain[:, :-1], chain[:, 1:]]  # [B, T]: start state -> first, first -> second, ...
  last = jnp.take_along_axis(chain, count[:, None], 1)[:, 0]  # the start state for an empty row: end score 0
  taken = jnp.arange(t) < count[:, None]  # [B, T]: the row's count of steps
  return jnp.sum(jnp.where(mask, emitted, 0.0), 1) + jnp.sum(jnp.where(taken, steps, 0.0), 1) + end[last]


@functools.partial(jax.jit, static_argnums=(4, 5))
def _log_likelihood(emissions, tags, mask, potentials, constraints, parallel):
  return (_sequence_score(emissions, tags, mask, potentials, constraints)
          - _log_partition(emissions, mask, potentials, constraints, parallel))


@functools.partial(jax.jit, static_argnums=(3, 4))
def _viterbi(emissions, mask, potentials, constraints, fill_value):
  trans, end = _augmented(potentials, constraints, -jnp.inf)
  e, m = _steps(emissions), jnp.swapaxes(mask.astype(bool), 0, 1)  # [T, B, K], [T, B]
  e = e.at[..., -1].set(-jnp.inf)
  b, k = e.shape[1], trans.shape[0]
  stay = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, k))  # a skipped position points to itself

  def forward(delta, xs):
    e_t, m_t = xs  # [B, K], [B]
    scores = delta[:, :, None] + trans[None]  # [B, K(prev), K(next)]
    best = jnp.argmax(scores, axis=1).astype(jnp.int32)  # [B, K]
    nxt = jnp.max(scores, axis=1) + e_t
    return jnp.where(m_t[:, None], nxt, delta), jnp.where(m_t[:, None], best, stay)

  delta0 = jnp.full((b, k), -jnp.inf, jnp.float32).at[:, k - 1].set(0.0)
  delta, back = jax.lax.scan(forward, delta0, (e, m))  # back: [T, B, K]
  final = delta + end
  last = jnp.argmax(final, axis=-1).astype(jnp.int32)  # [B]

  def backward(state, xs):
    back_t, m_t = xs
    tag = jnp.where(m_t, state, fill_value)
    return jnp.take_along_axis(back_t, state[:, None], 1)[:, 0], tag

  _, tags = jax.lax.scan(backward, last, (back, m), reverse=True)  # [T, B]
  return jnp.swapaxes(tags, 0, 1).astype(jnp.int32), jnp.max(final, axis=-1)


# -------------------------------------------------------------------------------------------------------- module
def _zeros(shape_axes):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), shape_axes)


class CRF(nn.Module):
  """A linear-chain CRF layer over `num_tags` tags, its transitions as parameters (see the module docstring).

  `__call__(emissions, tags, mask)` is `log_likelihood`, so `CRF(C).init(key, emissions, tags, mask)` creates the
  parameters; a head calls `crf.log_likelihood(...)` for the loss and `crf.decode(...)` for predictions.
  """
  num_tags: int
  constraints: Constraints | None = None
  parallel: bool = False  # the tree form of the forward algorithm (accelerators); the scan otherwise
  param_dtype: Any = jnp.float32

  def setup(self):
    if self.constraints is not None and self.constraints.num_tags != self.num_tags:
      raise ValueError(f"CRF: constraints for {self.constraints.num_tags} tags given to a CRF of {self.num_tags}.")
    c = self.num_tags
    self.transitions = self.param("transitions", _zeros((None, None)), (c, c), self.param_dtype)
    self.start_transitions = self.param("start_transitions", _zeros((None,)), (c,), self.param_dtype)
    self.end_transitions = self.param("end_transitions", _zeros((None,)), (c,), self.param_dtype)

  def potentials(self) -> Potentials:
    return Potentials(self.transitions, self.start_transitions, self.end_transitions)

  def __call__(self, emissions: Array, tags: Array, mask: Array) -> Array:
    return self.log_likelihood(emissions, tags, mask)

  def log_likelihood(self, emissions: Array, tags: Array, mask: Array) -> Array:
    """emissions [B, T, C], tags int [B, T], mask [B, T] -> log p(tags) [B] (float32)."""
    return log_likelihood(emissions, tags, mask, self.potentials(), self.constraints, parallel=self.parallel)

  def decode(self, emissions: Array, mask: Array, fill_value: int = -1) -> tuple[Array, Array]:
    """emissions [B, T, C], mask [B, T] -> (Viterbi tags int32 [B, T], `fill_value` where unmarked; score [B])."""
    return viterbi_decode(emissions, mask, self.potentials(), self.constraints, fill_value=fill_value)
