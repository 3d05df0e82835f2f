"""Training streams: seeded epochs, length-bucketed batches that keep the seeded stream's guarantees (each
example once per epoch, bit-exact resume, the same global batches for any number of data shards) and the bucket
lengths known up front."""
import json

import numpy as np

from jbert.data import streams
from jbert.tasks import MODEL_INPUTS
from tests.tasks.finetune_data import varied_length_features

T = 32
KEYS = (*MODEL_INPUTS, "label")


def test_buckets_are_few_known_up_front_and_end_at_the_maximum():
  assert streams.buckets(128) == (8, 12, 16, 24, 32, 48, 64, 96, 128)
  assert streams.buckets(384) == (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384)
  assert streams.buckets(100) == (8, 12, 16, 24, 32, 48, 64, 96, 100)
  assert streams.buckets(10) == (8, 10) and streams.buckets(8) == (8,) and streams.buckets(6) == (6,)
  assert streams.bucket_of(17, (16, 24, 32)) == 24 and streams.bucket_of(16, (16, 24, 32)) == 16


def _stream(features, shards=(0,), num_shards=1, batch=8, mega_batch=3):
  return streams.BucketedStream(features, KEYS, global_batch_size=batch, seed=7, num_shards=num_shards,
                                shards=shards, lengths=streams.buckets(T), sequence_keys=MODEL_INPUTS,
                                mega_batch=mega_batch)


def test_each_epoch_visits_every_example_once_in_length_grouped_bucketed_batches():
  features = varied_length_features(96)  # 4 chunks of 3 batches of 8 per epoch
  stream = _stream(features)
  lengths = streams.row_lengths(features)
  epochs = []
  for _ in range(2):
    rows = []
    for _ in range(12):
      batch = next(stream)
      ids = batch["label"]
      # Padded to the smallest bucket that holds the longest row, which comes first.
      assert batch["input_ids"].shape == (8, streams.bucket_of(lengths[ids].max(), streams.buckets(T)))
      assert lengths[ids[0]] == lengths[ids].max()
      length = batch["input_ids"].shape[1]
      np.testing.assert_array_equal(batch["attention_mask"], features["attention_mask"][ids, :length])
      rows.append(ids)
    epochs.append(np.concatenate(rows))
    assert sorted(epochs[-1]) == list(range(96))
  assert not np.array_equal(epochs[0], epochs[1])  # seeded per epoch
  # Grouped: each chunk's batches are sorted slices (longest first), so a batch spans few lengths.
  spans = [np.ptp(lengths[r]) for r in np.split(epochs[0], 12)]
  assert np.mean(spans) < 0.4 * np.ptp(lengths)


def test_the_state_resumes_bit_exactly_and_shards_split_the_same_global_batches():
  features = varied_length_features(50)  # not a multiple of the batch: chunks straddle epochs
  whole = _stream(features)
  reference = [next(whole) for _ in range(20)]
  resumed = _stream(features)
  for _ in range(7):
    next(resumed)
  state = {int(s): json.loads(json.dumps(v)) for s, v in resumed.get_states().items()}  # one JSON per shard
  fresh = _stream(features)
  fresh.set_states(state)
  for expected in reference[7:]:
    got = next(fresh)
    for k in KEYS:
      np.testing.assert_array_equal(got[k], expected[k])
  halves = [_stream(features, shards=(s,), num_shards=2) for s in (0, 1)]
  for expected in reference:
    parts = [next(h) for h in halves]
    for k in KEYS:
      np.testing.assert_array_equal(np.concatenate([p[k] for p in parts]), expected[k])
  # Each chunk of batches holds exactly the rows of its stretch of the unbucketed stream's epoch sequence.
  plain = streams.FeatureStream(features, KEYS, global_batch_size=8, seed=7, num_shards=1, shards=(0,))
  sequence = np.concatenate([next(plain)["label"] for _ in range(20)])
  per = whole.chunk_batches
  for chunk in range(20 // per):
    rows = np.concatenate([r["label"] for r in reference[chunk * per:(chunk + 1) * per]])
    np.testing.assert_array_equal(np.sort(rows), np.sort(sequence[chunk * per * 8:(chunk + 1) * per * 8]))


def test_the_lengths_to_come_are_known_without_moving_the_stream():
  stream = _stream(varied_length_features(96))
  next(stream)
  state = stream.get_states()
  ahead = stream.upcoming_lengths(20)  # across an epoch boundary (12 batches an epoch)
  assert stream.get_states() == state
  assert [next(stream)["input_ids"].shape[1] for _ in range(20)] == ahead
  assert len(set(ahead)) > 1 and set(ahead) <= set(streams.buckets(T))
  stream.set_states(state)
  assert stream.upcoming_lengths(20) == ahead


def test_rows_of_several_sequences_take_their_longest():
  features = varied_length_features(12, choices=3)
  lengths = streams.row_lengths(features)
  np.testing.assert_array_equal(lengths, features["attention_mask"].sum(-1).max(-1))
  batch = next(_stream(features, batch=4, mega_batch=1))
  assert batch["input_ids"].shape == (4, 3, streams.bucket_of(lengths[batch["label"]].max(), streams.buckets(T)))


def _packed(features, shards=(0,), num_shards=1, batch=8, slots=4, multiple=1):
  return streams.PackedStream(features, KEYS, global_batch_size=batch, seed=7, num_shards=num_shards, shards=shards,
                              max_sequences=slots, example_keys=("label",), row_multiple=multiple)


def _examples(batch):
  """(label, its tokens) of each sequence of a packed batch, row by row and slot by slot."""
  out = []
  for r, s in zip(*np.nonzero(batch["sequence_weights"])):
    here = batch["segment_ids"][r] == s + 1
    start = int(batch["cls_positions"][r, s])
    assert np.array_equal(np.nonzero(here)[0], np.arange(start, start + here.sum()))  # contiguous, from its [CLS]
    assert np.array_equal(batch["position_ids"][r][here], np.arange(here.sum()))
    out.append((int(batch["label"][r, s]), tuple(batch["input_ids"][r][here])))
  return out


def test_packed_batches_hold_the_seeded_streams_examples_whole_in_few_shapes():
  features = varied_length_features(96)
  packed, plain = _packed(features), streams.FeatureStream(features, KEYS, global_batch_size=8, seed=7,
                                                          num_shards=1, shards=(0,))
  packed.plan(30)  # 2.5 epochs
  shapes = set()
  for _ in range(30):
    batch, want = next(packed), next(plain)
    got = _examples(batch)
    # The same examples as the unpacked stream's global batch, each with all its tokens, labels in their slots.
    real = want["attention_mask"].astype(bool)
    assert sorted(got) == sorted((int(y), tuple(ids[m])) for y, ids, m in zip(want["label"], want["input_ids"], real))
    assert batch["sequence_weights"].sum() == 8 and (batch["sequence_weights"].sum(1) <= 4).all()
    assert int(batch["attention_mask"].sum()) == int(want["attention_mask"].sum())  # no token lost or added
    assert np.array_equal(batch["attention_mask"] != 0, batch["segment_ids"] != 0)
    shapes.add(batch["input_ids"].shape)
  # Rows of T tokens: one shape for most batches (fewer rows than the 8 unpacked), a second for the fullest.
  assert len(shapes) <= 2 and {t for _, t in shapes} == {T} and packed.usual < 8
  assert max(r for r, _ in shapes) == packed.most == max(packed._planned)  # pylint: disable=protected-access
  assert packed.upcoming_shapes(3) == [(packed.rows_of(i), T) for i in range(30, 33)]


def test_packed_batches_resume_bit_exactly_and_any_shard_split_gives_the_same_global_batches():
  features = varied_length_features(96)
  whole = _packed(features, shards=(0, 1), num_shards=2, multiple=2)
  halves = [_packed(features, shards=(s,), num_shards=2, multiple=2) for s in (0, 1)]
  for stream in (whole, *halves):
    stream.plan(20)
  assert {s.usual for s in halves} == {whole.usual} and whole.usual % 2 == 0  # every process plans alike
  for _ in range(5):
    next(whole), next(halves[0]), next(halves[1])
  states = {int(k): v for k, v in json.loads(json.dumps(whole.get_states())).items()}
  rest = [next(whole) for _ in range(10)]
  resumed = _packed(features, shards=(0, 1), num_shards=2, multiple=2)
  resumed.plan(20)
  resumed.set_states(states)
  for want in rest:
    got = next(resumed)
    assert all(np.array_equal(got[k], want[k]) for k in want)
    # 2 processes' rows concatenated are 1 process's global batch, bit for bit.
    parts = [next(h) for h in halves]
    assert all(np.array_equal(np.concatenate([p[k] for p in parts]), want[k]) for k in want)


def test_packed_multiple_choice_keeps_each_examples_endings_together_in_one_row():
  features = varied_length_features(40, choices=3, T=16)
  stream = streams.PackedStream(features, KEYS, global_batch_size=8, seed=7, num_shards=1, shards=(0,),
                                max_sequences=2, example_keys=("label",))
  plain = streams.FeatureStream(features, KEYS, global_batch_size=8, seed=7, num_shards=1, shards=(0,))
  for _ in range(6):
    batch, want = next(stream), next(plain)
    assert batch["input_ids"].shape[1] == 3 * 16 and batch["cls_positions"].shape[1] == 2 * 3
    weights = batch["sequence_weights"].reshape(len(batch["label"]), 2, 3)
    assert (weights.min(-1) == weights.max(-1)).all()  # an example's 3 endings fill its 3 slots, or none
    rows, slots = np.nonzero(weights[..., 0])
    assert sorted(batch["label"][rows, slots]) == sorted(want["label"])
    for r, e in zip(rows, slots):  # ending c of example e: segment 3e + c + 1, the example's id as its tokens
      label = batch["label"][r, e]
      for c in range(3):
        here = batch["segment_ids"][r] == 3 * e + c + 1
        assert here.sum() == want["attention_mask"][list(want["label"]).index(label), c].sum()
        assert set(batch["input_ids"][r][here]) == {label % 60 + 5}
