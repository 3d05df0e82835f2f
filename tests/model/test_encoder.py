"""Packed rows in BertModel and the heads: several sequences laid end to end in a row compute what each does alone."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jbert.model import (BertConfig, BertForPreTraining, BertForQuestionAnswering, BertForSequenceClassification,
                         BertModel)
from jbert.model.encoder import segment_positions

CONFIG = BertConfig(vocab_size=60, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=96,
                    max_position_embeddings=32, attention_probs_dropout_prob=0.0)
LENGTHS = (5, 9, 3)  # three sequences of row 0; row 1 holds one sequence of 12
T = 20


def _sequences(seed=0):
  rng = np.random.default_rng(seed)
  seqs = []
  for n in LENGTHS + (12,):
    ids = rng.integers(5, CONFIG.vocab_size, n).astype(np.int32)
    ids[0] = 2  # [CLS]
    types = (np.arange(n) >= n // 2).astype(np.int32)  # each sequence's own A/B halves
    seqs.append((ids, types))
  return seqs


def _packed(seqs):
  """Row 0: sequences 0, 1, 2 then padding; row 1: sequence 3 then padding."""
  ids, types, segments = (np.zeros((2, T), np.int32) for _ in range(3))
  for row, members in ((0, (0, 1, 2)), (1, (3,))):
    start = 0
    for k, i in enumerate(members):
      a, b = seqs[i]
      ids[row, start:start + len(a)], types[row, start:start + len(a)] = a, b
      segments[row, start:start + len(a)] = k + 1
      start += len(a)
  return ids, types, segments


def _spans():
  """(row, start, end) of each sequence in the packed batch."""
  starts = np.cumsum((0,) + LENGTHS)
  return [(0, starts[i], starts[i + 1]) for i in range(3)] + [(1, 0, 12)]


def _init(model, seed=0):
  return nn.meta.unbox(jax.jit(model.init)(jax.random.key(seed), jnp.zeros((1, 8), jnp.int32))["params"])


@pytest.fixture(scope="module")
def params():
  return _init(BertModel(CONFIG))


def _one_per_row(seqs):
  """Each sequence alone in its own row, padded as today's batches are: ids, types, attention_mask [4, T]."""
  ids, types, mask = (np.zeros((len(seqs), T), np.int32) for _ in range(3))
  for i, (a, b) in enumerate(seqs):
    ids[i, :len(a)], types[i, :len(a)], mask[i, :len(a)] = a, b, 1
  return ids, types, mask


def _alone(params, config, seqs):
  """Each sequence on its own: its hidden states [n, H] and pooled [CLS] [H]."""
  ids, types, mask = _one_per_row(seqs)
  out = jax.jit(BertModel(config).apply)({"params": params}, ids, types, mask)
  return [(np.asarray(out.last_hidden_state[i, :len(a)]), np.asarray(out.pooled_output[i]))
          for i, (a, _) in enumerate(seqs)]


@pytest.mark.parametrize("impl,scan", [("einsum", False), ("xla", False), ("xla", True), ("splash", False)])
def test_packed_rows_equal_each_sequence_alone(params, impl, scan):
  config = CONFIG.replace(attention_impl=impl, scan_layers=scan)
  run_params = params
  if scan:
    from jbert.model import stack_layers  # pylint: disable=import-outside-toplevel
    run_params = stack_layers(params)
  seqs = _sequences()
  ids, types, segments = _packed(seqs)
  cls = np.array([[0, 5, 14], [0, 0, 0]], np.int32)  # each sequence's [CLS]; row 1 repeats its only one
  apply = jax.jit(lambda p, *a: BertModel(config).apply({"params": p}, *a[:2], segment_ids=a[2], cls_positions=a[3]))
  out = apply(run_params, ids, types, segments, cls)
  hidden, pooled = np.asarray(out.last_hidden_state), np.asarray(out.pooled_output)
  assert hidden.shape == (2, T, 64) and pooled.shape == (2, 3, 64)
  alone = _alone(run_params, config, seqs)
  for i, (row, start, end) in enumerate(_spans()):
    np.testing.assert_allclose(hidden[row, start:end], alone[i][0], atol=1e-5, rtol=0)
  for (row, k), i in {(0, 0): 0, (0, 1): 1, (0, 2): 2, (1, 0): 3}.items():
    np.testing.assert_allclose(pooled[row, k], alone[i][1], atol=1e-5, rtol=0)


def _packed_apply(model, params, ids, types, segments, **kwargs):
  return jax.jit(lambda p, *a: model.apply({"params": p}, *a[:2], segment_ids=a[2], **kwargs))(
      params, ids, types, segments)


def test_a_sequence_does_not_move_its_row_neighbours(params):
  seqs = _sequences()
  ids, types, segments = _packed(seqs)
  changed = ids.copy()
  changed[0, 5:14] = (changed[0, 5:14] + 7) % CONFIG.vocab_size  # the middle sequence of row 0
  a, b = (np.asarray(_packed_apply(BertModel(CONFIG), params, x, types, segments).last_hidden_state)
          for x in (ids, changed))
  np.testing.assert_array_equal(a[0, :5], b[0, :5])
  np.testing.assert_array_equal(a[0, 14:17], b[0, 14:17])
  np.testing.assert_array_equal(a[1], b[1])
  assert np.abs(a[0, 5:14] - b[0, 5:14]).min(axis=-1).max() > 0  # the changed sequence itself moves


def test_positions_restart_at_each_sequence(params):
  segments = np.array([[1, 1, 1, 2, 2, 3, 0, 0], [4, 4, 4, 4, 4, 4, 4, 4]], np.int32)
  np.testing.assert_array_equal(segment_positions(jnp.asarray(segments)),
                                [[0, 1, 2, 0, 1, 0, 0, 1], [0, 1, 2, 3, 4, 5, 6, 7]])
  seqs = _sequences()
  ids, types, segments = _packed(seqs)
  derived = _packed_apply(BertModel(CONFIG), params, ids, types, segments).last_hidden_state
  explicit = _packed_apply(BertModel(CONFIG), params, ids, types, segments,
                           position_ids=segment_positions(jnp.asarray(segments))).last_hidden_state
  np.testing.assert_array_equal(derived, explicit)


def test_attention_mask_and_segment_zero_both_mean_padding(params):
  seqs = _sequences()
  ids, types, segments = _packed(seqs)
  mask = (segments > 0).astype(np.int32)
  noisy = np.where(segments > 0, segments, 9)  # padding numbered 9, but masked out by attention_mask
  a = _packed_apply(BertModel(CONFIG), params, ids, types, segments).last_hidden_state
  b = jax.jit(lambda p: BertModel(CONFIG).apply({"params": p}, ids, types, mask, segment_ids=noisy))(params)
  np.testing.assert_allclose(np.asarray(a)[mask == 1], np.asarray(b.last_hidden_state)[mask == 1], atol=1e-6)


def test_heads_take_packed_rows():
  """NSP and classification per sequence through cls_positions; MLM at positions of the row; QA per token."""
  seqs = _sequences()
  ids, types, segments = _packed(seqs)
  alone_ids, alone_types, alone_mask = _one_per_row(seqs)
  cls = np.array([[0, 5, 14], [0, 0, 0]], np.int32)
  pre = BertForPreTraining(CONFIG)
  p = _init(pre, 1)
  positions = np.array([[1, 6, 15], [1, 2, 3]], np.int32)
  out = _packed_apply(pre, p, ids, types, segments, masked_lm_positions=positions, cls_positions=cls)
  assert out.nsp_logits.shape == (2, 3, 2) and out.mlm_logits.shape == (2, 3, CONFIG.vocab_size)
  alone = jax.jit(lambda p: pre.apply({"params": p}, alone_ids, alone_types, alone_mask,
                                      masked_lm_positions=np.array([[1], [1], [1], [1]], np.int32)))(p)
  for k in range(3):  # row 0's sequences, each masked at its second token
    np.testing.assert_allclose(out.nsp_logits[0, k], alone.nsp_logits[k], atol=1e-5)
    np.testing.assert_allclose(out.mlm_logits[0, k], alone.mlm_logits[k, 0], atol=1e-4)
  clf = BertForSequenceClassification(CONFIG, num_labels=3)
  pc = _init(clf, 2)
  logits = _packed_apply(clf, pc, ids, types, segments, cls_positions=cls).logits
  assert logits.shape == (2, 3, 3)
  want = jax.jit(lambda p: clf.apply({"params": p}, alone_ids, alone_types, alone_mask))(pc).logits
  np.testing.assert_allclose(logits[0], want[:3], atol=1e-5)
  qa = BertForQuestionAnswering(CONFIG)
  pq = _init(qa, 3)
  start = _packed_apply(qa, pq, ids, types, segments).start_logits
  want = jax.jit(lambda p: qa.apply({"params": p}, alone_ids, alone_types, alone_mask))(pq).start_logits
  np.testing.assert_allclose(start[0, 14:17], want[2, :3], atol=1e-5)


@pytest.mark.parametrize("kwargs,message", [
    ({"segment_ids": np.ones((2, 5), np.int32)}, r"segment_ids has shape \(2, 5\) but input_ids has \(2, 4\)"),
    ({"position_ids": np.zeros((2, 4), np.float32)}, r"position_ids must hold integer ids"),
    ({"position_ids": np.full((2, 4), 40, np.int32)}, r"position_ids contains 40 .* outside \[0, 32\)"),
    ({"segment_ids": np.full((2, 4), -1, np.int32)}, r"segment_ids contains -1 .*0 for padding"),
    ({"cls_positions": np.array([[4], [0]], np.int32)}, r"cls_positions contains 4 .* outside \[0, 4\)"),
])
def test_bad_packing_inputs_are_refused(params, kwargs, message):
  with pytest.raises(ValueError, match=message):
    BertModel(CONFIG).apply({"params": params}, np.ones((2, 4), np.int32), **kwargs)
