"""Packed rows: best-fit decreasing within a row's tokens, slots and predictions; the same masked sequences back."""
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from jbert.data import config as config_lib
from jbert.data import masking, packing

REPO = pathlib.Path(__file__).resolve().parents[2]

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


@pytest.mark.parametrize("nsp, shortest", [(True, 5), (False, 3), (None, 2)])
def test_more_slots_than_a_row_can_fill_are_refused(nsp, shortest):
  """A row of T tokens holds at most T // (the shortest sequence) sequences: more slots only cost every batch their
  gathers and logits (100,000 of them ran 40x slower)."""
  cfg = config_lib.default_pretrain_config()
  if nsp is None:  # fine-tuning's data section has no NSP: an example of an empty text is [CLS] [SEP]
    del cfg["nsp"]
  else:
    cfg.nsp = nsp
  cfg.max_seq_length = 128
  assert packing.shortest_sequence(cfg) == shortest
  cfg.max_sequences_per_row = 128 // shortest
  packing.check(cfg)
  cfg.max_sequences_per_row = 100_000
  with pytest.raises(ValueError) as error:
    packing.check(cfg)
  assert str(error.value) == (
      f"--config.data.max_sequences_per_row=100000 exceeds what a row of 128 tokens can hold: {128 // shortest} "
      f"sequences of the shortest, {shortest} tokens; set it to at most {128 // shortest} (unset, it is one per 8 "
      "tokens: 16).")
  cfg.packing = False  # unpacked rows have no slots
  packing.check(cfg)


def test_the_command_refuses_them_in_one_line_before_reading_data(tmp_path):
  config = tmp_path / "config.py"
  config.write_text(f'''
import ml_collections
from jbert.data import config as data_config

def get_config():
  config = ml_collections.ConfigDict()
  config.seed, config.batch_size = 0, 8
  config.data = data_config.default_pretrain_config()
  config.data.synthetic_dir = {str(tmp_path / "never_made")!r}
  return config
''')
  result = subprocess.run([sys.executable, "-m", "jbert.data", f"--config={config}", "--show=1",
                           "--config.data.max_sequences_per_row=100000"], cwd=REPO, capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert (result.returncode, result.stderr) == (2, (
      "jbert.data: --config.data.max_sequences_per_row=100000 exceeds what a row of 128 tokens can hold: 25 "
      "sequences of the shortest, 5 tokens; set it to at most 25 (unset, it is one per 8 tokens: 16).\n"))
  assert not (tmp_path / "never_made").exists()  # the corpus was not even generated
