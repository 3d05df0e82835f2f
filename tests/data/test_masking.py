"""Dynamic masking: selection rate, 80/10/10 split, specials, the cap, whole words, determinism."""
import numpy as np
import pytest

from jbert.data import masking

PAD, UNK, CLS, SEP, MASK = range(5)
V = 1000
SPECIAL = np.isin(np.arange(V), [PAD, UNK, CLS, SEP, MASK])
CONTINUES = np.arange(V) >= 900  # ids 900.. play `##x` pieces


def sequences(rows: int, length: int, rng: np.random.Generator, lengths=None) -> np.ndarray:
  """[CLS] tokens [SEP] [SEP] at position 10 too, padded after a random length in [12, length]."""
  lengths = rng.integers(12, length + 1, rows) if lengths is None else np.full(rows, lengths)
  ids = rng.integers(5, 900, (rows, length)).astype(np.int32)
  ids[:, 0], ids[:, 10] = CLS, SEP
  ids[np.arange(rows), lengths - 1] = SEP
  ids[np.arange(length) >= lengths[:, None]] = PAD
  return ids


def masker(**kwargs) -> masking.Masker:
  defaults = dict(special_mask=SPECIAL, continuation_mask=None, mask_id=MASK, max_predictions=20)
  return masking.Masker(**{**defaults, **kwargs})


def selected_mask(out) -> np.ndarray:
  sel = np.zeros(out["input_ids"].shape, bool)
  rows, cols = np.nonzero(out["masked_lm_weights"])
  sel[rows, out["masked_lm_positions"][rows, cols]] = True
  return sel


@pytest.mark.parametrize("prob, max_predictions", [(0.15, 20), (0.3, 40)])
def test_selection_rate_and_replacement_split(prob, max_predictions):
  rng = np.random.default_rng(0)
  ids = sequences(3000, 128, rng, lengths=128)
  out = masker(masked_lm_prob=prob, max_predictions=max_predictions)(ids, rng)
  sel = selected_mask(out)
  assert sel.sum() / (~SPECIAL[ids]).sum() == pytest.approx(prob, abs=0.01)
  now, was = out["input_ids"][sel], ids[sel]
  assert np.mean(now == MASK) == pytest.approx(0.8, abs=0.02)
  assert np.mean((now != MASK) & (now != was)) == pytest.approx(0.1, abs=0.02)
  assert np.mean(now == was) == pytest.approx(0.1, abs=0.02)
  assert not SPECIAL[now[now != MASK]].any()  # random replacements are never special
  np.testing.assert_array_equal(out["input_ids"][~sel], ids[~sel])  # nothing else changes


def test_outputs_are_sorted_padded_and_exact():
  rng = np.random.default_rng(1)
  ids = sequences(500, 64, rng)
  out = masker(max_predictions=12)(ids, rng)
  pos, lm_ids, w = out["masked_lm_positions"], out["masked_lm_ids"], out["masked_lm_weights"]
  assert pos.shape == lm_ids.shape == w.shape == (500, 12)
  assert all(v.dtype == np.int32 for v in out.values())
  n = w.sum(axis=1)
  assert np.all(np.diff(w, axis=1) <= 0)                     # weights: ones then zeros
  for r in range(500):
    assert np.all(np.diff(pos[r, :n[r]]) > 0)                # sorted, distinct
    np.testing.assert_array_equal(lm_ids[r, :n[r]], ids[r, pos[r, :n[r]]])
  assert not pos[w == 0].any() and not lm_ids[w == 0].any()
  assert not SPECIAL[np.take_along_axis(ids, pos, axis=1)[w == 1]].any()  # specials never selected
  expected = np.minimum(12, np.maximum(1, np.round((~SPECIAL[ids]).sum(axis=1) * 0.15)))
  np.testing.assert_array_equal(n, expected)


def test_cap_at_max_predictions():
  rng = np.random.default_rng(2)
  ids = sequences(50, 128, rng, lengths=128)
  out = masker(masked_lm_prob=0.5, max_predictions=20)(ids, rng)
  np.testing.assert_array_equal(out["masked_lm_weights"].sum(axis=1), 20)


def test_short_and_empty_rows():
  ids = np.array([[CLS, 7, SEP, PAD], [CLS, SEP, PAD, PAD]], np.int32)
  out = masker(max_predictions=3)(ids, np.random.default_rng(0))
  np.testing.assert_array_equal(out["masked_lm_weights"], [[1, 0, 0], [0, 0, 0]])
  np.testing.assert_array_equal(out["masked_lm_positions"], [[1, 0, 0], [0, 0, 0]])


def test_whole_word_masking_takes_every_piece():
  rng = np.random.default_rng(3)
  ids = sequences(2000, 64, rng, lengths=64)
  pieces = rng.random(ids.shape) < 0.4
  ids = np.where(pieces & ~SPECIAL[ids], rng.integers(900, V, ids.shape), ids).astype(np.int32)
  ids[:, 1] = 950  # a continuation right after [CLS] starts its own word
  out = masker(continuation_mask=CONTINUES, max_predictions=10)(ids, rng)
  sel = selected_mask(out)
  candidates = ~SPECIAL[ids]
  starts = candidates & ~(CONTINUES[ids] & np.pad(candidates[:, :-1], ((0, 0), (1, 0))))
  word = np.cumsum(starts, axis=1)
  for r in range(2000):
    for w in np.unique(word[r][candidates[r]]):
      in_word = candidates[r] & (word[r] == w)
      assert sel[r][in_word].all() or not sel[r][in_word].any()
  assert (sel & CONTINUES[ids]).any()
  k = np.minimum(10, np.round(candidates.sum(axis=1) * 0.15))
  assert np.all(sel.sum(axis=1) <= k)
  # Greedy packing in random order leaves little room unused.
  assert sel.sum() / k.sum() > 0.93
  assert sel.sum() / candidates.sum() == pytest.approx(0.15, abs=0.015)


def test_same_generator_same_masks():
  ids = sequences(64, 32, np.random.default_rng(4))
  a = masker()(ids, np.random.default_rng(9))
  b = masker()(ids, np.random.default_rng(9))
  c = masker()(ids, np.random.default_rng(10))
  assert all(np.array_equal(a[k], b[k]) for k in a)
  assert not np.array_equal(a["masked_lm_positions"], c["masked_lm_positions"])


@pytest.mark.parametrize("kwargs, message", [
    (dict(masked_lm_prob=1.5), r"masked_lm_prob=1.5 must lie in \[0, 1\]"),
    (dict(mask_token_prob=0.8, random_token_prob=0.3), "exceeds 1"),
    (dict(max_predictions=0), "max_predictions_per_seq=0"),
])
def test_bad_settings(kwargs, message):
  with pytest.raises(ValueError, match=message):
    masker(**kwargs)
