"""Pretraining on packed rows: the same per-sequence logits, losses and gradients as the sequences unpacked, and
as transformers' BertForPreTraining run on each sequence alone; exact normalisation, also accumulated."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
import transformers

import jbert.model as jm
from jbert.data import masking, packing
from jbert.tasks import Pretraining
from jbert.tasks.base import reported, training_loss
from jbert.train import step as step_lib
from jbert.weights.hf_names import hf_to_params

T, P, S = 32, 6, 4
LAYOUT = packing.Layout.of(P, S)
VOCAB, CLS, SEP, MASK = 99, 2, 3, 4
TOL = 1e-5


def _instances(n: int, seed: int) -> dict[str, np.ndarray]:
  """`n` masked NSP instances of 5..T tokens ([CLS] A [SEP] B [SEP]) in the loader's unpacked format."""
  rng = np.random.default_rng(seed)
  lengths = np.concatenate([[T], rng.integers(5, T // 2, n - 1)])  # one full row and many short ones
  ids, types = np.zeros((n, T), np.int32), np.zeros((n, T), np.int32)
  for i, length in enumerate(lengths):
    a = int(rng.integers(1, length - 3))
    ids[i, :length] = [CLS, *rng.integers(5, VOCAB, a), SEP, *rng.integers(5, VOCAB, length - a - 3), SEP]
    types[i, a + 2:length] = 1
  special = np.zeros(VOCAB, bool)
  special[:5] = True
  masker = masking.Masker(special_mask=special, continuation_mask=None, mask_id=MASK, max_predictions=P,
                          masked_lm_prob=0.3)
  batch = dict(input_ids=ids, token_type_ids=types, attention_mask=(ids > 0).astype(np.int32),
               next_sentence_labels=rng.integers(0, 2, n).astype(np.int32))
  batch.update(masker(ids, rng))
  return batch


@pytest.fixture(scope="module")
def models():
  """transformers' BertForPreTraining with random weights (LayerNorms and biases too) and jbert's with them."""
  torch.manual_seed(0)
  hf_config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      intermediate_size=64, max_position_embeddings=T,
                                      attn_implementation="eager")
  torch_model = transformers.BertForPreTraining(hf_config).eval()
  with torch.no_grad():
    for name, p in torch_model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        p.add_(0.3 * torch.randn_like(p))
  state = {k: v.numpy() for k, v in torch_model.state_dict().items()}
  config = jm.BertConfig.from_dict(hf_config.to_dict())
  config = dataclasses.replace(config, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  params, unused, missing = hf_to_params(state, config, jm.BertForPreTraining)
  assert unused == [] and missing == []
  return torch_model, jm.BertForPreTraining(config), params


@pytest.fixture(scope="module")
def batches():
  """(packed rows, the same sequences unpacked in the packed order): 14 sequences in fewer rows."""
  packed = packing.pack(_instances(14, seed=1), layout=LAYOUT, pad_id=0, rng=np.random.default_rng(0))
  assert len(packed["input_ids"]) < 14 and packed["sequence_weights"].sum(1).max() > 1
  return packed, packing.unpack(packed)  # at the packed rows' prediction width


def _run(task, model, params, batch):
  """(outputs, loss, train metrics, gradients) of `batch`, in one jitted program."""
  batch = jax.tree.map(jnp.asarray, batch)

  def loss_fn(p):
    outputs = task.apply(model, p, batch, jax.random.key(0), deterministic=True)
    entries = task.loss(outputs, batch)
    return training_loss(task, entries), (outputs, entries)
  (loss, (outputs, entries)), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
  return outputs, loss, reported(task, entries), grads


def test_packed_equals_unpacked_logits_losses_and_gradients(models, batches):
  _, model, params = models
  packed, unpacked = batches
  on, off = Pretraining(nsp=True, max_predictions=P, packed=LAYOUT), Pretraining(nsp=True, max_predictions=P)
  a, loss_a, metrics_a, grads_a = _run(on, model, params, packed)
  b, loss_b, metrics_b, grads_b = _run(off, model, params, unpacked)
  picked_a, picked_b = packed["masked_lm_weights"] > 0, unpacked["masked_lm_weights"] > 0
  assert picked_a.sum() == picked_b.sum() > 14
  mlm_a, mlm_b = np.asarray(a.mlm_logits)[picked_a], np.asarray(b.mlm_logits)[picked_b]  # row, slot, position order
  assert np.abs(mlm_a - mlm_b).max() <= TOL
  assert a.nsp_logits.shape == (len(packed["input_ids"]), S, 2)
  nsp_a = np.asarray(a.nsp_logits)[packed["sequence_weights"] > 0]
  assert np.abs(nsp_a - np.asarray(b.nsp_logits)).max() <= TOL
  assert abs(float(loss_a) - float(loss_b)) <= TOL
  for key in ("mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
    assert abs(float(metrics_a[key]) - float(metrics_b[key])) <= TOL, key
  # NSP is normalised by the 14 real sequences, not by the rows or the slots.
  logp = jax.nn.log_softmax(np.asarray(b.nsp_logits, np.float64))
  want = -np.mean(np.asarray(logp)[np.arange(14), unpacked["next_sentence_labels"]])
  assert abs(float(metrics_a["nsp_loss"]) - want) <= TOL
  diffs = jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.abs(x - y).max()), grads_a, grads_b))
  assert max(diffs) <= TOL
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads_a)) > 1e-3  # gradients that mean something

  # Evaluation: per real sequence, the same metrics as unpacked.
  rows_a = jax.device_get(jax.jit(lambda p, x: step_lib.predict_step(p, x, model=model, task=on))(params, packed))
  rows_b = jax.device_get(jax.jit(lambda p, x: step_lib.predict_step(p, x, model=model, task=off))(params, unpacked))
  sequences = rows_a["nsp_loss_denominator"]
  assert sequences.sum() == 14 and sequences.shape == (len(packed["input_ids"]),)
  eval_a, eval_b = on.evaluate(None, rows_a), off.evaluate(None, rows_b)
  assert eval_a.keys() == eval_b.keys()
  for key in eval_a:
    assert abs(eval_a[key] - eval_b[key]) <= TOL, key


def test_packed_rows_equal_transformers_on_each_sequence_alone(models, batches):
  torch_model, model, params = models
  packed, unpacked = batches
  task = Pretraining(nsp=True, max_predictions=P, packed=LAYOUT)
  out = jax.jit(lambda p, x: task.apply(model, p, x, jax.random.key(0), deterministic=True))(params, packed)
  mlm = np.asarray(out.mlm_logits)[packed["masked_lm_weights"] > 0]
  nsp = np.asarray(out.nsp_logits)[packed["sequence_weights"] > 0]
  want_mlm, want_nsp = [], []
  for i in range(len(unpacked["input_ids"])):
    n = int(unpacked["attention_mask"][i].sum())
    with torch.no_grad():
      want = torch_model(input_ids=torch.tensor(unpacked["input_ids"][i:i + 1, :n], dtype=torch.long),
                         token_type_ids=torch.tensor(unpacked["token_type_ids"][i:i + 1, :n], dtype=torch.long))
    picked = unpacked["masked_lm_positions"][i][unpacked["masked_lm_weights"][i] > 0]
    want_mlm.append(want.prediction_logits[0].numpy()[picked])
    want_nsp.append(want.seq_relationship_logits[0].numpy())
  assert np.abs(mlm - np.concatenate(want_mlm)).max() <= TOL
  assert np.abs(nsp - np.stack(want_nsp)).max() <= TOL


def test_accumulated_micro_batches_of_packed_rows_give_the_whole_batch(models):
  _, model, params = models
  packed = packing.pack(_instances(40, seed=2), layout=LAYOUT, pad_id=0, rng=np.random.default_rng(1))
  rows = len(packed["input_ids"]) // 4 * 4
  packed = {k: v[:rows] for k, v in packed.items()}
  # Micro-batches of one sequence per row and of several: the per-micro-batch sequence counts differ.
  assert len(set(packed["sequence_weights"].sum(1))) > 1
  task = Pretraining(nsp=True, max_predictions=P, packed=LAYOUT)
  tx = optax.sgd(1.0)  # params_after = params - grads: parameters compare the gradients themselves
  state = step_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                              rng=step_lib.dropout_key_data(jax.random.key(0)))
  results = {}
  for k in (1, 4):
    fn = jax.jit(lambda s, b, k=k: step_lib.train_step(s, b, model=model, task=task, tx=tx,
                                                        schedule=lambda _: 1.0, grad_accum_steps=k))
    results[k] = fn(state, packed)
  (s1, m1), (s4, m4) = results[1], results[4]
  for key in ("loss", "mlm_accuracy", "nsp_accuracy", "nsp_loss", "grad_norm"):
    np.testing.assert_allclose(m4[key], m1[key], rtol=1e-5, atol=1e-6)
  assert int(m1["real_tokens"]) == int(packed["attention_mask"].sum())
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6), s4.params, s1.params)


def test_batch_spec_of_packed_rows():
  spec = Pretraining(nsp=True, max_predictions=20, packed=packing.Layout.of(20, 16)).batch_spec(4, 128)
  assert {k: v.shape for k, v in spec.items()} == {
      "input_ids": (4, 128), "token_type_ids": (4, 128), "attention_mask": (4, 128), "segment_ids": (4, 128),
      "position_ids": (4, 128), "masked_lm_positions": (4, 20), "masked_lm_ids": (4, 20),
      "masked_lm_weights": (4, 20), "cls_positions": (4, 16), "next_sentence_labels": (4, 16),
      "sequence_weights": (4, 16)}
  assert all(v.dtype == jnp.int32 for v in spec.values())
