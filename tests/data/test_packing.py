"""Packed rows: best-fit decreasing within a row's tokens, slots and predictions; the same masked sequences back."""
import numpy as np
import pytest

from jbert.data import masking, packing

CLS, SEP, MASK, PAD = 2, 3, 4, 0


def test_best_fit_decreasing_fills_rows_exactly():
  # Longest first: 10 and 7 open rows, 6 does not fit 7's row (5 free), 5 fills it, the 3s fill 6's row, and 2
  # takes the two tokens left beside 10.
  lengths = np.array([10, 7, 6, 5, 3, 3, 2])
  row, slot, rows = packing.assign(lengths, np.zeros(7, int), max_tokens=12, layout=packing.Layout(8, 99))
  assert rows == 3
  np.testing.assert_array_equal(row, [0, 1, 2, 1, 2, 2, 0])
  np.testing.assert_array_equal(slot, [0, 0, 0, 1, 1, 2, 1])


def test_slots_and_predictions_bound_a_row():
  lengths = np.full(6, 2)
  row, _, rows = packing.assign(lengths, np.zeros(6, int), max_tokens=12, layout=packing.Layout(2, 99))
  assert rows == 3 and np.bincount(row).tolist() == [2, 2, 2]  # 2 sequences a row, though 6 would fit
  row, _, rows = packing.assign(lengths, np.array([3, 3, 3, 1, 1, 1]), max_tokens=12, layout=packing.Layout(8, 4))
  assert rows == 3
  assert all(np.array([3, 3, 3, 1, 1, 1])[row == r].sum() <= 4 for r in range(rows))


def test_a_row_predicts_what_one_sequence_may_and_full_rows_need_no_more():
  assert packing.Layout.of(20, 8) == packing.Layout(max_sequences=8, max_predictions=20)
  # Many short sequences (5-24 tokens), each rounding its 15% up: rows fill their tokens (the default 16 slots
  # at 128) and need at most 19 predictions.
  instances = _instances(400, 128, 20, seed=7, longest=24)
  packed = packing.pack(instances, layout=packing.Layout.of(20, 16), pad_id=PAD, rng=np.random.default_rng(0))
  assert packed["masked_lm_weights"].sum() == instances["masked_lm_weights"].sum()  # nothing dropped
  assert packed["masked_lm_weights"].sum(1).max() == 19
  assert packed["sequence_weights"].sum(1).mean() > 8 and 1 - packed["attention_mask"].mean() < 0.035


def _instances(n, t, p, seed, longest=None):
  """Masked [CLS] A [SEP] B [SEP] instances of 5..longest (t) tokens, as the loader makes them before packing."""
  rng = np.random.default_rng(seed)
  ids, types = np.full((n, t), PAD, np.int32), np.zeros((n, t), np.int32)
  for i, length in enumerate(rng.integers(5, (longest or t) + 1, n)):
    a = int(rng.integers(1, length - 3))
    ids[i, :length] = [CLS, *rng.integers(5, 60, a), SEP, *rng.integers(5, 60, length - a - 3), SEP]
    types[i, a + 2:length] = 1
  special = np.zeros(60, bool)
  special[:5] = True
  masker = masking.Masker(special_mask=special, continuation_mask=None, mask_id=MASK, max_predictions=p)
  batch = dict(input_ids=ids, token_type_ids=types, attention_mask=(ids != PAD).astype(np.int32),
               next_sentence_labels=rng.integers(0, 2, n).astype(np.int32))
  batch.update(masker(ids, rng))
  return batch


def _as_set(batch, p):
  """Each sequence as a tuple of its arrays (predictions padded to width p): order-free comparison."""
  width = lambda x: np.pad(x, ((0, 0), (0, p - x.shape[1])))
  keys = ("input_ids", "token_type_ids", "attention_mask")
  predictions = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
  arrays = [batch[k] for k in keys] + [width(batch[k]) for k in predictions]
  return sorted(tuple(np.concatenate([a[i] for a in arrays]).tolist()) + (int(batch["next_sentence_labels"][i]),)
                for i in range(len(batch["input_ids"])))


@pytest.mark.parametrize("t", [32, 128])
def test_pack_then_unpack_gives_back_the_same_masked_sequences(t):
  layout = packing.Layout.of(t // 6, t // 16)
  instances = _instances(300, t, t // 6, seed=t)
  packed = packing.pack(instances, layout=layout, pad_id=PAD, rng=np.random.default_rng(0))
  rows = len(packed["input_ids"])
  assert {k: v.shape for k, v in packed.items()} == {
      **{k: (rows, t) for k in packing.PACKED_KEYS[:5]},
      **{k: (rows, layout.max_predictions) for k in packing.PACKED_KEYS[5:8]},
      **{k: (rows, layout.max_sequences) for k in packing.SLOT_KEYS}}
  assert all(v.dtype == np.int32 for v in packed.values())
  assert _as_set(packing.unpack(packed), layout.max_predictions) == _as_set(instances, layout.max_predictions)
  # Every row's layout: sequences 1..k end to end from token 0, positions restarting, [CLS] where each begins.
  for r in range(rows):
    k = int(packed["sequence_weights"][r].sum())
    np.testing.assert_array_equal(packed["sequence_weights"][r], np.arange(layout.max_sequences) < k)
    segments, n = packed["segment_ids"][r], int(packed["attention_mask"][r].sum())
    np.testing.assert_array_equal(packed["attention_mask"][r], np.arange(t) < n)
    np.testing.assert_array_equal(segments[:n], np.repeat(np.arange(1, k + 1), np.bincount(segments[:n])[1:]))
    assert not segments[n:].any() and (packed["input_ids"][r, n:] == PAD).all()
    starts = packed["cls_positions"][r, :k]
    np.testing.assert_array_equal(starts, np.flatnonzero(np.diff(segments[:n], prepend=0)))
    assert (packed["input_ids"][r, starts] == CLS).all()
    np.testing.assert_array_equal(packed["position_ids"][r, :n], np.arange(n) - np.repeat(starts, np.diff(
        np.append(starts, n))))
    picked = packed["masked_lm_weights"][r] > 0
    np.testing.assert_array_equal(picked, np.arange(layout.max_predictions) < picked.sum())
    positions = packed["masked_lm_positions"][r][picked]
    assert (np.diff(positions) > 0).all() and (positions < n).all()
  # Padding: (almost) none, where one sequence per row is 40% padding.
  assert 1 - instances["attention_mask"].mean() > 0.35
  assert 1 - packed["attention_mask"].mean() < 0.03


def test_packing_is_deterministic():
  instances = _instances(100, 64, 10, seed=3)
  layout = packing.Layout.of(10, 4)
  a, b = (packing.pack(instances, layout=layout, pad_id=PAD, rng=np.random.default_rng(5)) for _ in range(2))
  assert all(np.array_equal(a[k], b[k]) for k in packing.PACKED_KEYS)
