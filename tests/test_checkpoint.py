"""Orbax checkpoints: exact round trip, restore onto another mesh, data state per shard, clear refusals."""
import jax
import numpy as np
import optax
import pytest

import flax.linen as nn

from jbert import checkpoint as ckpt_lib
from jbert import sharding
from jbert import train_step as step_lib
from jbert.model import BertForPreTraining


def _sharded_state(config, mesh_dims, seed=0):
  mesh = sharding.make_mesh(*mesh_dims)
  model = BertForPreTraining(config)
  tx = optax.adamw(1e-3)
  init = lambda r: step_lib.init_state(model, tx, r, (1, 8))
  abstract, shardings = sharding.abstract_and_shardings(init, mesh, sharding.DEFAULT_RULES, jax.random.key(0))
  state = jax.jit(lambda r: nn.meta.unbox(init(r)), out_shardings=shardings)(jax.random.key(seed))
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract.as_dict(), shardings.as_dict())
  return state, target


def _save(ckpt, step, state, shards=(0, 1)):
  ckpt.save(step, state.as_dict(), data_states={s: {"position": 10 * s + step} for s in shards},
            config={"seed": 0, "rules": (("embed", "fsdp"),)}, bert_config={"hidden_size": 64})
  ckpt.wait()


def test_round_trip_onto_another_mesh_is_exact(tmp_path, tiny_bert_config):
  state, _ = _sharded_state(tiny_bert_config, (2, 2, 2), seed=1)
  ckpt = ckpt_lib.Checkpointer(tmp_path / "ckpt", max_to_keep=2)
  _save(ckpt, 7, state)
  assert ckpt.latest_step() == 7
  _, target = _sharded_state(tiny_bert_config, (1, 4, 2))
  restored, data = ckpt.restore(7, target, shards=[1])
  assert data == {1: {"position": 17}}
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
               restored, state.as_dict())
  kernel = restored["params"]["bert"]["encoder"]["layer_0"]["mlp"]["wi"]["kernel"]
  assert kernel.sharding.spec == jax.sharding.PartitionSpec("fsdp", "tensor")
  assert ckpt.read_json(7, "config")["rules"] == [["embed", "fsdp"]]
  ckpt.close()


def test_max_to_keep_and_missing_data_shards(tmp_path, tiny_bert_config):
  state, target = _sharded_state(tiny_bert_config, (8, 1, 1))
  ckpt = ckpt_lib.Checkpointer(tmp_path / "ckpt", max_to_keep=2)
  for step in (1, 2, 3):
    _save(ckpt, step, state, shards=(0,))
  assert ckpt.all_steps() == [2, 3]
  _, data = ckpt.restore(3, target, shards=[5])  # written with another number of data shards
  assert data is None
  ckpt.close()


def test_checkpoint_of_another_model_is_refused_by_name(tmp_path, tiny_bert_config):
  import dataclasses
  state, _ = _sharded_state(tiny_bert_config, (8, 1, 1))
  ckpt = ckpt_lib.Checkpointer(tmp_path / "ckpt")
  _save(ckpt, 1, state)
  wider = dataclasses.replace(tiny_bert_config, intermediate_size=256)
  _, target = _sharded_state(wider, (8, 1, 1))
  mismatch = r"params/bert/encoder/layer_0/mlp/wi/kernel: checkpoint \(64, 128\) vs run \(64, 256\)"
  with pytest.raises(ckpt_lib.CheckpointError, match=mismatch):
    ckpt.restore(1, target, shards=None)
  ckpt.close()


def test_unwritable_directory_is_reported_before_training(tmp_path):
  blocker = tmp_path / "file"
  blocker.write_text("not a directory")
  with pytest.raises(ckpt_lib.CheckpointError, match="cannot write checkpoints to .*file/ckpt.*writable"):
    ckpt_lib.Checkpointer(blocker / "ckpt")


def test_failed_save_keeps_the_state_and_says_so(tmp_path, tiny_bert_config, monkeypatch):
  state, _ = _sharded_state(tiny_bert_config, (8, 1, 1))
  ckpt = ckpt_lib.Checkpointer(tmp_path / "ckpt")

  def disk_full(*args, **kwargs):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(ckpt._manager, "save", disk_full)  # pylint: disable=protected-access
  with pytest.raises(ckpt_lib.CheckpointError, match="step 4 .*No space left.*still in memory"):
    _save(ckpt, 4, state)
  assert np.isfinite(np.asarray(jax.tree.leaves(state.params)[0])).all()  # state untouched
  ckpt.close()


def test_restore_params_reads_only_the_parameters(tmp_path, tiny_bert_config):
  state, _ = _sharded_state(tiny_bert_config, (2, 2, 2), seed=3)
  ckpt = ckpt_lib.Checkpointer(tmp_path / "work" / "checkpoints")
  _save(ckpt, 5, state)
  ckpt.close()
  bert_config, params = ckpt_lib.restore_params(tmp_path / "work")
  assert bert_config == {"hidden_size": 64}
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, np.asarray(b)), params, state.params)
  assert isinstance(jax.tree.leaves(params)[0], np.ndarray)
