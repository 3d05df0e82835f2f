"""jbert.weights.sizes: the sizes a config.json asks for are bounded by what the weight files hold, before anything
is built; safetensors headers are read and checked without the weights; labels come from the classifier's shape
where config.json records none."""
import json
import pathlib
import shutil
import struct
import time

import numpy as np
import pytest
import torch
import transformers

import jbert
from jbert import errors
from jbert.weights import hf_io, sizes

from weights.conftest import HF_CONFIG, torch_model

HUGE = 1_000_000


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  folder = tmp_path_factory.mktemp("hf")
  torch_model("BertForSequenceClassification").save_pretrained(folder)
  return folder


def _edited(tmp_path, source, name="model", **changes):
  folder = shutil.copytree(source, tmp_path / name)
  config = json.loads((folder / "config.json").read_text())
  config.update(changes)
  (folder / "config.json").write_text(json.dumps(config))
  return folder


def _hashes(folder):
  return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_backbone_values_are_transformers_parameter_count():
  config = jbert.BertConfig(**{k: v for k, v in HF_CONFIG.items() if k != "attn_implementation"})
  reference = transformers.BertModel(transformers.BertConfig(**HF_CONFIG), add_pooling_layer=False)
  assert sizes.backbone_values(config) == reference.num_parameters() == 67_840


def test_safetensors_header_shapes_without_reading_the_weights(hf_dir, tmp_path):
  file = hf_dir / "model.safetensors"
  from safetensors.numpy import load_file
  assert hf_io.safetensors_shapes(str(file)) == {k: v.shape for k, v in load_file(file).items()}
  stored = hf_io.stored(str(hf_dir))
  assert stored.capacity == sum(v.size for v in load_file(file).values())
  assert stored.rows("classifier.weight") == 2
  # A header that claims more than the file holds is refused before its tensors are believed.
  data = file.read_bytes()
  length = struct.unpack("<Q", data[:8])[0]
  header = json.loads(data[8:8 + length])
  name = "bert.embeddings.word_embeddings.weight"
  header[name]["shape"] = [HUGE, 64]
  forged = json.dumps(header).encode()
  bad = tmp_path / "model.safetensors"
  bad.write_bytes(struct.pack("<Q", len(forged)) + forged + data[8 + length:])
  with pytest.raises(ValueError, match=rf"^{bad} is not a readable safetensors file \(its header entry "
                     rf"'{name}' does not describe a tensor within the file\): it is truncated or corrupt"):
    hf_io.safetensors_shapes(str(bad))
  bad.write_bytes(struct.pack("<Q", 10 ** 12) + data[8:])
  with pytest.raises(ValueError, match=r"\(its header claims 1,000,000,000,000 bytes in a file of [0-9,]+\): it is "
                     "truncated or corrupt; download or convert it again.$"):
    hf_io.safetensors_shapes(str(bad))


def test_a_config_larger_than_its_weights_is_refused_before_anything_is_built(hf_dir, tmp_path):
  """num_hidden_layers: 1000000 used to take 54 s and 7.2 GB before its error, a 646 MB "line" listing the
  missing weights; now it is one line, from the config and the safetensors header alone."""
  folder = _edited(tmp_path, hf_dir, num_hidden_layers=HUGE)
  before = _hashes(folder)
  message = (f"{folder}/config.json describes a BERT of 29,344,009,152 values (vocab_size=99, hidden_size=64, "
             "num_hidden_layers=1,000,000, intermediate_size=96, max_position_embeddings=40, type_vocab_size=2) but "
             f"{folder}/model.safetensors holds 72,130 values: the config does not belong to these weights, or they "
             "are incomplete; use the config.json written with them.")
  start = time.perf_counter()
  for read in (jbert.describe, jbert.load_pretrained):
    with pytest.raises(ValueError) as error:
      read(folder)
    assert str(error.value) == message
  assert time.perf_counter() - start < 10  # seconds, not the minute it took (both reads, on a loaded CPU)
  assert _hashes(folder) == before
  # Each size alone is bounded: the vocabulary, the width of the feed-forward block, the positions.
  for field in ("vocab_size", "intermediate_size", "max_position_embeddings"):
    with pytest.raises(ValueError, match=rf"{field}={HUGE:,}.* but .*model.safetensors holds 72,130 values"):
      jbert.describe(_edited(tmp_path, hf_dir, field, **{field: HUGE}))


def test_a_pytorch_bin_is_bounded_by_its_bytes(tmp_path):
  folder = tmp_path / "bin"
  folder.mkdir()
  model = torch_model("BertModel")
  torch.save(model.state_dict(), folder / hf_io.TORCH_BIN)
  config = model.config.to_dict() | {"num_hidden_layers": HUGE}
  (folder / "config.json").write_text(json.dumps(config))
  size = (folder / hf_io.TORCH_BIN).stat().st_size
  with pytest.raises(ValueError, match=rf"but {folder}/pytorch_model.bin holds {size:,} bytes \(at most "
                     rf"{size // 2:,} values\): the config does not belong"):
    jbert.describe(folder)


def test_a_jbert_model_dir_is_bounded_by_its_params_metadata(tmp_path):
  """As a Hugging Face folder is (above); a TF1 checkpoint: tests/weights/test_tf1.py."""
  config = jbert.BertConfig(**{k: v for k, v in HF_CONFIG.items() if k != "attn_implementation"})
  torch_model("BertModel").save_pretrained(tmp_path / "hf")
  _, params = jbert.load_pretrained(tmp_path / "hf", jbert.BertModel)
  folder = pathlib.Path(jbert.save_pretrained(config, params, str(tmp_path / "jbert"), jbert.BertModel,
                                              format="jbert"))
  edited = json.loads((folder / "config.json").read_text()) | {"num_hidden_layers": HUGE}
  (folder / "config.json").write_text(json.dumps(edited))
  before = _hashes(folder)
  for read in (jbert.describe, jbert.load_pretrained):
    with pytest.raises(ValueError) as error:
      read(folder)
    assert str(error.value) == (
        f"{folder}/config.json describes a BERT of 29,344,009,152 values (vocab_size=99, hidden_size=64, "
        "num_hidden_layers=1,000,000, intermediate_size=96, max_position_embeddings=40, type_vocab_size=2) but "
        f"{folder}/params holds 72,000 values: the config does not belong to these weights, or they are "
        "incomplete; use the config.json written with them.")
  assert _hashes(folder) == before


def test_a_recorded_label_count_beyond_the_weights_is_refused(hf_dir, tmp_path):
  folder = _edited(tmp_path, hf_dir, num_labels=10 ** 9, id2label=None)
  with pytest.raises(ValueError, match=rf"^{folder}/config.json asks for num_labels=1000000000: a classifier of "
                     r"65,000,000,000 values, more than the whole checkpoint \("):
    jbert.describe(folder)
  folder = _edited(tmp_path, hf_dir, "words", id2label={"0": "a", "two": "b"})
  with pytest.raises(ValueError, match=r"config.json: id2label=\{'0': 'a', 'two': 'b'\} does not map the ids 0, 1"):
    jbert.describe(folder)


def test_labels_come_from_the_classifier_shape_when_config_json_records_none(tmp_path):
  """transformers 5 writes no num_labels/id2label for its default of two labels, and reads two; jbert said
  "records neither num_labels nor id2label" (jbert.predict, --rerank). The classifier's shape in the safetensors
  header says how many there are."""
  folder = tmp_path / "two"
  torch_model("BertForSequenceClassification").save_pretrained(folder)
  assert not {"id2label", "num_labels"} & set(json.loads((folder / "config.json").read_text()))
  assert transformers.AutoModelForSequenceClassification.from_pretrained(folder).num_labels == 2
  assert (jbert.describe(folder).num_labels, jbert.describe(folder).label_names) == (2, None)
  three = _edited(tmp_path, folder, "three")  # the weights decide, not a default of 2
  torch_model("BertForSequenceClassification", num_labels=3).save_pretrained(tmp_path / "source")
  shutil.copy(tmp_path / "source" / "model.safetensors", three)
  assert jbert.describe(three).num_labels == 3


def test_values_quoted_from_a_config_are_shortened():
  huge_name = "x" * 10 ** 6
  with pytest.raises(ValueError) as error:
    jbert.BertConfig(hidden_act=huge_name)
  assert len(str(error.value)) < 300 and str(error.value).startswith("BertConfig.hidden_act='xxx")
  with pytest.raises(ValueError, match=r"^BertConfig.vocab_size must be a positive int, got \[0, 1, 2, 3, 4, 5, "
                     r"\.\.\.\]\.$"):
    jbert.BertConfig(vocab_size=list(range(10 ** 6)))
  line = errors.one_line(ValueError("start " + "y" * 10 ** 6 + " the fix."))
  assert len(line) <= errors.MAX_LINE and line.startswith("start yyy") and line.endswith("yyy the fix.")
  assert "characters cut" in line


def test_the_message_names_the_config_each_format_has():
  config = jbert.BertConfig(**{k: v for k, v in HF_CONFIG.items() if k != "attn_implementation"})
  stored = sizes.Stored("/w/checkpoints/8", 0, {"x": (10,)})
  for config_file, name in (("/m/config.json", "config.json"), ("/m/bert_config.json", "bert_config.json"),
                            ("the bert_config recorded in /w", "config")):
    with pytest.raises(ValueError, match=rf"^{config_file} describes a BERT of 67,840 values .* but /w/checkpoints/8 "
                                         rf"holds 10 values: .*; use the {name} written with them\.$"):
      sizes.check(config, stored, config_file)
