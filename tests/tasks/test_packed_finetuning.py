"""Packed fine-tuning (`data.packing`): a packed batch computes, per example, what the unpacked one does (logits,
losses, the gradient, accumulated too) and what transformers computes on each example alone; a sequence never
moves its row neighbours; packed evaluation comes back in example order; tasks that cannot pack say so."""
import logging

import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
import torch

import jbert
from jbert import tasks as tasks_lib
from jbert.data import packing
from jbert.data import streams
from jbert.tasks.classification import sources
from jbert.model import init_params
from jbert.runtime import sharding
from jbert.tasks import MODEL_INPUTS
from jbert.tasks.cross_encoder import task as cross_encoder
from jbert.tasks.base import training_loss
from jbert.train import evaluation
from jbert.train import step as step_lib
from tests.model import test_parity as parity
from tests.tasks import finetune_data as fd

T, S, TOL = 32, 4, 1e-5


def _loss_logits_grads(task, model, output: str = "logits"):
  """A jitted (training loss, the model's `output`, gradients) of `batch` at `params`, without dropout."""
  @jax.jit
  def run(params, batch):
    def loss(params):
      out = task.apply(model, params, batch, jax.random.key(0), deterministic=True)
      return training_loss(task, task.loss(out, batch)), getattr(out, output)
    (value, logits), grads = jax.value_and_grad(loss, has_aux=True)(params)
    return value, logits, grads
  return run


def _model_and_params(head_cls, **kwargs):
  return fd.tiny_head(head_cls, layers=2, length=T, **kwargs)


def _features(n, *, vocab=64, seed=0):
  """n examples of 3..16 tokens, random ids and two token types: several fit in a row of T."""
  rng = np.random.default_rng(seed)
  mask = (np.arange(T) < rng.integers(3, 17, n)[:, None]).astype(np.int32)
  types = (np.arange(T) >= rng.integers(2, 9, n)[:, None]).astype(np.int32) * mask
  return {"input_ids": (rng.integers(1, vocab, (n, T)) * mask).astype(np.int32), "token_type_ids": types,
          "attention_mask": mask}


def _cross_encoder():
  return cross_encoder.CrossEncoder(sources.local_dataset("predict", {}, {"text_a": "a", "text_b": "b"}, None),
                                    loss="bce", max_seq_length=T)


CASES = {  # name -> (task, head, head kwargs)
    "classification": (lambda: tasks_lib.build_task(fd.finetune_config("mnli")),
                       jbert.BertForSequenceClassification, {"num_labels": 3}),
    "regression": (lambda: tasks_lib.build_task(fd.finetune_config("stsb")),
                   jbert.BertForSequenceClassification, {"num_labels": 1}),
    "cross_encoder": (_cross_encoder, jbert.BertForSequenceClassification, {"num_labels": 1}),
    "ner": (lambda: tasks_lib.build_task(fd.finetune_config("conll2003")),
            jbert.BertForTokenClassification, {"num_labels": 9}),
}


def _labelled(name, n, seed=0):
  features, rng = _features(n, seed=seed), np.random.default_rng(seed + 1)
  if name == "ner":  # per-token labels, ignored (-100) past each example's tokens and on a few of its own
    labels = rng.integers(0, 9, (n, T))
    features["labels"] = np.where((features["attention_mask"] == 1) & (rng.random((n, T)) < 0.8), labels,
                                  -100).astype(np.int32)
  elif name == "classification":
    features["label"] = rng.integers(0, 3, n).astype(np.int32)
  else:
    features["label"] = rng.random(n).astype(np.float32)
  return features


def _pack(task, features, *, extra_rows=1):
  """The examples packed as the stream packs them, plus an empty row and an empty slot in every row."""
  placement = packing.place(packing.example_lengths(features["attention_mask"]), max_tokens=T, max_sequences=S)
  token_keys = {k: task.token_fill[k] for k in task.token_keys}
  batch = packing.pack_examples(features, placement, rows=placement.rows + extra_rows, slots=S + 1,
                                token_keys=token_keys, example_keys=tuple(k for k in task.label_keys
                                                                          if k not in token_keys))
  assert placement.rows < len(features["input_ids"]) // 2  # several examples a row
  return batch, placement


def _packed_case(name):
  """Case `name`'s task, model and params, 12 labelled examples, and those examples packed (batch, placement)."""
  make, head, kwargs = CASES[name]
  task = make()
  model, params = _model_and_params(head, **kwargs)
  features = _labelled(name, 12)
  return task, model, params, features, *_pack(task, features)


@pytest.mark.parametrize("name", list(CASES))
def test_a_packed_batch_gives_each_examples_logits_loss_and_gradient_unpacked(name):
  task, model, params, features, packed, placement = _packed_case(name)
  token = ("logits",) if name == "ner" else ()

  run = _loss_logits_grads(task, model)

  (want_loss, want, want_grads), (got_loss, got, got_grads) = run(params, features), run(params, packed)
  got = packing.unpack_outputs({"logits": got}, placement, token_outputs=token, length=T)["logits"]
  if name == "ner":  # only each example's own tokens exist packed (zeros past them)
    want = np.where(features["attention_mask"][..., None] == 1, want, 0.0)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, atol=TOL, rtol=TOL)
  assert abs(float(got_loss) - float(want_loss)) <= TOL * max(1.0, abs(float(want_loss)))
  assert float(want_loss) > 0.05
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=TOL, rtol=1e-4), got_grads, want_grads)
  assert max(float(np.abs(g).max()) for g in jax.tree.leaves(want_grads)) > 1e-3  # a real gradient


def test_a_packed_step_accumulated_over_two_micro_batches_is_the_unpacked_step():
  task, head, kwargs = CASES["classification"]
  task = task()
  model, params = _model_and_params(head, **kwargs)
  tx = optax.sgd(1.0)  # the parameter change is the gradient itself
  state = step_lib.TrainState(step=np.int32(0), params=params, opt_state=tx.init(params),
                              rng=jax.random.key_data(jax.random.key(0)))
  features = _labelled("classification", 16, seed=4)
  packed, placement = _pack(task, features, extra_rows=0)
  packed = {k: np.concatenate([v, np.zeros_like(v[:placement.rows % 2])]) for k, v in packed.items()}  # even rows
  steps = {k: jax.jit(lambda s, b, k=k: step_lib.train_step(s, b, model=model, task=task, tx=tx,
                                                           schedule=lambda _: 1.0, grad_accum_steps=k))
           for k in (1, 2)}
  s_pad, m_pad = steps[1](state, features)
  s_acc, m_acc = steps[2](state, packed)
  for key in ("loss", "accuracy", "grad_norm"):
    np.testing.assert_allclose(m_acc[key], m_pad[key], rtol=1e-5, atol=1e-6)
  assert int(m_acc["real_tokens"]) == int(m_pad["real_tokens"]) == int(features["attention_mask"].sum())
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), s_acc.params, s_pad.params)
  assert float(m_pad["grad_norm"]) > 1e-3


@pytest.mark.parametrize("name", ["classification", "ner"])
def test_a_sequence_never_moves_its_row_neighbours(name):
  task, model, params, features, packed, placement = _packed_case(name)
  row = int(np.bincount(placement.row).argmax())  # a row with several sequences
  victim = int(np.nonzero(placement.row == row)[0][0])
  changed = {k: v.copy() for k, v in packed.items()}
  here = changed["segment_ids"][row] == placement.slot[victim] + 1
  changed["input_ids"][row, here] = (changed["input_ids"][row, here] + 7) % 63 + 1
  changed["token_type_ids"][row, here] = 1 - changed["token_type_ids"][row, here]
  apply = jax.jit(lambda b: task.apply(model, params, b, jax.random.key(0), deterministic=True).logits)
  before, after = (np.asarray(x) for x in (apply(packed), apply(changed)))
  token = ("logits",) if name == "ner" else ()
  before, after = (packing.unpack_outputs({"logits": x}, placement, token_outputs=token, length=T)["logits"]
                   for x in (before, after))
  others = np.arange(len(placement.row)) != victim
  np.testing.assert_array_equal(after[others], before[others])  # bit-identical
  assert np.abs(after[victim] - before[victim]).max() > 1e-3


@pytest.mark.parametrize("name", ["classification", "ner"])
def test_a_packed_batch_equals_transformers_on_each_example_alone(name):
  cls = jbert.BertForTokenClassification if name == "ner" else jbert.BertForSequenceClassification
  torch_model, state, config = parity._torch_model(cls, num_labels=3)  # pylint: disable=protected-access
  model, params = parity._load(cls, state, config, num_labels=3)  # pylint: disable=protected-access
  task = CASES[name][0]()
  features = _labelled(name, 10, seed=2)
  features.update(_features(10, vocab=parity.HF_SIZES["vocab_size"], seed=2))
  packed, placement = _pack(task, features)
  got = task.apply(model, params, packed, jax.random.key(0), deterministic=True).logits
  token = ("logits",) if name == "ner" else ()
  got = packing.unpack_outputs({"logits": np.asarray(got)}, placement, token_outputs=token, length=T)["logits"]
  for i, n in enumerate(placement.length):
    alone = [features[k][i:i + 1, :n] for k in MODEL_INPUTS]
    with torch.no_grad():
      want = torch_model(**{k: torch.tensor(v, dtype=torch.long) for k, v in zip(MODEL_INPUTS, alone)}).logits
    want = want.numpy()[0]
    assert np.abs((got[i, :n] if name == "ner" else got[i]) - want).max() <= TOL


def test_packed_evaluation_returns_the_unpacked_outputs_in_example_order():
  task = tasks_lib.build_task(fd.finetune_config("conll2003"))
  model, params = _model_and_params(jbert.BertForTokenClassification, num_labels=9)
  features = fd.varied_length_features(21)
  features["input_ids"] = (features["input_ids"] * 7 + np.arange(T)) % 60 * features["attention_mask"]
  mesh = sharding.make_mesh()
  data = sharding.batch_sharding(mesh)

  def logits_and_tags(params, batch):
    out = task.apply(model, params, batch, jax.random.key(0), deterministic=True)
    first = out.logits[:, 0] if "cls_positions" not in batch else None
    return {**task.predictions(out, batch), **({"first": first} if first is not None else {})}

  predict = jax.jit(logits_and_tags)
  with jax.set_mesh(mesh):
    padded = evaluation.predict(predict, params, features, MODEL_INPUTS, global_batch_size=8, sharding=data)
    packed = evaluation.predict(predict, params, features, MODEL_INPUTS, global_batch_size=8, sharding=data,
                                slots=S, token_outputs=task.token_outputs)
  assert {k: v.shape for k, v in packed.items()} == {"tags": (21, T)}
  mask = features["attention_mask"] == 1
  np.testing.assert_array_equal(np.where(mask, packed["tags"], 0), np.where(mask, padded["tags"], 0))
  assert predict._cache_size() == 2  # the padded shape and the one packed shape (8 rows of T)
  assert evaluation.packed_shapes(features, global_batch_size=8, slots=S)[0]["cls_positions"].shape == (8, S)


def test_tasks_that_cannot_pack_say_so_once_and_keep_their_batches(caplog):
  with caplog.at_level(logging.INFO, logger="jbert"):
    squad = tasks_lib.build_task(fd.finetune_config("squad", **{"data.max_seq_length": 128}))
    mnrl = tasks_lib.build_task(fd.finetune_config("mnrl", **{"optim.grad_accum_steps": 2}))
  assert squad.packed_slots() is None and squad.buckets() is None
  assert mnrl.packed_slots() is None and mnrl.buckets() == (8, 12, 16)
  lines = [r.getMessage() for r in caplog.records if "data.packing" in r.getMessage()]
  assert lines == [
      "task squad: data.packing does not apply to its batches (SQuAD windows: every window of a context but its "
      "last is full); they stay padded to max_seq_length.",
      "task mnrl: data.packing does not apply with optim.grad_accum_steps > 1 (micro-batches would split an "
      "example's texts from its rows); its batches stay length-bucketed."]
  for name in ("mnli", "hellaswag", "mnrl"):
    on = tasks_lib.build_task(fd.finetune_config(name))
    off = tasks_lib.build_task(fd.finetune_config(name, **{"data.packing": False}))
    assert on.packed_slots() == 2 and off.packed_slots() is None  # max_seq_length 16: one slot per 8 tokens
    assert off.buckets() == (8, 12, 16)



def test_multiple_choice_packs_each_examples_endings_side_by_side_with_its_unpacked_scores_loss_and_gradient():
  task = tasks_lib.build_task(fd.finetune_config("hellaswag"))
  task.num_choices = 3
  model, params = _model_and_params(jbert.BertForMultipleChoice)
  n, c, t = 8, 3, 12
  rng = np.random.default_rng(5)
  mask = (np.arange(t) < rng.integers(3, 9, (n, c))[..., None]).astype(np.int32)
  features = {"input_ids": (rng.integers(1, 64, (n, c, t)) * mask).astype(np.int32),
              "token_type_ids": (np.arange(t) >= 2).astype(np.int32) * mask, "attention_mask": mask,
              "label": rng.integers(0, c, n).astype(np.int32)}
  examples, endings = packing.place_choices(packing.example_lengths(mask), max_tokens=c * t, max_examples=S)
  assert examples.rows < n  # several examples a row, each one's endings in one row, in order
  assert np.array_equal(endings.row.reshape(n, c), np.repeat(examples.row[:, None], c, 1))
  packed = packing.pack_choices(features, examples, endings, rows=examples.rows + 1, max_examples=S,
                                example_keys=("label",))
  assert packed["input_ids"].shape == (examples.rows + 1, c * t) and packed["label"].shape == (examples.rows + 1, S)
  assert task.train_spec(examples.rows + 1, c * t)["cls_positions"].shape == (examples.rows + 1, 2 * c)  # E = 2

  run = _loss_logits_grads(task, model)

  (want_loss, want, want_grads), (got_loss, got, got_grads) = run(params, features), run(params, packed)
  got = packing.unpack_outputs({"logits": np.asarray(got)}, endings, length=c * t)["logits"].reshape(n, c)
  np.testing.assert_allclose(got, want, atol=TOL, rtol=TOL)
  assert abs(float(got_loss) - float(want_loss)) <= TOL * max(1.0, float(want_loss)) and float(want_loss) > 0.5
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=TOL, rtol=1e-4), got_grads, want_grads)

  # The packed evaluation gives each example's C scores back in example order.
  mesh = sharding.make_mesh()
  predict = jax.jit(lambda p, b: task.predictions(task.apply(model, p, b, jax.random.key(0), deterministic=True), b))
  with jax.set_mesh(mesh):
    evaluated = evaluation.predict(predict, params, features, MODEL_INPUTS, global_batch_size=8,
                                   sharding=sharding.batch_sharding(mesh), slots=S)
  np.testing.assert_allclose(evaluated["logits"], want, atol=TOL, rtol=TOL)


@pytest.mark.parametrize("objective", ["sts_cosine", "nli_softmax", "mnrl", "triplet"])
def test_every_bi_encoder_loss_is_the_unpacked_one_with_texts_packed_across_rows(objective):
  task = tasks_lib.build_task(fd.finetune_config(objective, batch_size=8, **{"data.max_sequences_per_row": S}))
  config = jbert.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=T, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
  model = task.model(config)
  params = nn.meta.unbox(init_params(model, jax.random.key(1)))
  n, k = 8, task.num_texts
  rng = np.random.default_rng(3)
  mask = (np.arange(T) < rng.integers(3, 12, (n, k))[..., None]).astype(np.int32)
  features = {"input_ids": (rng.integers(1, 64, (n, k, T)) * mask).astype(np.int32),
              "token_type_ids": np.zeros((n, k, T), np.int32), "attention_mask": mask,
              "label": (rng.integers(0, 3, n).astype(np.int32) if objective == "nli_softmax"
                        else rng.random(n).astype(np.float32))}
  # The task's own stream over 2 data shards (text_slots index the global batch across them), and the seeded
  # stream's first batch unpacked.
  task._train = features  # pylint: disable=protected-access
  packed = next(task.train_stream(streams.DataShards(2, (0, 1), n // 2)))
  plain = {key: v[np.random.default_rng([0, 0]).permutation(n)] for key, v in features.items()}
  assert packed["text_slots"].shape == (n, k) and len(packed["input_ids"]) < n * k
  assert {key: v.shape for key, v in task.train_spec(len(packed["input_ids"]), T).items()} == {
      key: v.shape for key, v in packed.items()}

  run = _loss_logits_grads(task, model, "embeddings")

  (want_loss, want, want_grads), (got_loss, got, got_grads) = run(params, plain), run(params, packed)
  np.testing.assert_allclose(got, want, atol=TOL, rtol=TOL)
  assert abs(float(got_loss) - float(want_loss)) <= TOL * max(1.0, abs(float(want_loss)))
  assert float(want_loss) > 1e-3
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=TOL, rtol=1e-4), got_grads, want_grads)
  assert max(float(np.abs(g).max()) for g in jax.tree.leaves(want_grads)) > 1e-4


def test_no_slots_a_row_is_refused_naming_the_key_not_read_as_one():
  config = fd.finetune_config("mnli")
  config.data.max_sequences_per_row = 0
  with pytest.raises(ValueError, match=r"^data\.max_sequences_per_row=0 must be >= 1 with data\.packing \(the "
                                       r"default follows max_seq_length"):
    tasks_lib.build_task(config)
  config.data.packing = False  # unpacked, the key is not read
  assert not tasks_lib.build_task(config).packing
