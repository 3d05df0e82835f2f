"""Model folders of every kind: tokenizers (vocab.txt, tokenizer.json only), labels, and what is refused."""
import hashlib
import json
import os
import shutil
import signal

import numpy as np
import pytest
import transformers

import jbert
from jbert.inference import load_model
from jbert.weights.st_folder import read_sentence_transformer

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


# ----------------------------------------------------------------------------------------------------------
# Untrusted folders: they must not exhaust the machine, block it, or flood the console.
# ----------------------------------------------------------------------------------------------------------


def _embed(*args) -> int:
  """`python -m jbert.embed ARGS` in this process: its exit status."""
  import importlib
  from absl import flags
  command = importlib.import_module("jbert.embed")
  flags.FLAGS.unparse_flags()
  try:
    command.main(flags.FLAGS(["jbert.embed", *map(str, args)]))
    return 0
  except SystemExit as e:
    return e.code
  finally:
    flags.FLAGS.unparse_flags()


def _regular_files(folder):
  return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture
def alarm():
  """Fails a test that blocks (a FIFO opened for reading waits for a writer) instead of hanging the suite."""

  def expire(signum, frame):
    raise TimeoutError("blocked on a file of the model folder")

  previous = signal.signal(signal.SIGALRM, expire)
  signal.alarm(60)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, previous)


# Every file jbert reads from a sentence-transformers folder (a Hugging Face one is the same minus modules.json and
# the module folders), and vocab.txt from a Hugging Face folder.
FOLDER_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "modules.json",
                "sentence_bert_config.json", "1_Pooling/config.json", "vocab.txt"]


@pytest.mark.parametrize("kind", ["a link to /dev/zero", "a FIFO"])
def test_a_folder_file_that_is_no_regular_file_is_refused_by_name(tmp_path, st_dir, hf_model_dir, kind, capsys,
                                                                    alarm):
  """vocab.txt as a link to /dev/zero read until memory ran out (MemoryError); a FIFO blocks its reader for ever.
  Each file a model folder supplies is refused by name, with exit status 2, before the model loads."""
  source = tmp_path / "in.txt"
  source.write_text("the cat sat\n")
  for name in FOLDER_FILES:
    folder = shutil.copytree(hf_model_dir if name == "vocab.txt" else st_dir, tmp_path / name.replace("/", "_"))
    (folder / name).unlink()
    if kind == "a FIFO":
      os.mkfifo(folder / name)
      what = "a FIFO (named pipe)"
    else:
      (folder / name).symlink_to("/dev/zero")
      what = "a character device (a link to /dev/zero)"
    before = _regular_files(tmp_path)
    out = tmp_path / "out.npy"
    assert _embed(f"--model={folder}", f"--input={source}", f"--output={out}", "--pooling=mean") == 2, name
    assert capsys.readouterr().err.splitlines() == [
        f"jbert.embed: {folder}/{name} is {what}, not a regular file; a model folder's files must be plain files: "
        "replace it with the real file."], name
    assert _regular_files(tmp_path) == before and not out.exists()


def test_a_config_that_does_not_fit_its_weights_is_one_short_line(tmp_path, st_dir, capsys):
  """num_hidden_layers: 1000000 took 54 s and 7.2 GB and printed a 646 MB error "line"; a value of 10^6
  characters would have been quoted whole. Both are one line now, from the config and the safetensors header."""
  source = tmp_path / "in.txt"
  source.write_text("the cat sat\n")
  layers = shutil.copytree(st_dir, tmp_path / "layers")
  config = json.loads((layers / "config.json").read_text())
  (layers / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1_000_000}))
  act = shutil.copytree(st_dir, tmp_path / "act")
  (act / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu" * 250_000}))
  before = _regular_files(tmp_path)
  assert _embed(f"--model={layers}", f"--input={source}", f"--output={tmp_path / 'o.npy'}") == 2
  assert capsys.readouterr().err.splitlines() == [
      f"jbert.embed: {layers}/config.json describes a BERT of 8,544,005,472 values (vocab_size={len(VOCAB)}, "
      "hidden_size=32, num_hidden_layers=1,000,000, intermediate_size=64, max_position_embeddings=64, "
      f"type_vocab_size=2) but {layers}/model.safetensors holds 23,616 values: the config does not belong to these "
      "weights, or they are incomplete; use the config.json written with them."]
  assert _embed(f"--model={act}", f"--input={source}", f"--output={tmp_path / 'o.npy'}") == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and len(err[0]) < 300 and err[0].startswith(
      "jbert.embed: BertConfig.hidden_act='gelugelu") and err[0].endswith("use one of gelu, gelu_new, "
                                                                          "gelu_pytorch_tanh, relu.")
  assert _regular_files(tmp_path) == before


def test_a_two_label_classifier_without_id2label_predicts_as_transformers_reads_it(tmp_path, hf_model_dir):
  """transformers 5 saves a two-label classifier without num_labels or id2label and loads it with two labels;
  jbert.predict refused it ("records neither num_labels nor id2label")."""
  import torch
  from inference.tiny_models import random_torch_model
  folder = tmp_path / "classifier"
  model = random_torch_model("BertForSequenceClassification", seed=3)
  model.save_pretrained(folder)
  shutil.copy(hf_model_dir / "vocab.txt", folder)
  assert not {"id2label", "num_labels"} & set(json.loads((folder / "config.json").read_text()))
  texts = ["the cat sat on the mat.", "a big red dog ran quickly"]
  got = jbert.predict(texts, str(folder))
  tok = hf_tokenizer(folder / "vocab.txt")
  with torch.no_grad():
    want = torch.softmax(model(**tok(texts, padding=True, return_tensors="pt")).logits, -1).numpy()
  assert [list(g["probabilities"]) for g in got] == [["LABEL_0", "LABEL_1"]] * 2  # transformers' names
  np.testing.assert_allclose([[g["probabilities"][f"LABEL_{i}"] for i in range(2)] for g in got], want, atol=1e-5)
  assert [g["label"] for g in got] == [f"LABEL_{i}" for i in want.argmax(-1)]
