"""Length-bucketed fine-tuning: a bucketed batch computes what the padded one does (logits, losses, the accumulated
gradient), evaluation comes back in example order, and a run compiles one train step per bucket."""
import jax
import numpy as np
import optax
import pytest

import jbert
from jbert import tasks as tasks_lib
from jbert.data import streams
from jbert.runtime import sharding
from jbert.tasks import MODEL_INPUTS
from jbert.tasks.base import training_loss
from jbert.train import evaluation
from jbert.train import step as step_lib
from tests.tasks import finetune_data as fd

T = 32


def _model_and_params(head_cls, **kwargs):
  return fd.tiny_head(head_cls, layers=1, length=T, **kwargs)


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
  cut = streams.cut(batch, 16, (*MODEL_INPUTS, *task.token_keys))

  @jax.jit
  def logits_and_loss(batch):
    out = task.apply(model, params, batch, jax.random.key(0), deterministic=True)
    return out.logits, training_loss(task, task.loss(out, batch))

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
  s_acc, m_acc = steps[2](state, streams.cut(batch, 16, MODEL_INPUTS))
  for key in ("loss", "accuracy", "grad_norm"):
    np.testing.assert_allclose(m_acc[key], m_pad[key], rtol=1e-5, atol=1e-6)
  assert int(m_acc["real_tokens"]) == int(m_pad["real_tokens"]) == int(batch["attention_mask"].sum())
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), s_acc.params, s_pad.params)
  assert float(m_pad["grad_norm"]) > 1e-3  # a real step

  # The stream's batches compile the step once per bucket length, not per batch.
  features = {k: np.concatenate([_short(16, seed=i)[k] for i in range(2)]) for k in MODEL_INPUTS}
  features["label"] = np.arange(32, dtype=np.int32) % 3
  features["attention_mask"][:4, :20] = 1  # a few rows reach bucket 24
  stream = streams.BucketedStream(features, (*MODEL_INPUTS, "label"), global_batch_size=8, seed=7, num_shards=1,
                                  shards=(0,), lengths=streams.buckets(T), sequence_keys=MODEL_INPUTS, mega_batch=4)
  shapes = set()
  for _ in range(8):
    batch = next(stream)
    shapes.add(batch["input_ids"].shape[1])
    steps[2](state, batch)
  assert shapes == {8, 12, 16, 24} and steps[2]._cache_size() == 4


def test_bucketed_evaluation_returns_the_padded_outputs_in_example_order():
  task = tasks_lib.build_task(fd.finetune_config("conll2003"))
  model, params = _model_and_params(jbert.BertForTokenClassification, num_labels=9)
  features = fd.varied_length_features(21)
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
                                  buckets=streams.buckets(T), token_outputs=task.token_outputs)
  assert {k: v.shape for k, v in bucketed.items()} == {"logits": (21, 9), "tags": (21, T)}
  np.testing.assert_allclose(bucketed["logits"], padded["logits"], atol=1e-5, rtol=1e-5)
  mask = features["attention_mask"] == 1
  np.testing.assert_array_equal(np.where(mask, bucketed["tags"], 0), np.where(mask, padded["tags"], 0))
  # Batches of the 8, 8 and 5 longest rows: one compile per bucket they reach, all with the global batch size.
  lengths = np.sort(streams.row_lengths(features))[::-1]
  reached = {streams.bucket_of(lengths[i], streams.buckets(T)) for i in (0, 8, 16)}
  assert predict._cache_size() == 1 + len(reached - {T})

