"""load_pretrained / save_pretrained against transformers: formats, name variants, heads, errors."""
import json
import logging
import os
import re
import stat

import jax
import numpy as np
import pytest
import torch
import transformers

import jbert
from jbert.model import init_params
from jbert.weights import hf_io

from .conftest import torch_model, torch_outputs


def _apply(config, params, cls, batch, **kwargs):
  return cls(config, **kwargs).apply({"params": params}, batch["input_ids"], token_type_ids=batch["token_type_ids"],
                                     attention_mask=batch["attention_mask"])


def _assert_tree_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)


def test_hf_safetensors_loads_with_transformers_outputs(tmp_path, batch):
  ref = torch_model()
  ref.save_pretrained(tmp_path / "hf")
  config, params = jbert.load_pretrained(str(tmp_path / "hf"))
  out = _apply(config, params, jbert.BertForPreTraining, batch)
  expected = torch_outputs(ref, batch)
  np.testing.assert_allclose(out.mlm_logits, expected.prediction_logits.numpy(), atol=1e-5)
  np.testing.assert_allclose(out.nsp_logits, expected.seq_relationship_logits.numpy(), atol=1e-5)


@pytest.mark.parametrize("cls_name", ["BertForPreTraining", "BertModel", "BertForMaskedLM",
                                      "BertForSequenceClassification", "BertForTokenClassification",
                                      "BertForQuestionAnswering", "BertForMultipleChoice"])
def test_save_pretrained_loads_in_transformers_without_missing_keys(tmp_path, batch, cls_name):
  ref = torch_model(cls_name, num_labels=3 if "Classification" in cls_name else 2)
  ref.save_pretrained(tmp_path / "hf")
  cls = getattr(jbert, cls_name)
  config, params = jbert.load_pretrained(str(tmp_path / "hf"), cls)
  jbert.save_pretrained(config, params, str(tmp_path / "out"), cls)
  again, info = getattr(transformers, cls_name).from_pretrained(tmp_path / "out", output_loading_info=True,
                                                                attn_implementation="eager")
  assert info["missing_keys"] == set() or not info["missing_keys"]
  assert not info["unexpected_keys"] and not info["mismatched_keys"]
  if cls_name == "BertForMultipleChoice":
    batch = {k: np.stack([v, v[::-1]], 1) for k, v in batch.items()}
  mine, theirs = torch_outputs(again.eval(), batch), torch_outputs(ref, batch)
  for key in theirs.keys():
    np.testing.assert_allclose(mine[key].numpy(), theirs[key].numpy(), atol=1e-6, err_msg=key)
  # load -> save -> load is exact, for the HF and the jbert formats.
  _, reloaded = jbert.load_pretrained(str(tmp_path / "out"), cls)
  _assert_tree_equal(reloaded, params)
  jbert.save_pretrained(config, params, str(tmp_path / "jb"), cls, format="jbert")
  config2, from_jbert = jbert.load_pretrained(str(tmp_path / "jb"), cls)
  _assert_tree_equal(from_jbert, params)
  assert config2.to_dict() == config.to_dict()


def test_pytorch_bin_no_prefix_and_gamma_beta_names(tmp_path, batch):
  ref = torch_model("BertModel")
  state = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in ref.state_dict().items()}  # BertModel names carry no `bert.` prefix
  (tmp_path / "bin").mkdir()
  torch.save(state, tmp_path / "bin" / hf_io.TORCH_BIN)
  ref.config.to_json_file(tmp_path / "bin" / "config.json")
  config, params = jbert.load_pretrained(str(tmp_path / "bin"), jbert.BertModel)
  out = _apply(config, params, jbert.BertModel, batch)
  expected = torch_outputs(ref, batch)
  np.testing.assert_allclose(out.last_hidden_state, expected.last_hidden_state.numpy(), atol=1e-5)
  np.testing.assert_allclose(out.pooled_output, expected.pooler_output.numpy(), atol=1e-5)


def test_scan_override_stacks_layers(tmp_path, batch):
  torch_model().save_pretrained(tmp_path / "hf")
  config, params = jbert.load_pretrained(str(tmp_path / "hf"), scan_layers=True)
  assert config.scan_layers
  assert params["bert"]["encoder"]["layers"]["mlp"]["wi"]["kernel"].shape == (2, 64, 96)
  _, plain = jbert.load_pretrained(str(tmp_path / "hf"))
  np.testing.assert_allclose(_apply(config, params, jbert.BertForPreTraining, batch).mlm_logits,
                             _apply(config.__class__(**{**config.__dict__, "scan_layers": False}), plain,
                                    jbert.BertForPreTraining, batch).mlm_logits, atol=1e-5)


def test_task_head_is_initialised_and_unused_weights_reported(tmp_path, caplog):
  torch_model().save_pretrained(tmp_path / "hf")
  with caplog.at_level(logging.WARNING, logger="jbert"):
    config, params = jbert.load_pretrained(str(tmp_path / "hf"), jbert.BertForSequenceClassification,
                                           num_labels=3)
  assert params["classifier"]["kernel"].shape == (64, 3)
  assert "not in the checkpoint were initialised (rng_seed=0): classifier/kernel, classifier/bias" in caplog.text
  assert "cls.seq_relationship.weight" in caplog.text and "dropped" in caplog.text
  logits = _apply(config, params, jbert.BertForSequenceClassification,
                  {"input_ids": np.ones((1, 4), np.int32), "token_type_ids": None, "attention_mask": None},
                  num_labels=3).logits
  assert logits.shape == (1, 3)


def test_head_of_another_size_is_reinitialised(tmp_path, caplog):
  torch_model("BertForSequenceClassification", num_labels=2).save_pretrained(tmp_path / "hf")
  with caplog.at_level(logging.WARNING, logger="jbert"):
    _, params = jbert.load_pretrained(str(tmp_path / "hf"), jbert.BertForSequenceClassification, num_labels=5)
  assert params["classifier"]["kernel"].shape == (64, 5)
  assert "classifier.weight has 2 outputs" in caplog.text


def test_missing_encoder_weight_is_an_error_naming_it(tmp_path):
  ref = torch_model()
  state = {k: v for k, v in ref.state_dict().items() if "layer.1.output.dense.weight" not in k}
  (tmp_path / "hf").mkdir()
  torch.save(state, tmp_path / "hf" / hf_io.TORCH_BIN)
  ref.config.to_json_file(tmp_path / "hf" / "config.json")
  with pytest.raises(ValueError, match=r"lacks weights .*bert/encoder/layer_1/mlp/wo/kernel"):
    jbert.load_pretrained(str(tmp_path / "hf"))


def test_shape_mismatch_names_weight_and_field(tmp_path):
  ref = torch_model()
  ref.save_pretrained(tmp_path / "hf")
  cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
  cfg["intermediate_size"] = 128
  (tmp_path / "hf" / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"intermediate.dense.weight.*96.*128|intermediate_size"):
    jbert.load_pretrained(str(tmp_path / "hf"))


def test_unknown_path_lists_what_was_looked_for(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"Looked for: a Hugging Face dir .*model.safetensors.*TF1"):
    jbert.load_pretrained(str(tmp_path))


def test_training_workdir_loads_its_latest_parameters(tmp_path, tiny_bert_config):
  import optax
  import flax.linen as nn
  from jbert.checkpoint import manager as checkpoint
  from jbert.train import step as train_step
  model = jbert.BertForPreTraining(tiny_bert_config)
  state = nn.meta.unbox(train_step.init_state(model, optax.sgd(0.1), jax.random.key(1), (1, 8)))
  ckpt = checkpoint.Checkpointer(tmp_path / "work" / "checkpoints")
  ckpt.save(3, state.as_dict(), data_states=None, config={}, bert_config=tiny_bert_config.to_dict(full=True))
  ckpt.close()
  config, params = jbert.load_pretrained(str(tmp_path / "work"))
  assert config.hidden_size == 64
  _assert_tree_equal(params, jax.tree.map(np.asarray, state.params))


def test_sharded_pytorch_bin_is_read_through_its_index(tmp_path, batch):
  ref = torch_model()
  state = ref.state_dict()
  names = sorted(state)
  halves = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
  (tmp_path / "bin").mkdir()
  for file, keys in halves.items():
    torch.save({k: state[k] for k in keys}, tmp_path / "bin" / file)
  index = {"metadata": {}, "weight_map": {k: f for f, keys in halves.items() for k in keys}}
  (tmp_path / "bin" / hf_io.TORCH_BIN_INDEX).write_text(json.dumps(index))
  ref.config.to_json_file(tmp_path / "bin" / "config.json")
  config, params = jbert.load_pretrained(tmp_path / "bin")
  np.testing.assert_allclose(_apply(config, params, jbert.BertForPreTraining, batch).mlm_logits,
                             torch_outputs(ref, batch).prediction_logits.numpy(), atol=1e-5)


def test_overrides_that_change_shapes_are_refused(tmp_path):
  torch_model().save_pretrained(tmp_path / "hf")
  with pytest.raises(TypeError, match="hidden_size.*only .*dtype"):
    jbert.load_pretrained(tmp_path / "hf", hidden_size=128)
  config, params = jbert.load_pretrained(tmp_path / "hf", param_dtype="bfloat16", hidden_act="gelu_new")
  assert config.hidden_act == "gelu_new"
  assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype(jax.numpy.bfloat16)}


# ----------------------------------------------------------------------------------------------------------
# Damaged files: one message naming the file and what is wrong with it.
# ----------------------------------------------------------------------------------------------------------


class _RunsCode:
  def __reduce__(self):
    return (os.system, ("echo this pickle ran code",))


def _truncate(path, keep=0.5):
  data = path.read_bytes()
  path.write_bytes(data[: int(len(data) * keep)])


HF_DAMAGE = {
    "truncated model.safetensors": (
        True, lambda d: _truncate(d / "model.safetensors"),
        r"model.safetensors is not a readable safetensors file \(.+\): it is truncated or corrupt"),
    "config.json cut short": (
        True, lambda d: _truncate(d / "config.json"),
        r"config.json is not valid JSON \(.+ at line \d+ column \d+\): the file is truncated or corrupt"),
    "empty config.json": (True, lambda d: (d / "config.json").write_text(""), r"config.json is empty"),
    "config.json holding a list": (
        True, lambda d: (d / "config.json").write_text("[1, 2]"),
        r"config.json holds a JSON list, not an object of config fields"),
    "truncated pytorch_model.bin": (
        False, lambda d: _truncate(d / "pytorch_model.bin"),
        r"pytorch_model.bin is not a readable PyTorch checkpoint \(.+\): it is truncated or corrupt"),
    "pytorch_model.bin that runs code": (
        False, lambda d: torch.save({"bert.pooler.dense.bias": _RunsCode()}, d / "pytorch_model.bin"),
        r"pytorch_model.bin holds Python objects besides tensors, and unpickling them could run arbitrary code"),
}


@pytest.mark.parametrize("damage", HF_DAMAGE)
def test_a_damaged_hf_file_is_named_with_what_is_wrong(tmp_path, damage, capfd):
  safetensors, spoil, message = HF_DAMAGE[damage]
  ref = torch_model()
  if safetensors:
    ref.save_pretrained(tmp_path / "hf")
  else:
    (tmp_path / "hf").mkdir()
    torch.save(ref.state_dict(), tmp_path / "hf" / hf_io.TORCH_BIN)
    ref.config.to_json_file(tmp_path / "hf" / "config.json")
  spoil(tmp_path / "hf")
  with pytest.raises(ValueError, match=re.escape(str(tmp_path / "hf")) + "/" + message) as error:
    jbert.load_pretrained(tmp_path / "hf")
  assert error.value.__cause__ is None  # one message, not a library traceback under it
  assert "ran code" not in capfd.readouterr().out


def test_a_shard_missing_from_an_index_is_named(tmp_path):
  ref = torch_model()
  (tmp_path / "hf").mkdir()
  index = {"weight_map": {k: "model-00002-of-00002.safetensors" for k in ref.state_dict()}}
  (tmp_path / "hf" / hf_io.SAFETENSORS_INDEX).write_text(json.dumps(index))
  ref.config.to_json_file(tmp_path / "hf" / "config.json")
  with pytest.raises(FileNotFoundError, match=r"model.safetensors.index.json names shard files that are missing: "
                                              r"model-00002-of-00002.safetensors"):
    jbert.load_pretrained(tmp_path / "hf")


def test_a_damaged_jbert_model_dir_is_named(tmp_path, tiny_bert_config):
  model = jbert.BertForMaskedLM(tiny_bert_config)
  params = jax.tree.map(np.asarray, init_params(model, jax.random.key(0)))
  jbert.save_pretrained(tiny_bert_config, params, tmp_path / "jb", jbert.BertForMaskedLM, format="jbert")
  data = tmp_path / "jb" / "params" / "ocdbt.process_0" / "d"
  biggest = max(data.iterdir(), key=lambda p: p.stat().st_size)
  biggest.write_bytes(biggest.read_bytes()[:100])
  with pytest.raises(ValueError, match=rf"{tmp_path}/jb/params cannot be read: params/ocdbt.process_0/d/"
                                       rf"{biggest.name} is truncated \(100 bytes left\): array \S+ cannot be read"):
    jbert.load_pretrained(tmp_path / "jb", jbert.BertForMaskedLM)
  (tmp_path / "jb" / "config.json").write_text('{"vocab_size": 128,')
  with pytest.raises(ValueError, match=rf"{tmp_path}/jb/config.json is not valid JSON"):
    jbert.load_pretrained(tmp_path / "jb", jbert.BertForMaskedLM)


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_saved_weights_follow_the_umask_like_every_other_file(tmp_path, umask):
  previous = os.umask(umask)
  try:
    torch_model().save_pretrained(tmp_path / "hf")
    config, params = jbert.load_pretrained(tmp_path / "hf")
    jbert.save_pretrained(config, params, tmp_path / "out")
  finally:
    os.umask(previous)
  modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "out").iterdir()}
  assert modes == {"config.json": 0o666 & ~umask, "model.safetensors": 0o666 & ~umask}


# ----------------------------------------------------------------------------------------------------------
# Non-finite weights: a file that parses but would give confident nonsense is refused, naming the tensor.
# ----------------------------------------------------------------------------------------------------------


def test_a_nan_weight_is_refused_naming_file_and_tensor(tmp_path):
  from safetensors.numpy import load_file, save_file
  torch_model().save_pretrained(tmp_path / "hf")
  file = tmp_path / "hf" / "model.safetensors"
  state = load_file(file)
  name = "bert.encoder.layer.1.attention.self.query.weight"
  state[name][3, 5] = np.nan
  state[name][7, 0] = np.inf
  save_file(state, file, metadata={"format": "pt"})
  with pytest.raises(ValueError) as error:
    jbert.load_pretrained(tmp_path / "hf")
  assert str(error.value) == (
      f"{file}: weight {name} holds 2 non-finite values (first nan at [3, 5]); the file is damaged or the run "
      "that wrote it diverged. Download, convert or export the model again.")


def test_a_non_finite_weight_in_a_shard_names_the_shard(tmp_path):
  ref = torch_model()
  state = ref.state_dict()
  names = sorted(state)
  halves = {"pytorch_model-00001-of-00002.bin": names[::2], "pytorch_model-00002-of-00002.bin": names[1::2]}
  bad = halves["pytorch_model-00002-of-00002.bin"][0]
  state[bad] = state[bad].clone().fill_(float("-inf"))
  (tmp_path / "bin").mkdir()
  for file, keys in halves.items():
    torch.save({k: state[k] for k in keys}, tmp_path / "bin" / file)
  index = {"metadata": {}, "weight_map": {k: f for f, keys in halves.items() for k in keys}}
  (tmp_path / "bin" / hf_io.TORCH_BIN_INDEX).write_text(json.dumps(index))
  ref.config.to_json_file(tmp_path / "bin" / "config.json")
  with pytest.raises(ValueError, match=re.escape(f"{tmp_path}/bin/pytorch_model-00002-of-00002.bin: weight {bad} "
                                                 f"holds {state[bad].numel()} non-finite values (first -inf at")):
    jbert.load_pretrained(tmp_path / "bin")
