"""Orbax checkpoints: exact round trip, restore onto another mesh, data state per shard, clear refusals."""
import os
import re
import shutil

import aiohttp
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

import flax.linen as nn

from jbert.checkpoint import manager as ckpt_lib
from jbert.checkpoint import reading
from jbert.runtime import sharding
from jbert.train import step as step_lib
from jbert.model import BertForPreTraining

pytestmark = pytest.mark.devices(8)  # meshes of up to 8 devices


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


def test_a_save_that_cannot_start_names_its_step_and_what_happens_next(tmp_path, tiny_bert_config, monkeypatch):
  state, _ = _sharded_state(tiny_bert_config, (8, 1, 1))
  ckpt = ckpt_lib.Checkpointer(tmp_path / "ckpt")
  _save(ckpt, 2, state)
  real_save = ckpt._manager.save  # pylint: disable=protected-access

  def disk_full(*args, **kwargs):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(ckpt._manager, "save", disk_full)  # pylint: disable=protected-access
  with pytest.raises(ckpt_lib.CheckpointError, match=r"step 4 .*No space left.*Training goes on with the state in "
                                                     r"memory and the next save tries again"):
    _save(ckpt, 4, state)
  with pytest.raises(ckpt_lib.CheckpointError, match=r"step 6 .*No space left.*The run stops without it: .*rerun "
                                                     r"the same command to resume from step 2\."):
    ckpt.save(6, state.as_dict(), data_states=None, config={}, bert_config={}, final=True)
  assert np.isfinite(np.asarray(jax.tree.leaves(state.params)[0])).all()  # state untouched
  monkeypatch.setattr(ckpt._manager, "save", real_save)  # pylint: disable=protected-access
  _save(ckpt, 8, state)  # the next save still happens
  assert ckpt.all_steps() == [2, 8]
  ckpt.close()


# ----------------------------------------------------------------------------------------------------------
# A damaged step: named, set aside (not deleted), and the newest intact step restored.
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_steps(tmp_path_factory):
  """Steps 1 and 2 of two data shards (states {"position": 10 * shard + step}), written once and copied by
  each test; step 2 holds other parameters than step 1."""
  from jbert.model import BertConfig
  config = BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, max_position_embeddings=32)
  first, target = _sharded_state(config, (8, 1, 1), seed=1)
  second, _ = _sharded_state(config, (8, 1, 1), seed=2)
  directory = tmp_path_factory.mktemp("two_steps") / "ckpt"
  ckpt = ckpt_lib.Checkpointer(directory, num_data_shards=2)
  _save(ckpt, 1, first)
  _save(ckpt, 2, second)
  ckpt.close()
  return directory, target, first, second


def _copy(two_steps, tmp_path):
  directory = tmp_path / "ckpt"
  shutil.copytree(two_steps[0], directory)
  return directory


def _largest_array_file(step_dir):
  return max((step_dir / "state" / "ocdbt.process_0" / "d").iterdir(), key=lambda p: p.stat().st_size)


def _truncate(step_dir):
  path = _largest_array_file(step_dir)
  os.truncate(path, path.stat().st_size // 2)
  return rf"{path.relative_to(step_dir)} is truncated \(\d+ bytes left\): array \S+ cannot be read"


def _garble(step_dir):
  path = _largest_array_file(step_dir)
  with open(path, "r+b") as f:
    f.seek(0)
    f.write(bytes(range(256)))
  return r"array \S+ cannot be read from state/, a data file there is corrupt \(ZSTD"


def _valid_but_other_arrays(step_dir):
  """Files that decode fine to other numbers, as bytes garbled inside a compressed block can: only the
  fingerprints saved with the step tell."""
  other = step_dir.parent / "1" / "state"
  shutil.rmtree(step_dir / "state")
  shutil.copytree(other, step_dir / "state")
  return r"array \S+ and \d+ more arrays read back differently from what was saved \(their fingerprints differ\)"


DAMAGE = {
    "truncated array file": _truncate,
    "garbled array file": _garble,
    "arrays that decode to other numbers": _valid_but_other_arrays,
    "deleted manifest.ocdbt": lambda d: (d / "state" / "manifest.ocdbt").unlink() or
                                        r"state/manifest.ocdbt is missing",
    "deleted _METADATA": lambda d: (d / "state" / "_METADATA").unlink() or r"state/_METADATA is missing",
    "garbled data state": lambda d: (d / "data" / "shard_0.json").write_text('{"position": 1') and
                                    r"data/shard_0.json \(the data-iterator state\) is not valid JSON",
    "deleted data state": lambda d: (d / "data" / "shard_1.json").unlink() or
                                    r"data/shard_1.json \(the data-iterator state\) is missing",
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_latest_step_is_named_and_the_newest_intact_one_restored(two_steps, tmp_path, caplog, damage):
  directory = _copy(two_steps, tmp_path)
  _, target, first, second = two_steps
  message = DAMAGE[damage](directory / "2")
  files_before = sorted(p.relative_to(directory / "2") for p in (directory / "2").rglob("*"))
  ckpt = ckpt_lib.Checkpointer(directory, num_data_shards=2)
  with caplog.at_level("WARNING", logger="jbert"):
    step, state, data = ckpt.restore_latest_intact(target, shards=[0, 1])
  assert step == 1 and data == {0: {"position": 1}, 1: {"position": 11}}
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), state, first.as_dict())
  assert re.search(rf"checkpoint step 2 in {re.escape(str(directory))} is damaged: {message}", caplog.text)
  assert "resuming from step 1, the newest intact checkpoint" in caplog.text
  # Moved aside, not deleted: every file the damage left is still there, and step 2 can be written again.
  assert not (directory / "2").exists() and ckpt.all_steps() == [1]
  assert sorted(p.relative_to(directory / "2.damaged") for p in (directory / "2.damaged").rglob("*")) == files_before
  _save(ckpt, 2, second)
  assert ckpt.all_steps() == [1, 2]
  ckpt.close()


def test_a_failed_final_save_names_the_step_the_restore_will_take(two_steps, tmp_path, monkeypatch):
  """Orbax's list of steps still holds step 2 when its manifest goes missing: the message of a failed final save
  checks the storage as a resume does and names step 1, which the resume then restores."""
  directory = _copy(two_steps, tmp_path)
  _, target, first, _ = two_steps
  ckpt = ckpt_lib.Checkpointer(directory, num_data_shards=2)
  (directory / "2" / "state" / "manifest.ocdbt").unlink()
  assert ckpt.all_steps() == [1, 2] and ckpt.resumable_step() == 1

  def disk_full(*args, **kwargs):
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(ckpt._manager, "save", disk_full)  # pylint: disable=protected-access
  with pytest.raises(ckpt_lib.CheckpointError, match=r"^the checkpoint of step 3 could not be written to .*No space "
                     r"left on device.*The run stops without it: fix the storage \(free space, permissions\), then "
                     r"rerun the same command to resume from step 1\.$"):
    ckpt.save(3, first.as_dict(), data_states=None, config={}, bert_config={}, final=True)
  ckpt.close()
  step, _, _ = ckpt_lib.Checkpointer(directory, num_data_shards=2).restore_latest_intact(target, shards=[0, 1])
  assert step == 1


def test_an_outage_while_a_commit_is_checked_stops_naming_both_steps_it_may_resume_from(two_steps, tmp_path,
                                                                                       monkeypatch):
  """Orbax committed step 3, then the storage stopped answering the check of that commit: whether the commit
  reached the storage cannot be known without it, so the message names both steps; nothing more is waited for."""
  directory = _copy(two_steps, tmp_path)
  _, target, first, _ = two_steps
  ckpt = ckpt_lib.Checkpointer(directory, num_data_shards=2)
  assert ckpt.restore_latest_intact(target, shards=[0, 1])[0] == 2  # the run resumed from step 2
  ckpt.save(3, first.as_dict(), data_states=None, config={}, bert_config={})

  def dropped(path):
    raise aiohttp.ServerDisconnectedError()

  monkeypatch.setattr(ocp.step, "is_path_finalized", dropped)
  monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)  # the message names Google Cloud Storage
  with pytest.raises(ckpt_lib.StorageFailure, match=r"^the checkpoint of step 3 could not be written to .*: Google "
                     r"Cloud Storage cannot be reached \(Server disconnected\)\. The run stops: rerun the same command "
                     r"once the storage answers, and it resumes from step 3 if its commit reached the storage before "
                     r"the failure, else step 2\.$"):
    ckpt.save(4, first.as_dict(), data_states=None, config={}, bert_config={})  # the next save raises it
  assert ckpt.storage_down
  ckpt.close()  # returns at once: nothing is removed or waited for
  monkeypatch.undo()
  assert ckpt_lib.Checkpointer(directory, num_data_shards=2).resumable_step() == 3  # here it did


def test_only_a_damaged_data_state_may_resume_with_a_restarted_stream(two_steps, tmp_path, caplog):
  directory = _copy(two_steps, tmp_path)
  (directory / "2" / "data" / "shard_0.json").write_text("garbage")
  ckpt = ckpt_lib.Checkpointer(directory, num_data_shards=2)
  with caplog.at_level("WARNING", logger="jbert"):
    step, state, data = ckpt.restore_latest_intact(two_steps[1], shards=[0, 1], data_restart_ok=True)
  assert step == 2 and data is None
  assert int(state["step"]) == 0 and (directory / "2").exists()
  assert "data/shard_0.json (the data-iterator state) is not valid JSON" in caplog.text
  assert "resumes with the data stream restarted" in caplog.text
  ckpt.close()


def test_no_intact_step_is_refused_listing_each_and_nothing_is_moved(two_steps, tmp_path):
  directory = _copy(two_steps, tmp_path)
  (directory / "2" / "data" / "shard_1.json").unlink()
  (directory / "1" / "state" / "_METADATA").unlink()
  ckpt = ckpt_lib.Checkpointer(directory, num_data_shards=2)
  with pytest.raises(ckpt_lib.CheckpointError, match=r"(?s)no checkpoint in .* can be restored; nothing was deleted:"
                                                     r"\n  step 2: data/shard_1.json .* is missing"
                                                     r"\n  step 1: state/_METADATA is missing.*"
                                                     r"--config.allow_data_restart=true"):
    ckpt.restore_latest_intact(two_steps[1], shards=[0, 1])
  assert sorted(p.name for p in directory.iterdir()) == ["1", "2"]
  ckpt.close()


def test_another_number_of_data_shards_restarts_the_stream_and_is_not_damage(two_steps, tmp_path, caplog):
  directory = _copy(two_steps, tmp_path)
  ckpt = ckpt_lib.Checkpointer(directory, num_data_shards=4)
  with caplog.at_level("WARNING", logger="jbert"):
    step, _, data = ckpt.restore_latest_intact(two_steps[1], shards=[2, 3])
  assert step == 2 and data is None
  assert "written with data.num_shards=2 and this run has 4: the data stream restarts" in caplog.text
  ckpt.close()


def test_restore_params_reads_only_the_parameters(tmp_path, tiny_bert_config, caplog):
  state, _ = _sharded_state(tiny_bert_config, (2, 2, 2), seed=3)
  ckpt = ckpt_lib.Checkpointer(tmp_path / "work" / "checkpoints")
  _save(ckpt, 5, state)
  ckpt.close()
  with caplog.at_level("WARNING"):
    bert_config, params = reading.restore_params(tmp_path / "work")
    assert reading.read_model_config(tmp_path / "work") == {"hidden_size": 64}
  assert not caplog.records  # no `Given directory is read only` from Orbax for each reader (jbert.predict: two)
  assert bert_config == {"hidden_size": 64}
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, np.asarray(b)), params, state.params)
  assert isinstance(jax.tree.leaves(params)[0], np.ndarray)


def test_restore_params_takes_the_newest_step_with_intact_parameters(two_steps, tmp_path, caplog):
  directory = _copy(two_steps, tmp_path)
  (directory / "2" / "state" / "manifest.ocdbt").unlink()
  with caplog.at_level("WARNING", logger="jbert"):
    _, params = reading.restore_params(directory)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(a, np.asarray(b)), params, two_steps[2].params)
  assert "checkpoint step 2 in" in caplog.text and "state/manifest.ocdbt is missing" in caplog.text
  assert sorted(p.name for p in directory.iterdir()) == ["1", "2"]  # reading another run's workdir moves nothing
