"""Tiny random models for the inference tests, written in the formats users have: a Hugging Face folder with a
vocab.txt, a sentence-transformers folder (as sentence-transformers 6 saves it: tokenizer.json only, the newer
pooling config), one with a Dense projection, and one in the legacy layout (0_Transformer/, pooling_mode_*
booleans, max_seq_length)."""
import json
import os
import shutil

import pytest

from inference.tiny_models import SIZES, hf_tokenizer, random_torch_model, write_vocab


@pytest.fixture(scope="session")
def hf_model_dir(tmp_path_factory):
  """A Hugging Face BertModel folder (config.json, model.safetensors, vocab.txt)."""
  folder = tmp_path_factory.mktemp("hf_bert")
  random_torch_model("BertModel").save_pretrained(folder)
  write_vocab(folder)
  return folder


@pytest.fixture(scope="session")
def st_dir(tmp_path_factory, hf_model_dir):
  """A sentence-transformers folder saved by sentence-transformers: mean pooling + Normalize, max length 24."""
  from sentence_transformers import SentenceTransformer, models
  source = tmp_path_factory.mktemp("st_source")
  for name in os.listdir(hf_model_dir):
    shutil.copy(hf_model_dir / name, source / name)
  hf_tokenizer(hf_model_dir / "vocab.txt").save_pretrained(source)
  transformer = models.Transformer(str(source), max_seq_length=24)
  pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
  folder = tmp_path_factory.mktemp("st") / "model"
  SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu").save(str(folder))
  return folder


@pytest.fixture(scope="session")
def st_dense_dir(tmp_path_factory, st_dir):
  """st_dir's transformer behind CLS + mean pooling, a Dense projection (64 -> 16, tanh) and Normalize, saved by
  sentence-transformers 6."""
  import torch
  from sentence_transformers import SentenceTransformer, models
  torch.manual_seed(0)
  transformer = models.Transformer(str(st_dir), max_seq_length=24)
  modules = [transformer, models.Pooling(SIZES["hidden_size"], pooling_mode=("cls", "mean")),
             models.Dense(2 * SIZES["hidden_size"], 16), models.Normalize()]
  folder = tmp_path_factory.mktemp("st_dense") / "model"
  SentenceTransformer(modules=modules, device="cpu").save(str(folder))
  return folder


@pytest.fixture(scope="session")
def legacy_st_dir(tmp_path_factory, hf_model_dir):
  """The layout sentence-transformers 2.x wrote: 0_Transformer/ with vocab.txt and sentence_bert_config.json,
  pooling_mode_* booleans (here CLS + max, concatenated), no Normalize, max_seq_length 12."""
  folder = tmp_path_factory.mktemp("st_legacy")
  transformer = folder / "0_Transformer"
  transformer.mkdir()
  for name in os.listdir(hf_model_dir):
    shutil.copy(hf_model_dir / name, transformer / name)
  (transformer / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": 12, "do_lower_case": False}))
  (transformer / "tokenizer_config.json").write_text(json.dumps(
      {"do_lower_case": True, "tokenizer_class": "BertTokenizer", "model_max_length": 512}))
  (folder / "1_Pooling").mkdir()
  (folder / "1_Pooling" / "config.json").write_text(json.dumps({
      "word_embedding_dimension": SIZES["hidden_size"], "pooling_mode_cls_token": True,
      "pooling_mode_mean_tokens": False, "pooling_mode_max_tokens": True, "pooling_mode_mean_sqrt_len_tokens": False}))
  (folder / "modules.json").write_text(json.dumps([
      {"idx": 0, "name": "0", "path": "0_Transformer", "type": "sentence_transformers.models.Transformer"},
      {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
  return folder


@pytest.fixture(scope="session")
def mlm_dir(tmp_path_factory):
  """A random BertForMaskedLM folder with a vocab.txt, and its transformers model and tokenizer."""
  folder = tmp_path_factory.mktemp("mlm")
  model = random_torch_model("BertForMaskedLM", seed=1)
  model.save_pretrained(folder)
  write_vocab(folder)
  return folder
