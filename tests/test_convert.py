"""`python -m jbert.convert`: HF -> jbert -> HF round trip through the command line."""
import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch
import transformers

import jbert
from jbert import convert


PIECES = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(40)), "##s", "##ed", ".", ",", "!"]
TOKENIZER_FILES = {"vocab.txt", "tokenizer_config.json", "special_tokens_map.json"}


def test_hf_to_jbert_to_hf(tmp_path):
  torch.manual_seed(0)
  ref = transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=len(PIECES), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
      max_position_embeddings=16)).eval()
  ref.save_pretrained(tmp_path / "hf")
  (tmp_path / "hf" / "vocab.txt").write_text("\n".join(PIECES) + "\n")
  assert convert.main([str(tmp_path / "hf"), str(tmp_path / "jb"), "--model=masked_lm"]) == 0
  assert (tmp_path / "jb" / "params").is_dir() and TOKENIZER_FILES <= set(os.listdir(tmp_path / "jb"))
  assert convert.main([str(tmp_path / "jb"), str(tmp_path / "back"), "--model=masked_lm"]) == 0
  back = transformers.BertForMaskedLM.from_pretrained(tmp_path / "back").eval()
  ids = torch.tensor([[2, 7, 9, 11, 3]])
  with torch.no_grad():
    np.testing.assert_allclose(back(ids).logits.numpy(), ref(ids).logits.numpy(), atol=1e-6)

  # The tokenizer travelled along: transformers reads the HF output with the ids of the original vocabulary.
  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "back")
  assert hf_tokenizer("w3 w17s. W5ed!")["input_ids"] == [2, 8, 22, 45, 47, 10, 46, 49, 3]
  assert jbert.load_tokenizer(tmp_path / "jb").encode("w3 w17s. W5ed!")["input_ids"] == [2, 8, 22, 45, 47, 10, 46,
                                                                                         49, 3]
  umask = os.umask(0)
  os.umask(umask)
  assert stat.S_IMODE(os.stat(tmp_path / "back" / "model.safetensors").st_mode) == 0o666 & ~umask  # not 0600


def test_a_source_without_tokenizer_is_converted_with_a_note(tmp_path, capsys):
  transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
      max_position_embeddings=16)).save_pretrained(tmp_path / "hf")
  assert convert.main([str(tmp_path / "hf"), str(tmp_path / "jb")]) == 0
  assert not TOKENIZER_FILES & set(os.listdir(tmp_path / "jb"))
  assert f"{tmp_path / 'hf'} has no tokenizer" in capsys.readouterr().err


def test_bad_source_is_one_clear_line(tmp_path):
  result = subprocess.run([sys.executable, "-m", "jbert.convert", str(tmp_path), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
  assert result.returncode == 2
  assert result.stderr.strip().startswith("jbert.convert:") and "Looked for" in result.stderr
  assert "Traceback" not in result.stderr


def test_model_class_defaults_to_the_recorded_one(tmp_path, capsys):
  torch.manual_seed(0)
  ref = transformers.BertForSequenceClassification(transformers.BertConfig(
      vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
      max_position_embeddings=16, num_labels=3)).eval()
  ref.save_pretrained(tmp_path / "hf")
  assert convert.main([str(tmp_path / "hf"), str(tmp_path / "jb")]) == 0
  assert "wrote BertForSequenceClassification" in capsys.readouterr().out
  assert convert.main([str(tmp_path / "jb"), str(tmp_path / "back")]) == 0
  back = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "back").eval()
  ids = torch.tensor([[2, 7, 9, 11, 3]])
  with torch.no_grad():
    np.testing.assert_allclose(back(ids).logits.numpy(), ref(ids).logits.numpy(), atol=1e-6)


def _tiny_hf(folder):
  transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=len(PIECES), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
      max_position_embeddings=16)).save_pretrained(folder)
  (folder / "vocab.txt").write_text("\n".join(PIECES) + "\n")


def _tree(folder):
  return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_unwritable_destination_is_one_line_before_any_work(tmp_path, capsys, monkeypatch):
  _tiny_hf(tmp_path / "hf")
  (tmp_path / "file").write_text("x")
  before = _tree(tmp_path)
  capsys.readouterr()  # transformers' progress bar of saving the source
  assert convert.main([str(tmp_path / "hf"), str(tmp_path / "file" / "out")]) == 2
  assert capsys.readouterr().err == (f"jbert.convert: DST {tmp_path}/file/out cannot be written: {tmp_path}/file is "
                                     "a file, not a folder; choose another DST.\n")
  monkeypatch.setattr(os, "access", lambda path, mode: False)  # root writes anywhere: a read-only folder as seen
  monkeypatch.setattr(jbert, "load_pretrained", lambda *a, **k: pytest.fail("read SRC before checking DST"))
  assert convert.main([str(tmp_path / "hf"), str(tmp_path / "out")]) == 2
  assert capsys.readouterr().err == (f"jbert.convert: DST {tmp_path}/out cannot be written: {tmp_path} is read-only "
                                     "for this user; choose another DST.\n")
  assert _tree(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["file", "hf"]


def test_a_full_disk_names_the_destination_and_leaves_the_old_one(tmp_path, capsys, monkeypatch):
  from jbert.weights import hf_io
  _tiny_hf(tmp_path / "hf")
  assert convert.main([str(tmp_path / "hf"), str(tmp_path / "out"), "--to=hf"]) == 0
  before = _tree(tmp_path)
  capsys.readouterr()
  real_write = hf_io.write

  def full_disk(out_dir, config_dict, state_dict):
    real_write(out_dir, config_dict, state_dict)
    with open(os.path.join(out_dir, "model.safetensors"), "r+b") as f:
      f.truncate(100)
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(hf_io, "write", full_disk)
  for dst in ("out", "new"):
    assert convert.main([str(tmp_path / "hf"), str(tmp_path / dst), "--to=hf"]) == 2
    assert capsys.readouterr().err == (f"jbert.convert: Writing {tmp_path}/{dst} failed: No space left on device; "
                                       "free space or choose another DST (nothing was written there).\n")
  assert _tree(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["hf", "out"]
  monkeypatch.setenv("JBERT_TRACEBACK", "1")
  with pytest.raises(OSError, match="Writing .* failed: No space left on device"):
    convert.main([str(tmp_path / "hf"), str(tmp_path / "out"), "--to=hf"])


@pytest.mark.parametrize("make", [
    lambda: transformers.ElectraForPreTraining(transformers.ElectraConfig(
        vocab_size=99, embedding_size=16, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=37, max_position_embeddings=40)),
    lambda: transformers.XLMRobertaForSequenceClassification(transformers.XLMRobertaConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        max_position_embeddings=42, type_vocab_size=1, pad_token_id=1, num_labels=3)),
], ids=["electra-discriminator", "xlm-roberta-classifier"])
def test_a_family_folder_converts_to_jbert_and_back_as_its_own_class(tmp_path, make):
  torch.manual_seed(0)
  model = make().eval()
  model.save_pretrained(tmp_path / "hf")
  assert convert.main([str(tmp_path / "hf"), str(tmp_path / "jb")]) == 0
  assert convert.main([str(tmp_path / "jb"), str(tmp_path / "back")]) == 0
  back, report = type(model).from_pretrained(tmp_path / "back", output_loading_info=True)
  assert not report["missing_keys"] and not report["unexpected_keys"], report
  ids = torch.tensor(np.random.default_rng(0).integers(3, 99, (2, 9)))
  with torch.no_grad():
    np.testing.assert_allclose(back.eval()(ids).logits.numpy(), model(ids).logits.numpy(), atol=1e-5, rtol=0)


def test_a_family_jbert_does_not_compute_is_one_line_and_writes_nothing(tmp_path):
  torch.manual_seed(0)
  transformers.BertForMaskedLM(transformers.BertConfig(
      vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=37,
      max_position_embeddings=16)).save_pretrained(tmp_path / "hf")
  config = json.loads((tmp_path / "hf" / "config.json").read_text())
  (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, "model_type": "deberta-v2"}))
  result = subprocess.run([sys.executable, "-m", "jbert.convert", str(tmp_path / "hf"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
  assert result.returncode == 2 and "Traceback" not in result.stderr
  assert result.stderr.strip().count("\n") == 0, result.stderr
  assert "model_type 'deberta-v2' is not supported: jbert computes the model types bert, roberta" in result.stderr
  assert not (tmp_path / "out").exists()
