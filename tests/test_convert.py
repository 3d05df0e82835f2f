"""`python -m jbert.convert`: HF -> jbert -> HF round trip through the command line."""
import os
import stat
import subprocess
import sys

import numpy as np
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
