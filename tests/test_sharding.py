"""Mesh construction, rule mapping and equivalence of the same training, and of fine-tuning's evaluation, on
different meshes."""
import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from conftest import make_pretrain_batch
from jbert import weights
from jbert.runtime import sharding
from jbert.train import evaluation
from jbert.train import trainer as train
from jbert.train import step as step_lib
from jbert.tasks import Pretraining
from jbert.model import BertForPreTraining
from tests.tasks import finetune_data as fd

pytestmark = pytest.mark.devices(8)  # meshes of up to 8 devices


def test_mesh_shape_fills_minus_one_and_rejects_mismatches():
  assert sharding.mesh_shape(-1, 2, 2, 8) == (2, 2, 2)
  assert sharding.mesh_shape(8, 1, 1, 8) == (8, 1, 1)
  with pytest.raises(ValueError, match=r"2×2×1 = 4 does not match the 8 available devices"):
    sharding.mesh_shape(2, 2, 1, 8)
  with pytest.raises(ValueError, match="at most one of"):
    sharding.mesh_shape(-1, -1, 1, 8)
  with pytest.raises(ValueError, match="not divisible"):
    sharding.mesh_shape(-1, 3, 1, 8)


def test_rules_map_weights_as_documented(tiny_bert_config):
  mesh = sharding.make_mesh(2, 2, 2)
  model = BertForPreTraining(tiny_bert_config)
  abstract, shardings = sharding.abstract_and_shardings(
      lambda r: step_lib.init_state(model, optax.adamw(1e-3), r, (1, 8)), mesh, sharding.DEFAULT_RULES,
      jax.random.key(0))
  params = shardings.params
  layer = params["bert"]["encoder"]["layer_0"]
  assert params["bert"]["embeddings"]["word_embeddings"]["embedding"].spec == P("tensor", "fsdp")
  assert layer["attention"]["query"]["kernel"].spec == P("fsdp", "tensor", None)
  assert layer["attention"]["out"]["kernel"].spec == P("tensor", None, "fsdp")
  assert layer["mlp"]["wi"]["kernel"].spec == P("fsdp", "tensor")
  assert layer["mlp"]["wo"]["kernel"].spec == P("tensor", "fsdp")
  assert params["nsp"]["kernel"].spec == P("fsdp", None)
  # Adam's moments are laid out like the parameters they track.
  mu = shardings.opt_state[0].mu if hasattr(shardings.opt_state[0], "mu") else None
  if mu is not None:
    assert mu["bert"]["encoder"]["layer_0"]["mlp"]["wi"]["kernel"].spec == P("fsdp", "tensor")
  report = sharding.sharding_report(abstract, shardings)
  assert report.per_device_bytes < report.total_bytes / 3


def test_undivisible_dimension_falls_back_to_replication(tiny_bert_config):
  import dataclasses
  config = dataclasses.replace(tiny_bert_config, vocab_size=127)
  mesh = sharding.make_mesh(2, 2, 2)
  model = BertForPreTraining(config)
  _, shardings = sharding.abstract_and_shardings(
      lambda r: step_lib.init_state(model, optax.sgd(0.1), r, (1, 8)), mesh, sharding.DEFAULT_RULES,
      jax.random.key(0))
  assert shardings.params["bert"]["embeddings"]["word_embeddings"]["embedding"].spec == P(None, "fsdp")
  assert shardings.params["mlm"]["output_bias"].spec == P(None)


def _run(mesh_dims, config, steps=4):
  devices = jax.devices()[:int(np.prod(mesh_dims))]
  mesh = sharding.make_mesh(*mesh_dims, devices=devices)
  rules = sharding.DEFAULT_RULES
  tx = optax.adamw(1e-3, weight_decay=0.01)
  model = BertForPreTraining(config)
  with jax.set_mesh(mesh), __import__("flax").linen.logical_axis_rules(rules):
    init = lambda r: step_lib.init_state(model, tx, r, (1, 8))
    _, shardings = sharding.abstract_and_shardings(init, mesh, rules, jax.random.key(0))
    state = jax.jit(lambda r: __import__("flax").linen.meta.unbox(init(r)), out_shardings=shardings)(
        jax.random.key(0))
    data = sharding.batch_sharding(mesh)
    task = Pretraining(max_predictions=4)
    step = jax.jit(lambda s, b: step_lib.train_step(s, b, model=model, task=task, tx=tx, schedule=lambda _: 1e-3),
                   in_shardings=(shardings, data), out_shardings=(shardings, sharding.replicated(mesh)),
                   donate_argnums=0)
    losses = []
    for i in range(steps):
      batch = jax.device_put(make_pretrain_batch(10 + i), data)
      state, metrics = step(state, batch)
      losses.append(float(metrics["loss"]))
  return np.array(losses), jax.device_get(state.params)


def test_same_training_on_every_mesh(tiny_bert_config):
  ref_losses, ref_params = _run((1, 1, 1), tiny_bert_config)
  assert ref_losses[-1] < ref_losses[0]
  for dims in ((8, 1, 1), (2, 2, 2), (1, 4, 2)):  # data alone, all three axes, fsdp with tensor
    losses, params = _run(dims, tiny_bert_config)
    np.testing.assert_allclose(losses, ref_losses, atol=1e-4, err_msg=str(dims))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-4, err_msg=str(dims)), params, ref_params)


def test_fine_tuning_evaluation_sharded_over_8_devices_predicts_what_1_device_does(tmp_path):
  checkpoint = fd.tiny_checkpoint(tmp_path / "ckpt")
  overrides = fd.local_overrides(tmp_path / "data", n_train=64, n_eval=40)
  config = fd.finetune_config("local", init_from=str(checkpoint), total_steps=1, **overrides)
  plan = train.plan(config)
  (eval_set,) = plan.task.eval_sets(plan.shards)
  out = {}
  for n in (8, 1):
    mesh = sharding.make_mesh(devices=jax.devices()[:n])
    steps = train.build_steps(plan.config, plan.task, plan.bert_config, mesh, plan.rules)
    with jax.set_mesh(mesh):
      _, params = weights.load_pretrained(checkpoint, plan.task.head.cls, num_labels=2)
      params = jax.device_put(params, steps.shardings.params)
      out[n] = evaluation.predict(steps.predict, params, eval_set.features, plan.task.predict_keys,
                                  global_batch_size=24, sharding=steps.data_sharding)
  assert out[8]["logits"].shape == (40, 2)  # 40 rows in batches of 24: the padded rows are dropped
  np.testing.assert_allclose(out[8]["logits"], out[1]["logits"], atol=1e-6)
