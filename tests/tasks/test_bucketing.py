"""Length-bucketed fine-tuning: the stream keeps the seeded stream's guarantees (each example once per epoch,
bit-exact resume, the same global batches for any number of data shards), a bucketed batch computes what the
padded one does (logits, losses, the accumulated gradient), evaluation comes back in example order, and a run
compiles one train step per bucket."""
import json

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest

import jbert
from jbert import tasks as tasks_lib
from jbert.model import init_params
from jbert.runtime import sharding
from jbert.tasks import MODEL_INPUTS, bucketing, feeding
from jbert.train import evaluation
from jbert.train import step as step_lib
from tests.tasks import finetune_data as fd

T = 32
KEYS = (*MODEL_INPUTS, "label")


def test_buckets_are_few_known_up_front_and_end_at_the_maximum():
  assert bucketing.buckets(128) == (8, 12, 16, 24, 32, 48, 64, 96, 128)
  assert bucketing.buckets(384) == (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384)
  assert bucketing.buckets(100) == (8, 12, 16, 24, 32, 48, 64, 96, 100)
  assert bucketing.buckets(10) == (8, 10) and bucketing.buckets(8) == (8,) and bucketing.buckets(6) == (6,)
  assert bucketing.bucket_of(17, (16, 24, 32)) == 24 and bucketing.bucket_of(16, (16, 24, 32)) == 16


def _features(n, seed=0, choices=None):
  """Rows of 3..T tokens (ids are the row index, so batches can be traced back); [N, C, T] with `choices`."""
  rng = np.random.default_rng(seed)
  shape = (n, T) if choices is None else (n, choices, T)
  lengths = rng.integers(3, T + 1, shape[:-1])
  mask = (np.arange(T) < lengths[..., None]).astype(np.int32)
  ids = mask * (np.arange(n) % 60 + 5).reshape((n,) + (1,) * (len(shape) - 1))
  return {"input_ids": ids.astype(np.int32), "token_type_ids": np.zeros(shape, np.int32), "attention_mask": mask,
          "label": np.arange(n, dtype=np.int32)}


def _stream(features, shards=(0,), num_shards=1, batch=8, mega_batch=3):
  return bucketing.BucketedStream(features, KEYS, global_batch_size=batch, seed=7, num_shards=num_shards,
                                  shards=shards, lengths=bucketing.buckets(T), sequence_keys=MODEL_INPUTS,
                                  mega_batch=mega_batch)


def test_each_epoch_visits_every_example_once_in_length_grouped_bucketed_batches():
  features = _features(96)  # 4 chunks of 3 batches of 8 per epoch
  stream = _stream(features)
  lengths = bucketing.row_lengths(features)
  epochs = []
  for _ in range(2):
    rows = []
    for _ in range(12):
      batch = next(stream)
      ids = batch["label"]
      # Padded to the smallest bucket that holds the longest row, which comes first.
      assert batch["input_ids"].shape == (8, bucketing.bucket_of(lengths[ids].max(), bucketing.buckets(T)))
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
  features = _features(50)  # not a multiple of the batch: chunks straddle epochs
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
  plain = feeding.FeatureStream(features, KEYS, global_batch_size=8, seed=7, num_shards=1, shards=(0,))
  sequence = np.concatenate([next(plain)["label"] for _ in range(20)])
  per = whole.chunk_batches
  for chunk in range(20 // per):
    rows = np.concatenate([r["label"] for r in reference[chunk * per:(chunk + 1) * per]])
    np.testing.assert_array_equal(np.sort(rows), np.sort(sequence[chunk * per * 8:(chunk + 1) * per * 8]))


def test_the_lengths_to_come_are_known_without_moving_the_stream():
  stream = _stream(_features(96))
  next(stream)
  state = stream.get_states()
  ahead = stream.upcoming_lengths(20)  # across an epoch boundary (12 batches an epoch)
  assert stream.get_states() == state
  assert [next(stream)["input_ids"].shape[1] for _ in range(20)] == ahead
  assert len(set(ahead)) > 1 and set(ahead) <= set(bucketing.buckets(T))
  stream.set_states(state)
  assert stream.upcoming_lengths(20) == ahead


def test_rows_of_several_sequences_take_their_longest():
  features = _features(12, choices=3)
  lengths = bucketing.row_lengths(features)
  np.testing.assert_array_equal(lengths, features["attention_mask"].sum(-1).max(-1))
  batch = next(_stream(features, batch=4, mega_batch=1))
  assert batch["input_ids"].shape == (4, 3, bucketing.bucket_of(lengths[batch["label"]].max(), bucketing.buckets(T)))


def _model_and_params(head_cls, **kwargs):
  config = jbert.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=T, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
  model = head_cls(config, **kwargs)
  return model, nn.meta.unbox(init_params(model, jax.random.key(1)))


def _short(n, choices=None, seed=3):
  """A padded [.., T] batch whose rows all fit in 16 tokens."""
  rng = np.random.default_rng(seed)
  shape = (n, T) if choices is None else (n, choices, T)
  mask = (np.arange(T) < rng.integers(2, 17, shape[:-1])[..., None]).astype(np.int32)
  return {"input_ids": (rng.integers(5, 64, shape) * mask).astype(np.int32),
          "token_type_ids": (rng.integers(0, 2, shape) * mask).astype(np.int32), "attention_mask": mask}


@pytest.mark.parametrize("name, head, kwargs, choices", [
    ("mnli", jbert.BertForSequenceClassification, {"num_labels": 3}, None),
    ("conll2003", jbert.BertForTokenClassification, {"num_labels": 9}, None),
    ("hellaswag", jbert.BertForMultipleChoice, {}, 3)])
def test_a_bucketed_batch_gives_the_padded_batchs_logits_and_loss(name, head, kwargs, choices):
  task = tasks_lib.build_task(fd.finetune_config(name))
  model, params = _model_and_params(head, **kwargs)
  batch = _short(6, choices)
  rng = np.random.default_rng(0)
  if name == "conll2003":  # per-token labels, ignored (-100) past each row's tokens as the features have them
    batch["labels"] = np.where(batch["attention_mask"] == 1, rng.integers(0, 9, (6, T)), -100).astype(np.int32)
  else:
    batch["label"] = rng.integers(0, 3, 6).astype(np.int32)
  cut = bucketing.cut(batch, 16, (*MODEL_INPUTS, *task.token_keys))

  @jax.jit
  def logits_and_loss(batch):
    out = task.apply(model, params, batch, jax.random.key(0), deterministic=True)
    return out.logits, task.loss(task.loss_sums(out, batch), task.loss_totals(batch))

  (padded, padded_loss), (bucketed, bucketed_loss) = logits_and_loss(batch), logits_and_loss(cut)
  if name == "conll2003":
    padded = padded[:, :16]
  np.testing.assert_allclose(bucketed, padded, atol=1e-5, rtol=1e-5)
  assert abs(float(bucketed_loss) - float(padded_loss)) <= 1e-5 * max(1.0, float(padded_loss))


def test_a_step_accumulated_over_two_micro_batches_of_a_bucketed_batch_is_the_padded_step():
  task = tasks_lib.build_task(fd.finetune_config("mnli"))
  model, params = _model_and_params(jbert.BertForSequenceClassification, num_labels=3)
  tx = optax.sgd(1.0)  # the parameter change is the gradient itself
  state = step_lib.TrainState(step=np.int32(0), params=params, opt_state=tx.init(params),
                              rng=jax.random.key_data(jax.random.key(0)))
  batch = {**_short(8), "label": np.arange(8, dtype=np.int32) % 3}
  steps = {k: jax.jit(lambda s, b, k=k: step_lib.train_step(s, b, model=model, task=task, tx=tx,
                                                           schedule=lambda _: 1.0, grad_accum_steps=k))
           for k in (1, 2)}
  s_pad, m_pad = steps[1](state, batch)
  s_acc, m_acc = steps[2](state, bucketing.cut(batch, 16, MODEL_INPUTS))
  for key in ("loss", "accuracy", "grad_norm"):
    np.testing.assert_allclose(m_acc[key], m_pad[key], rtol=1e-5, atol=1e-6)
  assert int(m_acc["real_tokens"]) == int(m_pad["real_tokens"]) == int(batch["attention_mask"].sum())
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), s_acc.params, s_pad.params)
  assert float(m_pad["grad_norm"]) > 1e-3  # a real step

  # The stream's batches compile the step once per bucket length, not per batch.
  features = {k: np.concatenate([_short(16, seed=i)[k] for i in range(2)]) for k in MODEL_INPUTS}
  features["label"] = np.arange(32, dtype=np.int32) % 3
  features["attention_mask"][:4, :20] = 1  # a few rows reach bucket 24
  stream = _stream(features, mega_batch=4)
  shapes = set()
  for _ in range(8):
    batch = next(stream)
    shapes.add(batch["input_ids"].shape[1])
    steps[2](state, batch)
  assert shapes == {8, 12, 16, 24} and steps[2]._cache_size() == 4


def test_bucketed_evaluation_returns_the_padded_outputs_in_example_order():
  task = tasks_lib.build_task(fd.finetune_config("conll2003"))
  model, params = _model_and_params(jbert.BertForTokenClassification, num_labels=9)
  features = _features(21)
  mesh = sharding.make_mesh()
  data = sharding.batch_sharding(mesh)

  def logits_and_tags(params, batch):
    out = task.apply(model, params, batch, jax.random.key(0), deterministic=True)
    return {"logits": out.logits[:, 0], **task.predictions(out, batch)}

  predict = jax.jit(logits_and_tags)
  with jax.set_mesh(mesh):
    padded = evaluation.predict(predict, params, features, MODEL_INPUTS, global_batch_size=8, sharding=data)
    assert predict._cache_size() == 1
    bucketed = evaluation.predict(predict, params, features, MODEL_INPUTS, global_batch_size=8, sharding=data,
                                  buckets=bucketing.buckets(T), token_outputs=task.token_outputs)
  assert {k: v.shape for k, v in bucketed.items()} == {"logits": (21, 9), "tags": (21, T)}
  np.testing.assert_allclose(bucketed["logits"], padded["logits"], atol=1e-5, rtol=1e-5)
  mask = features["attention_mask"] == 1
  np.testing.assert_array_equal(np.where(mask, bucketed["tags"], 0), np.where(mask, padded["tags"], 0))
  # Batches of the 8, 8 and 5 longest rows: one compile per bucket they reach, all with the global batch size.
  lengths = np.sort(bucketing.row_lengths(features))[::-1]
  reached = {bucketing.bucket_of(lengths[i], bucketing.buckets(T)) for i in (0, 8, 16)}
  assert predict._cache_size() == 1 + len(reached - {T})

