"""Original google-research/bert TF1 checkpoints, written here with TensorFlow under the original names."""
import json

import numpy as np
import pytest

import jbert
from jbert.weights import tf1

from .conftest import torch_model, torch_outputs

import tensorflow as tf  # noqa: E402  (the `test` extra installs tensorflow-cpu)


def hf_to_tf(state):
  """transformers state dict -> {original TF1 name: array}, as run_pretraining.py would have saved it."""
  out = {}
  for name, value in state.items():
    value = value.numpy()
    if name.endswith("position_ids") or name.startswith("cls.predictions.decoder"):
      continue
    if name == "cls.predictions.bias":
      out["cls/predictions/output_bias"] = value
      continue
    if name.startswith("cls.seq_relationship."):
      out["cls/seq_relationship/" + ("output_weights" if name.endswith("weight") else "output_bias")] = value
      continue
    parts = name.replace("encoder.layer.", "encoder.layer_").split(".")
    if parts[-2].endswith("embeddings"):
      out["/".join(parts[:-1])] = value
      continue
    if "LayerNorm" in parts:
      parts[-1] = "gamma" if parts[-1] == "weight" else "beta"
    elif parts[-1] == "weight":
      parts[-1], value = "kernel", value.T
    out["/".join(parts)] = value
  return out


def write_tf1_checkpoint(directory, tf_vars, config):
  directory.mkdir()
  (directory / "bert_config.json").write_text(json.dumps(config))
  graph = tf.Graph()
  with graph.as_default():
    for name, value in tf_vars.items():
      tf.compat.v1.Variable(value, name=name)
    saver = tf.compat.v1.train.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      saver.save(sess, str(directory / "bert_model.ckpt"), write_meta_graph=False)


def test_original_checkpoint_matches_transformers(tmp_path, batch):
  ref = torch_model()
  tf_vars = hf_to_tf(ref.state_dict())
  assert "bert/encoder/layer_1/attention/self/query/kernel" in tf_vars
  junk = {n + "/adam_m": v for n, v in list(tf_vars.items())[:3]}
  junk.update({n + "/adam_v": v for n, v in list(tf_vars.items())[:3]})
  junk["global_step"] = np.int64(1000)
  config = {k: v for k, v in ref.config.to_dict().items() if k in jbert.BertConfig.__dataclass_fields__}
  write_tf1_checkpoint(tmp_path / "tf1", {**tf_vars, **junk}, config)
  names = {n for n, _ in tf.train.list_variables(str(tmp_path / "tf1" / "bert_model.ckpt"))}
  assert "bert/embeddings/LayerNorm/gamma" in names and "cls/seq_relationship/output_weights" in names

  for path in (tmp_path / "tf1", tmp_path / "tf1" / "bert_model.ckpt"):
    cfg, params = jbert.load_pretrained(str(path))
    out = jbert.BertForPreTraining(cfg).apply({"params": params}, batch["input_ids"],
                                              token_type_ids=batch["token_type_ids"],
                                              attention_mask=batch["attention_mask"])
    expected = torch_outputs(ref, batch)
    np.testing.assert_allclose(out.mlm_logits, expected.prediction_logits.numpy(), atol=1e-5)
    np.testing.assert_allclose(out.nsp_logits, expected.seq_relationship_logits.numpy(), atol=1e-5)


def test_fine_tuned_classifier_names():
  assert tf1.tf_name_to_hf("output_weights") == ("classifier.weight", False)
  assert tf1.tf_name_to_hf("bert/encoder/layer_11/output/dense/kernel") == (
      "bert.encoder.layer.11.output.dense.weight", True)
  assert tf1.tf_name_to_hf("bert/embeddings/word_embeddings") == ("bert.embeddings.word_embeddings.weight", False)
  assert tf1.tf_name_to_hf("bert/pooler/dense/kernel/adam_m") is None
  assert tf1.tf_name_to_hf("global_step") is None


def test_directory_with_several_checkpoints_uses_the_state_file(tmp_path):
  (tmp_path / "bert_config.json").write_text("{}")
  for step in (1000, 2000):
    (tmp_path / f"model.ckpt-{step}.index").write_text("")
  with pytest.raises(ValueError, match="2 TF checkpoints .*model.ckpt-1000.*pass the prefix"):
    tf1.find_checkpoint(str(tmp_path))
  (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-1000"\n')
  assert tf1.find_checkpoint(str(tmp_path)) == (str(tmp_path / "model.ckpt-1000"), str(tmp_path / tf1.CONFIG))
  # One of the checkpoint's own files names its prefix too.
  assert tf1.find_checkpoint(str(tmp_path / "model.ckpt-2000.index"))[0] == str(tmp_path / "model.ckpt-2000")


def test_damaged_tf1_checkpoints_name_the_file_and_what_is_wrong(tmp_path):
  ref = torch_model()
  config = {k: v for k, v in ref.config.to_dict().items() if k in jbert.BertConfig.__dataclass_fields__}
  write_tf1_checkpoint(tmp_path / "tf1", hf_to_tf(ref.state_dict()), config)
  prefix = tmp_path / "tf1" / "bert_model.ckpt"
  data = prefix.parent / "bert_model.ckpt.data-00000-of-00001"
  content = data.read_bytes()

  data.write_bytes(content[: len(content) // 2])
  with pytest.raises(ValueError, match=rf"variable \S+ of {prefix} cannot be read \(.+\): a data file "
                                       r"\(bert_model.ckpt.data-00000-of-00001\) is truncated or corrupt"):
    jbert.load_pretrained(tmp_path / "tf1")

  data.unlink()  # an index copied without its data
  with pytest.raises(FileNotFoundError, match=rf"{prefix}.index has no data file "
                                              r"bert_model.ckpt.data-00000-of-00001 beside it"):
    jbert.load_pretrained(tmp_path / "tf1")

  data.write_bytes(content)
  (prefix.parent / "bert_config.json").write_text('{"hidden_size": 64,')
  with pytest.raises(ValueError, match=rf"{prefix.parent}/bert_config.json is not valid JSON \(.+\): the file is "
                                       "truncated or corrupt"):
    jbert.load_pretrained(tmp_path / "tf1")


def test_a_config_larger_than_the_checkpoint_is_refused_by_its_bytes_before_tensorflow_reads_it(tmp_path):
  ref = torch_model()
  config = {k: v for k, v in ref.config.to_dict().items() if k in jbert.BertConfig.__dataclass_fields__}
  write_tf1_checkpoint(tmp_path / "tf1", hf_to_tf(ref.state_dict()), config | {"num_hidden_layers": 10 ** 6})
  data = tmp_path / "tf1" / "bert_model.ckpt.data-00000-of-00001"
  size = data.stat().st_size
  files = {p.name: p.read_bytes() for p in (tmp_path / "tf1").iterdir()}
  with pytest.raises(ValueError) as error:
    jbert.describe(tmp_path / "tf1")
  assert str(error.value) == (
      f"{tmp_path}/tf1/bert_config.json describes a BERT of 29,344,009,152 values (vocab_size=99, hidden_size=64, "
      "num_hidden_layers=1,000,000, intermediate_size=96, max_position_embeddings=40, type_vocab_size=2) but "
      f"{data} holds {size:,} bytes (at most {size // 2:,} values): the config does not belong to these weights, "
      "or they are incomplete; use the bert_config.json written with them.")
  # load_pretrained reads the (bounded) weights first, then refuses before building what the config names.
  with pytest.raises(ValueError, match=r"bert_config.json describes a BERT of 29,344,009,152 values .* holds "
                                       r"[\d,]+ values: the config does not belong to these weights"):
    jbert.load_pretrained(tmp_path / "tf1")
  assert {p.name: p.read_bytes() for p in (tmp_path / "tf1").iterdir()} == files
