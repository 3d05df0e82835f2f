"""The linear-chain CRF against brute-force enumeration of every tag sequence and pytorch-crf, with and without IOB2
constraints (the schemes themselves: test_tagging_schemes.py)."""
import itertools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torchcrf

from jbert.model import crf
from jbert.model import tagging_schemes

C = 3
# Non-prefix masks (NER's first sub-tokens), a full row, an empty row and a single position.
MASKS = np.array([[1, 1, 1, 1, 1], [0, 1, 0, 1, 1], [1, 0, 0, 1, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0]], bool)
B, T = MASKS.shape
# C = 3 as IOB2: O, B-X, I-X, so `I-X` may follow only B-X or I-X and may not start.
IOB2 = tagging_schemes.constraints_for(["O", "B-X", "I-X"])
# A constraint set no scheme gives: 0 never follows 2, 1 may not end, 2 may not start.
ODD = tagging_schemes.Constraints([[1, 1, 1], [1, 1, 1], [0, 1, 1]], start=[1, 1, 0], end=[1, 0, 1])


def _random(seed, b=B, t=T, c=C, scale=1.0):
  rng = np.random.default_rng(seed)
  emissions = (scale * rng.normal(size=(b, t, c))).astype(np.float32)
  potentials = crf.Potentials(*(rng.normal(size=s).astype(np.float32) for s in ((c, c), (c,), (c,))))
  return emissions, potentials


def _brute(emissions, mask, p, constraints=None):
  """{sequence: score} over every allowed tag sequence of the marked positions, in float64."""
  at = np.flatnonzero(mask)
  trans, start, end = (np.asarray(x, np.float64) for x in (p.transitions, p.start, p.end))
  ok_t, ok_s, ok_e = (constraints.arrays() if constraints else
                      (np.ones((C, C), bool), np.ones(C, bool), np.ones(C, bool)))
  scores = {}
  for seq in itertools.product(range(emissions.shape[-1]), repeat=len(at)):
    pairs = list(zip(seq, seq[1:]))
    if seq and (not ok_s[seq[0]] or not ok_e[seq[-1]] or not all(ok_t[i, j] for i, j in pairs)):
      continue
    score = sum(float(emissions[t, y]) for t, y in zip(at, seq)) + sum(trans[i, j] for i, j in pairs)
    scores[seq] = score + (start[seq[0]] + end[seq[-1]] if seq else 0.0)
  return scores


def _logsumexp(values):
  values = np.array(values)
  return values.max() + np.log(np.exp(values - values.max()).sum())


@pytest.mark.parametrize("constraints", [None, IOB2, ODD], ids=["free", "iob2", "odd"])
@pytest.mark.parametrize("parallel", [False, True], ids=["scan", "tree"])
def test_log_partition_and_likelihood_equal_brute_force(constraints, parallel):
  emissions, p = _random(0)
  log_z = crf.log_partition(emissions, MASKS, p, constraints, parallel=parallel)
  rng = np.random.default_rng(1)
  tags = np.where(MASKS, rng.integers(0, C, size=(B, T)), -100)  # -100 at unmarked positions: never read
  if constraints is not None:  # gold sequences the constraints allow: each row's best
    tags = np.asarray(crf.viterbi_decode(emissions, MASKS, p, constraints, fill_value=-100)[0])
  ll = crf.log_likelihood(emissions, tags, MASKS, p, constraints, parallel=parallel)
  for b in range(B):
    scores = _brute(emissions[b], MASKS[b], p, constraints)
    assert log_z[b] == pytest.approx(_logsumexp(list(scores.values())), abs=2e-5)
    gold = tuple(int(x) for x in tags[b][MASKS[b]])
    assert ll[b] == pytest.approx(scores[gold] - _logsumexp(list(scores.values())), abs=2e-5)
  assert log_z[3] == 0.0 and ll[3] == 0.0  # the empty row


@pytest.mark.parametrize("constraints", [None, IOB2, ODD], ids=["free", "iob2", "odd"])
def test_viterbi_equals_brute_force_argmax(constraints):
  for seed in range(3):
    emissions, p = _random(seed + 10)
    tags, score = crf.viterbi_decode(emissions, MASKS, p, constraints)
    assert tags.dtype == jnp.int32 and tags.shape == (B, T)
    for b in range(B):
      scores = _brute(emissions[b], MASKS[b], p, constraints)
      best = max(scores, key=scores.get)
      np.testing.assert_array_equal(tags[b][MASKS[b]], best)
      assert np.all(np.asarray(tags[b])[~MASKS[b]] == -1)
      assert score[b] == pytest.approx(scores[best], abs=1e-5)
    np.testing.assert_allclose(score, crf.sequence_score(emissions, tags, MASKS, p, constraints), atol=1e-5)


def test_no_forbidden_transition_in_any_viterbi_output():
  labels = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]  # CoNLL-2003
  constraints = tagging_schemes.constraints_for(labels)
  rng = np.random.default_rng(3)
  b, t, c = 256, 24, len(labels)
  # Emissions that favour I- tags and transitions that favour forbidden jumps: the constraints alone prevent them.
  emissions = (3 * rng.normal(size=(b, t, c)) + 4 * np.isin(np.arange(c), [2, 4, 6, 8])).astype(np.float32)
  trans = np.where(constraints.arrays()[0], 0.0, 5.0).astype(np.float32)
  p = crf.Potentials(trans, np.zeros(c, np.float32), np.zeros(c, np.float32))
  mask = rng.random((b, t)) < 0.6
  tags, _ = crf.viterbi_decode(emissions, mask, p, constraints)
  tags = np.asarray(tags)
  free, _ = crf.viterbi_decode(emissions, mask, p)
  assert crf.violations(free, mask, constraints).mean() > 0.9  # without the constraints nearly every row breaks them
  assert not crf.violations(tags, mask, constraints).any()
  for row, m in zip(tags, mask):  # the same, spelled out: I-X only after B-X / I-X, never first
    seq = [labels[x] for x in row[m]]
    for prev, tag in zip(["O"] + seq, seq):
      assert not tag.startswith("I-") or prev[2:] == tag[2:] and prev[0] in "BI", (prev, tag)


def test_violations_finds_iob1_gold_tags():
  constraints = tagging_schemes.constraints_for(["O", "B-X", "I-X"])
  tags = np.array([[0, 1, 2, 0], [0, 2, 2, 0], [2, -100, 0, 0], [0, 1, -100, 2]])
  mask = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [1, 0, 1, 1], [1, 1, 0, 1]], bool)
  # Row 1: O -> I-X; row 2: starts with I-X; row 3: B-X, (skipped), I-X is allowed.
  np.testing.assert_array_equal(crf.violations(tags, mask, constraints), [False, True, True, False])


def test_gradients_finite_with_padding_and_empty_rows():
  emissions, p = _random(4, b=3, t=6)
  mask = np.array([[1, 1, 1, 0, 0, 0], [0, 0, 0, 0, 0, 0], [0, 1, 0, 1, 1, 0]], bool)
  tags = np.where(mask, 2, -100)  # row 0: I-X first, forbidden under IOB2: a ~1e4 loss, still finite gradients
  tags[2, 1] = 1  # row 2: B-X, I-X, I-X over its marked positions
  for constraints, parallel in ((None, False), (IOB2, False), (IOB2, True)):
    loss = lambda e, p: -jnp.sum(crf.log_likelihood(e, tags, mask, p, constraints, parallel=parallel))
    g_e, g_p = jax.jit(jax.grad(loss, argnums=(0, 1)))(emissions, p)
    assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves((g_e, g_p)))
    np.testing.assert_array_equal(g_e[1], 0.0)  # the empty row adds nothing
    np.testing.assert_array_equal(g_e[~mask], 0.0)  # nor do skipped positions
    # d(-log p)/d emissions is marginals - one-hot gold: each marked position's gradient sums to 0.
    np.testing.assert_allclose(np.asarray(g_e).sum(-1)[mask], 0.0, atol=1e-5)
    if constraints is not None:  # forbidden entries get no gradient, even from the gold row that takes them
      assert g_p.transitions[0, 2] == 0.0 and g_p.start[2] == 0.0
  # That row costs ~1e4 (NEG): finite, and `violations` names it beforehand.
  assert -1.1e4 < float(crf.log_likelihood(emissions, tags, mask, p, IOB2)[0]) < -0.9e4
  np.testing.assert_array_equal(crf.violations(tags, mask, IOB2), [True, False, False])


def test_jit_vmap_and_low_precision_emissions():
  emissions, p = _random(5)
  tags = np.where(MASKS, 1, 0)
  eager = crf.log_likelihood(emissions, tags, MASKS, p, IOB2)
  jitted = jax.jit(lambda e, t, m, p: crf.log_likelihood(e, t, m, p, IOB2))(emissions, tags, MASKS, p)
  np.testing.assert_allclose(jitted, eager, rtol=1e-6)
  # vmap over an outer axis: [2, B, T, C] in one call equals the two calls.
  stacked = np.stack([emissions, emissions[::-1]])
  decode = jax.vmap(lambda e: crf.viterbi_decode(e, MASKS, p, IOB2))
  tags2, scores2 = jax.jit(decode)(stacked)
  for i in range(2):
    t_i, s_i = crf.viterbi_decode(stacked[i], MASKS, p, IOB2)
    np.testing.assert_array_equal(tags2[i], t_i)
    np.testing.assert_allclose(scores2[i], s_i, rtol=1e-6)
  z = jax.vmap(lambda e: crf.log_partition(e, MASKS, p, parallel=True))(stacked)
  np.testing.assert_allclose(z[0], crf.log_partition(emissions, MASKS, p), rtol=1e-6)
  # bfloat16 emissions are scored in float32.
  low = crf.log_partition(emissions.astype(jnp.bfloat16), MASKS, p)
  assert low.dtype == jnp.float32
  np.testing.assert_allclose(low, crf.log_partition(np.asarray(emissions.astype(jnp.bfloat16), np.float32), MASKS, p),
                             rtol=1e-6)


def _torch_crf(p):
  layer = torchcrf.CRF(C, batch_first=True)
  with torch.no_grad():
    layer.transitions.copy_(torch.tensor(np.asarray(p.transitions)))
    layer.start_transitions.copy_(torch.tensor(np.asarray(p.start)))
    layer.end_transitions.copy_(torch.tensor(np.asarray(p.end)))
  return layer


def test_matches_pytorch_crf_values_gradients_and_decoding():
  rng = np.random.default_rng(6)
  b, t = 8, 7
  emissions, p = _random(6, b=b, t=t)
  tags = rng.integers(0, C, size=(b, t))
  lengths = rng.integers(1, t + 1, size=b)
  prefix = np.arange(t)[None] < lengths[:, None]  # pytorch-crf's own masks: a prefix, first position on
  e_t = torch.tensor(emissions, requires_grad=True)
  layer = _torch_crf(p)
  ll_t = layer(e_t, torch.tensor(tags), torch.tensor(prefix), reduction="none")
  ll_t.sum().backward()
  loss = lambda e, p: jnp.sum(crf.log_likelihood(e, tags, prefix, p))
  grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(emissions, p)
  ll_each = crf.log_likelihood(emissions, tags, prefix, p)
  np.testing.assert_allclose(ll_each, ll_t.detach().numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(grads[0], e_t.grad.numpy(), atol=1e-5)
  np.testing.assert_allclose(grads[1].transitions, layer.transitions.grad.numpy(), atol=1e-5)
  np.testing.assert_allclose(grads[1].start, layer.start_transitions.grad.numpy(), atol=1e-5)
  np.testing.assert_allclose(grads[1].end, layer.end_transitions.grad.numpy(), atol=1e-5)
  decoded = layer.decode(torch.tensor(emissions), torch.tensor(prefix))
  ours = np.asarray(crf.viterbi_decode(emissions, prefix, p)[0])
  assert [list(r[m]) for r, m in zip(ours, prefix)] == decoded

  # A non-prefix mask is pytorch-crf's prefix over the marked positions moved to the front.
  mask = rng.random((b, t)) < 0.6
  mask[:, 2] = True
  order = np.argsort(~mask, axis=1, kind="stable")
  moved = lambda x: np.take_along_axis(x, order.reshape(order.shape + (1,) * (x.ndim - 2)), 1)
  ll_t = layer(torch.tensor(moved(emissions)), torch.tensor(moved(tags)), torch.tensor(moved(mask)),
               reduction="none")
  np.testing.assert_allclose(crf.log_likelihood(emissions, tags, mask, p), ll_t.detach().numpy(), rtol=1e-5,
                             atol=1e-5)
  decoded = layer.decode(torch.tensor(moved(emissions)), torch.tensor(moved(mask)))
  ours = np.asarray(crf.viterbi_decode(emissions, mask, p)[0])
  assert [list(r[m]) for r, m in zip(ours, mask)] == decoded


def test_module_parameters_start_as_the_softmax_head():
  emissions, _ = _random(7)
  tags = np.where(MASKS, np.arange(T) % C, -100)
  layer = crf.CRF(C)
  variables = layer.init(jax.random.key(0), emissions, tags, MASKS)
  boxed = variables["params"]
  assert {k: (v.value.shape, v.names) for k, v in boxed.items()} == {
      "transitions": ((C, C), (None, None)), "start_transitions": ((C,), (None,)),
      "end_transitions": ((C,), (None,))}
  params = nn.meta.unbox(boxed)
  assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(params))
  # Zero transitions, no constraints: log p(tags) is the sum of the marked positions' log-softmax.
  log_softmax = np.asarray(jax.nn.log_softmax(emissions, -1))
  expected = np.where(MASKS, np.take_along_axis(log_softmax, np.maximum(tags, 0)[..., None], -1)[..., 0], 0).sum(1)
  np.testing.assert_allclose(layer.apply({"params": params}, emissions, tags, MASKS), expected, atol=1e-5)
  decoded, _ = layer.apply({"params": params}, emissions, MASKS, method=crf.CRF.decode)
  np.testing.assert_array_equal(decoded, np.where(MASKS, emissions.argmax(-1), -1))
  # The module with constraints and trained values is the functions with them.
  p = crf.Potentials(*(np.full(s, 0.3, np.float32) for s in ((C, C), (C,), (C,))))
  values = {"transitions": p.transitions, "start_transitions": p.start, "end_transitions": p.end}
  module = crf.CRF(C, constraints=IOB2, parallel=True)
  np.testing.assert_allclose(module.apply({"params": values}, emissions, tags, MASKS),
                             crf.log_likelihood(emissions, tags, MASKS, p, IOB2), rtol=1e-6)
  with pytest.raises(ValueError, match="constraints for 3 tags given to a CRF of 4"):
    crf.CRF(4, constraints=IOB2).init(jax.random.key(0), np.zeros((1, 2, 4), np.float32), np.zeros((1, 2), int),
                                      np.ones((1, 2), bool))


def test_bad_inputs_are_clear_errors():
  emissions, p = _random(8)
  with pytest.raises(ValueError, match=r"emissions must be \[B, T, C\]"):
    crf.log_partition(emissions[0], MASKS, p)
  with pytest.raises(ValueError, match=r"tags at marked positions must lie in \[0, 3\); found 3\. Mask out"):
    crf.log_likelihood(emissions, np.where(MASKS, 3, 0), MASKS, p)
  with pytest.raises(ValueError, match="tags must be integers"):
    crf.log_likelihood(emissions, np.zeros((B, T), np.float32), MASKS, p)
  with pytest.raises(ValueError, match="emissions have 3 tags but the transitions are"):
    crf.log_partition(emissions, MASKS, crf.Potentials(np.zeros((4, 4)), np.zeros(4), np.zeros(4)))
