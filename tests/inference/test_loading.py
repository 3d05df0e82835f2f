"""Model folders of every kind: tokenizers (vocab.txt, tokenizer.json only), labels, and what is refused."""
import json
import os
import shutil

import pytest
import transformers

import jbert
from jbert.inference import load_model
from jbert.inference.loading import read_sentence_transformer

from inference.tiny_models import TEXTS, VOCAB, hf_tokenizer


def test_tokenizer_json_only_folder_tokenizes_like_transformers(st_dir, hf_model_dir):
  assert not (st_dir / "vocab.txt").exists() and (st_dir / "tokenizer.json").exists()
  model = load_model(st_dir)
  theirs = transformers.AutoTokenizer.from_pretrained(str(st_dir))
  for text in TEXTS + ["Paris IS the CAPITAL, Ünïcode.", "a\tb\u3000c"]:
    assert model.tokenizer.encode(text)["input_ids"] == theirs(text)["input_ids"], text
  assert model.tokenizer.vocab_size == len(VOCAB)
  assert model.config.hidden_size == 32 and model.model_cls is jbert.BertModel


def test_explicit_tokenizer_and_labels(tmp_path, hf_model_dir):
  folder = tmp_path / "classifier"
  model = transformers.BertForSequenceClassification(transformers.BertConfig(
      vocab_size=len(VOCAB), hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64,
      id2label={0: "negative", 1: "neutral", 2: "positive"}))
  model.save_pretrained(folder)
  with pytest.raises(FileNotFoundError, match=r"holds no tokenizer .*--tokenizer=FILE"):
    load_model(folder, jbert.BertForSequenceClassification)
  loaded = load_model(folder, jbert.BertForSequenceClassification, tokenizer=str(hf_model_dir / "vocab.txt"))
  assert loaded.label_names == ("negative", "neutral", "positive")
  assert loaded.params["classifier"]["kernel"].shape == (32, 3) and loaded.initialised == ()


def test_folders_that_cannot_work_are_refused_first(tmp_path, hf_model_dir, st_dir):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_model(tmp_path / "nothing")
  no_weights = tmp_path / "no_weights"
  no_weights.mkdir()
  shutil.copy(hf_model_dir / "config.json", no_weights)
  shutil.copy(hf_model_dir / "vocab.txt", no_weights)
  with pytest.raises(FileNotFoundError, match="is not a BERT checkpoint jbert can read"):
    load_model(no_weights)
  # A module jbert does not implement (a LayerNorm on the sentence vector) is named, not silently skipped.
  dense = tmp_path / "st_layer_norm"
  shutil.copytree(st_dir, dense)
  modules = json.loads((dense / "modules.json").read_text())
  modules.append({"idx": 3, "name": "3", "path": "3_LayerNorm", "type": "sentence_transformers.models.LayerNorm"})
  (dense / "modules.json").write_text(json.dumps(modules))
  with pytest.raises(ValueError, match=r"has a sentence_transformers.models.LayerNorm module \('3_LayerNorm'\)"):
    read_sentence_transformer(str(dense))
  # A tokenizer larger than the model's vocabulary cannot belong to it.
  big = tmp_path / "big_vocab"
  shutil.copytree(hf_model_dir, big)
  with open(big / "vocab.txt", "a", encoding="utf-8") as f:
    f.write("extra\n")
  with pytest.raises(ValueError, match=f"has {len(VOCAB) + 1} pieces but the model's vocab_size is {len(VOCAB)}"):
    load_model(big)


def test_tokenizer_config_casing_is_used(tmp_path, hf_model_dir):
  cased = tmp_path / "cased"
  shutil.copytree(hf_model_dir, cased)
  (cased / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
  tok = load_model(cased).tokenizer
  assert tok.tokenize("The Cat") == ["[UNK]", "[UNK]"]  # No lower-casing: capitals are not in the vocabulary.
  reference = hf_tokenizer(os.path.join(hf_model_dir, "vocab.txt"))
  assert load_model(hf_model_dir).tokenizer.encode("The Cat")["input_ids"] == reference("The Cat")["input_ids"]


def test_added_tokens_of_a_tokenizer_json_are_read(tmp_path, hf_model_dir):
  """A tokenizer.json whose added_tokens hold an id past the WordPiece vocab (transformers' `add_tokens`): the
  tokenizer is jbert.tokenizer's, which reads added_tokens, so that id exists and the resized model loads."""
  folder = tmp_path / "added"
  fast = hf_tokenizer(hf_model_dir / "vocab.txt")
  fast.add_tokens(["<ent>"], special_tokens=True)
  fast.save_pretrained(folder)
  assert not (folder / "vocab.txt").exists()  # The tokenizer.json alone, as sentence-transformers 6 saves it.
  assert json.loads((folder / "tokenizer.json").read_text())["added_tokens"][-1]["content"] == "<ent>"
  model = transformers.BertModel.from_pretrained(str(hf_model_dir))
  model.resize_token_embeddings(len(VOCAB) + 1)
  model.save_pretrained(folder)
  loaded = load_model(folder)
  assert loaded.tokenizer.vocab_size == len(VOCAB) + 1 == loaded.config.vocab_size
  assert loaded.tokenizer.convert_ids_to_tokens([len(VOCAB)]) == ["<ent>"]
  assert loaded.tokenizer.encode("the cat")["input_ids"] == fast("the cat")["input_ids"]


def test_initialised_weights_are_reported_without_the_log(tmp_path, hf_model_dir):
  """`load_model` learns the initialised weights from `load_pretrained_report`, not from a log message: with
  logging off (or the message reworded) an untrained head is still known."""
  import logging
  from jbert import weights
  loaded = weights.load_pretrained_report(hf_model_dir, jbert.BertForSequenceClassification, num_labels=3)
  assert sorted(loaded.initialised) == ["classifier/bias", "classifier/kernel"]
  config, params = jbert.load_pretrained(hf_model_dir, jbert.BertForSequenceClassification, num_labels=3)
  assert params["classifier"]["kernel"].shape == (32, 3) and config.hidden_size == 32
  logging.disable(logging.CRITICAL)
  try:
    model = load_model(hf_model_dir, jbert.BertForSequenceClassification, num_labels=3)
  finally:
    logging.disable(logging.NOTSET)
  assert sorted(model.initialised) == ["classifier/bias", "classifier/kernel"]
  assert weights.load_pretrained_report(hf_model_dir, jbert.BertModel).initialised == ()


def test_resolve_follows_a_folder_once(st_dir, hf_model_dir, tmp_path):
  from jbert.inference import folder
  hf = folder.resolve(hf_model_dir)
  assert (hf.weights, hf.info.kind, hf.tokenizer) == (str(hf_model_dir), "hf", str(hf_model_dir / "vocab.txt"))
  assert hf.info.config.hidden_size == 32 and hf.checkpoint_dir is None and hf.run_config is None
  st = folder.resolve(st_dir)
  assert st.sentence_transformer.pooling == ("mean",) and st.sentence_transformer.normalize
  assert st.tokenizer == str(st_dir / "tokenizer.json") and st.info.kind == "hf"
  assert load_model(st_dir).folder == st
  with pytest.raises(FileNotFoundError, match="does not exist"):
    folder.resolve(tmp_path / "nothing")
