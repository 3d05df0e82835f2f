"""Length-bucketed fine-tuning: the stream keeps the seeded stream's guarantees (each example once per epoch,
bit-exact resume, the same global batches for any number of data shards), a bucketed batch computes what the
padded one does (logits, losses, the accumulated gradient), evaluation comes back in example order, and a run
compiles one train step per bucket and logs the exact padding fraction."""
import json
import pathlib

import flax.linen as nn
import jax
import ml_collections
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
from jbert.train import trainer as train
from tests.tasks import finetune_data as fd

T = 32
KEYS = (*MODEL_INPUTS, "label")


def test_buckets_are_few_known_up_front_and_end_at_the_maximum():
  assert bucketing.buckets(128) == (16, 24, 32, 48, 64, 96, 128)
  assert bucketing.buckets(384) == (16, 24, 32, 48, 64, 96, 128, 192, 256, 384)
  assert bucketing.buckets(100) == (16, 24, 32, 48, 64, 96, 100)
  assert bucketing.buckets(12) == (12,)
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
      np.testing.assert_array_equal(batch["attention_mask"], features["attention_mask"][ids, :batch["input_ids"].shape[1]])
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


def test_rows_of_several_sequences_take_their_longest():
  features = _features(12, choices=3)
  lengths = bucketing.row_lengths(features)
  np.testing.assert_array_equal(lengths, features["attention_mask"].sum(-1).max(-1))
  batch = next(_stream(features, batch=4, mega_batch=1))
  assert batch["input_ids"].shape == (4, 3, bucketing.bucket_of(lengths[batch["label"]].max(), bucketing.buckets(T)))


def _model_and_params(head_cls, **kwargs):
  config = jbert.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
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
  outputs = [task.apply(model, params, b, jax.random.key(0), deterministic=True) for b in (batch, cut)]
  padded, bucketed = (np.asarray(o.logits) for o in outputs)
  if name == "conll2003":
    padded = padded[:, :16]
  np.testing.assert_allclose(bucketed, padded, atol=1e-5, rtol=1e-5)
  losses = [float(task.loss(task.loss_sums(o, b), task.loss_totals(b))) for o, b in zip(outputs, (batch, cut))]
  assert abs(losses[1] - losses[0]) <= 1e-5 * max(1.0, losses[0])


def test_an_accumulated_step_on_a_bucketed_batch_is_the_padded_step():
  task = tasks_lib.build_task(fd.finetune_config("mnli"))
  model, params = _model_and_params(jbert.BertForSequenceClassification, num_labels=3)
  tx = optax.sgd(1.0)  # the parameter change is the gradient itself
  state = step_lib.TrainState(step=np.int32(0), params=params, opt_state=tx.init(params),
                              rng=jax.random.key_data(jax.random.key(0)))
  batch = {**_short(8), "label": np.arange(8, dtype=np.int32) % 3}
  cut = bucketing.cut(batch, 16, MODEL_INPUTS)
  results = [jax.jit(lambda s, b, k=k: step_lib.train_step(s, b, model=model, task=task, tx=tx,
                                                          schedule=lambda _: 1.0, grad_accum_steps=k))(state, b)
             for b, k in ((batch, 1), (cut, 1), (cut, 2))]
  (s_pad, m_pad), (s_cut, m_cut), (s_acc, m_acc) = results
  for metrics in (m_cut, m_acc):
    for key in ("loss", "accuracy", "grad_norm"):
      np.testing.assert_allclose(metrics[key], m_pad[key], rtol=1e-5, atol=1e-6)
    assert int(metrics["real_tokens"]) == int(batch["attention_mask"].sum())
  for s in (s_cut, s_acc):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), s.params, s_pad.params)


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


def _varied_rows(n, seed):
  """Texts of 1..28 words (3..30 tokens): the label is whether w0 is among them."""
  rng = np.random.default_rng(seed)
  rows = []
  for i in range(n):
    words = [f"w{j}" for j in rng.integers(1, 40, int(rng.integers(1, 29)))]
    if i % 2:
      words[int(rng.integers(len(words)))] = "w0"
    rows.append({"a": " ".join(words), "label": ("no", "yes")[i % 2]})
  return rows


def test_a_run_compiles_one_step_per_bucket_and_logs_the_exact_padding_fraction(tmp_path, monkeypatch):
  data = tmp_path / "data"
  overrides = {"task.train_file": str(fd.write_rows(data / "train.csv", _varied_rows(64, 1), ("a", "label"))),
               "task.eval_file": str(fd.write_rows(data / "dev.csv", _varied_rows(20, 2), ("a", "label"))),
               "task.text_a": "a", "task.label": "label", "task.label_names": "no,yes"}
  config = fd.finetune_config("local", init_from=str(fd.tiny_checkpoint(tmp_path / "ckpt")), total_steps=7,
                              batch_size=8, log_every_steps=3, checkpoint_every_steps=0, async_checkpointing=False,
                              **{"data.max_seq_length": T}, **overrides)
  built = []
  monkeypatch.setattr(train, "build_steps", lambda *a: built.append(train_build_steps(*a)) or built[-1])
  train.train_and_evaluate(config, str(tmp_path / "run"))

  # The same batches again, from the run's recorded config: the buckets they reach and their real tokens.
  recorded = ml_collections.ConfigDict(json.loads((tmp_path / "run" / "config.json").read_text())["config"])
  stream = train.plan(recorded).batches
  batches = [next(stream) for _ in range(7)]
  lengths = {b["input_ids"].shape[1] for b in batches}
  assert len(lengths) >= 2 and built[0].train._cache_size() == len(lengths)
  lines = [json.loads(l) for l in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  logged = {l["step"]: l for l in lines if "train/padding_fraction" in l}
  assert sorted(logged) == [3, 6, 7]
  for step, window in ((3, batches[1:3]), (6, batches[3:6]), (7, batches[6:7])):  # step 1 (compile) left out
    real = sum(int(b["attention_mask"].sum()) for b in window)
    padded = sum(b["attention_mask"].size for b in window)
    assert logged[step]["train/padding_fraction"] == pytest.approx(1 - real / padded, abs=1e-12)
    rate = logged[step]["train/steps_per_sec"]
    assert logged[step]["train/tokens_per_sec"] == pytest.approx(rate * real / len(window), rel=1e-9)
  results = json.loads((tmp_path / "run" / "results.json").read_text())
  assert set(results["metrics"]["validation"]) >= {"accuracy"}


train_build_steps = train.build_steps
