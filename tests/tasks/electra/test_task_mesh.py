"""ELECTRA's train state under the sharding rules: configs/electra.py:tiny's generator and discriminator, their
shared embeddings and the generator's embeddings_project all carry logical axis names, lay out on fsdp and tensor
as BERT's weights do, and the same steps on 8 devices (data, fsdp and tensor) give the 1-device losses."""
import flax.linen as nn
import jax
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

from configs import electra
from conftest import make_pretrain_batch
from jbert.model import BertForMaskedLM
from jbert.runtime import sharding
from jbert.tasks.electra.task import ReplacedTokenDetection
from jbert.train import architecture
from jbert.train import step as step_lib

pytestmark = pytest.mark.devices(8)

VOCAB = 128  # divisible by tensor=2, as a padded vocabulary is
RULE_NAMES = {name for name, _ in sharding.DEFAULT_RULES}


def _setup():
  config = electra.get_config("tiny")
  bert_config = architecture.bert_config(config.model, vocab_size=VOCAB)
  task = ReplacedTokenDetection(generator_hidden_size=config.task.generator_hidden_size, max_predictions=4)
  return bert_config, task


def _state_shardings(model, mesh, tx=None):
  init = lambda r: step_lib.init_state(model, tx or optax.adamw(1e-3), r, (1, 8))
  return sharding.abstract_and_shardings(init, mesh, sharding.DEFAULT_RULES, jax.random.key(0))


def _specs(tree):
  return {jax.tree_util.keystr(path): s.spec for path, s in jax.tree_util.tree_flatten_with_path(tree)[0]}


@pytest.mark.parametrize("dims", [(2, 2, 2), (1, 4, 2)])
def test_every_parameter_is_named_and_shards_as_bert_does(dims):
  bert_config, task = _setup()
  model = task.model(bert_config)
  mesh = sharding.make_mesh(*dims)
  boxed = jax.eval_shape(lambda r: model.init(r, np.zeros((1, 8), np.int32))["params"], jax.random.key(0))
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  for path, leaf in jax.tree_util.tree_flatten_with_path(boxed, is_leaf=is_box)[0]:
    assert is_box(leaf), f"{jax.tree_util.keystr(path)} has no logical axis names"
    assert len(leaf.names) == leaf.value.ndim and set(leaf.names) - {None} <= RULE_NAMES, (path, leaf.names)

  abstract, shardings = _state_shardings(model, mesh)
  params = shardings.params
  # The discriminator is laid out as BERT's encoder and embeddings; the generator (embeddings excepted, which it
  # reads from the discriminator) and its MLM head as a BERT MLM model of the generator's size.
  bert = _state_shardings(BertForMaskedLM(bert_config), mesh)[1].params
  assert _specs(params["discriminator"]["bert"]) == _specs(bert["bert"])
  gen = _state_shardings(BertForMaskedLM(task.generator(bert_config)), mesh)[1].params
  del gen["bert"]["embeddings"]
  assert _specs(params["generator"]) == _specs(gen)
  disc_bert = params["discriminator"]["bert"]
  assert disc_bert["embeddings"]["word_embeddings"]["embedding"].spec == P("tensor", "fsdp")
  assert disc_bert["encoder"]["layer_0"]["mlp"]["wi"]["kernel"].spec == P("fsdp", "tensor")
  assert params["discriminator"]["discriminator"]["dense"]["kernel"].spec == P("fsdp", "tensor")
  assert params["generator"]["bert"]["embeddings_project"]["kernel"].spec == P(None, "fsdp")
  assert params["generator"]["mlm"]["transform"]["kernel"].spec == P("fsdp", "tensor")
  assert shardings.opt_state[0].mu["generator"]["bert"]["embeddings_project"]["kernel"].spec == P(None, "fsdp")
  # No weight matrix is left whole on every device (the generator's one attention head cannot split over
  # tensor, so its attention kernels shard over fsdp alone).
  specs = _specs(params)
  for path, leaf in jax.tree_util.tree_flatten_with_path(abstract.params)[0]:
    name = jax.tree_util.keystr(path)
    if leaf.ndim >= 2 and ("kernel" in name or "embedding" in name):
      assert any(axis is not None for axis in specs[name]), f"{name} is replicated: {specs[name]}"
  report = sharding.sharding_report(abstract, shardings)
  assert report.per_device_bytes < report.total_bytes / 3, report


def _train(dims, steps=3):
  bert_config, task = _setup()
  model = task.model(bert_config)
  mesh = sharding.make_mesh(*dims, devices=jax.devices()[:int(np.prod(dims))])
  tx = optax.adamw(1e-3, weight_decay=0.01)
  with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
    init = lambda r: step_lib.init_state(model, tx, r, (1, 8))
    _, shardings = _state_shardings(model, mesh, tx)
    state = jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=shardings)(jax.random.key(0))
    data = sharding.batch_sharding(mesh)
    step = jax.jit(lambda s, b: step_lib.train_step(s, b, model=model, task=task, tx=tx, schedule=lambda _: 1e-3),
                   in_shardings=(shardings, data), out_shardings=(shardings, sharding.replicated(mesh)),
                   donate_argnums=0)
    metrics = []
    for i in range(steps):
      batch = jax.device_put(make_pretrain_batch(10 + i, vocab=VOCAB), data)
      state, m = step(state, batch)
      metrics.append({k: float(v) for k, v in m.items()})
    assert len(state.params["discriminator"]["bert"]["encoder"]["layer_0"]["mlp"]["wi"]["kernel"]
               .sharding.device_set) == mesh.size
  return metrics


def test_train_steps_on_8_devices_give_the_1_device_losses_and_metrics():
  keys = ("loss", "generator_mlm_loss", "discriminator_loss", "generator_mlm_accuracy", "discriminator_accuracy",
          "replaced_precision", "replaced_recall")
  ref = _train((1, 1, 1))
  assert all(k in ref[0] for k in keys), sorted(ref[0])
  assert ref[-1]["loss"] < ref[0]["loss"]
  for dims in ((2, 2, 2), (1, 4, 2)):
    got = _train(dims)
    np.testing.assert_allclose([[m[k] for k in keys] for m in got], [[m[k] for k in keys] for m in ref],
                               atol=1e-4, err_msg=str(dims))
