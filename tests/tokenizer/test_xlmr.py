"""XLM-R's SentencePiece: fairseq's ids, and ids equal transformers' XLMRobertaTokenizer (and CamembertTokenizer)
from the same folder, from the .model alone or from the tokenizer.json transformers converts it to."""
import json
import pickle
import shutil

import numpy as np
import pytest
import sentencepiece

import jbert
from jbert.tokenizer import XLMRobertaTokenizer

from . import family_corpus


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
  """XLM-R's Hub layout: tokenizer.json, tokenizer_config.json and sentencepiece.bpe.model; beside it spm_only/
  holds the model with a tokenizer_config.json naming XLMRobertaTokenizer, as transformers 4 saved it."""
  return family_corpus.train_xlmr(tmp_path_factory.mktemp("xlmr"))


def test_hub_folder_equals_transformers(hub):
  tok = jbert.load_tokenizer(hub)
  assert isinstance(tok, XLMRobertaTokenizer) and tok.source.endswith("tokenizer.json")
  assert tok.model_max_length == 512
  assert family_corpus.assert_matches_transformers(tok, hub, family_corpus.held_out()) > 400


def test_sentencepiece_model_alone_equals_transformers_with_fairseq_ids(hub):
  spm_only = hub.parent / "spm_only"
  tok = jbert.load_tokenizer(spm_only)
  assert tok.source == str(spm_only / "sentencepiece.bpe.model")
  assert family_corpus.assert_matches_transformers(tok, spm_only, family_corpus.held_out()) > 400
  sp = sentencepiece.SentencePieceProcessor(model_file=str(spm_only / "sentencepiece.bpe.model"))
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, sp.get_piece_size() + 1)
  assert tok.vocab_size == sp.get_piece_size() + 2
  text = "Привет, как дела? 東京は日本の首都です。 Zoë's café"
  assert tok.ids(text) == [i + 1 if i else 3 for i in sp.encode(text)]  # fairseq: spm id + 1, <unk> at 3
  enc = tok.encode("Ça va", "très bien")
  assert enc["input_ids"] == [0, *tok.ids("Ça va"), 2, 2, *tok.ids("très bien"), 2]
  assert enc["token_type_ids"] == [0] * len(enc["input_ids"])
  pieces = tok.convert_ids_to_tokens(range(tok.vocab_size))
  assert np.flatnonzero(tok.special_mask).tolist() == [0, 1, 2, 3, tok.mask_id]
  assert tok.continuation_mask.tolist() == [not p.startswith("▁") and not tok.special_mask[i]
                                            for i, p in enumerate(pieces)]


def test_a_model_file_without_its_folder_and_camembert_ids(hub, tmp_path):
  """A bare .model (no tokenizer_config.json) is read in XLM-R's layout; CamembertTokenizer's folder in
  CamemBERT's (<s>NOTUSED <pad> </s>NOTUSED <unk> <unk>NOTUSED, pieces from SentencePiece id 1 at + 4)."""
  model = hub / "sentencepiece.bpe.model"
  shutil.copy(model, tmp_path / "any_name.model")
  texts = family_corpus.held_out()
  assert jbert.load_tokenizer(tmp_path / "any_name.model").batch_ids(texts) == jbert.load_tokenizer(hub).batch_ids(texts)
  camembert = tmp_path / "camembert"
  camembert.mkdir()
  shutil.copy(model, camembert / "sentencepiece.bpe.model")
  (camembert / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "CamembertTokenizer"}))
  tok = jbert.load_tokenizer(camembert)
  sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id) == (5, 1, 6, 3)
  assert tok.ids("très bien") == [i + 4 for i in sp.encode("très bien")]
  assert family_corpus.assert_matches_transformers(tok, camembert, texts[-40:]) > 40
  saved = tok.save(tmp_path / "camembert_saved")
  assert json.loads((tmp_path / "camembert_saved" / "tokenizer_config.json").read_text())["tokenizer_class"] == (
      "CamembertTokenizer")
  assert jbert.load_tokenizer(tmp_path / "camembert_saved").batch_ids(texts) == tok.batch_ids(texts)
  assert len(saved) == 4


def test_a_lower_casing_model(hub, tmp_path):
  """Normalisation is the model's own (nmt_nfkc_cf case-folds): do_lower_case says so, ids equal transformers'."""
  sentencepiece.SentencePieceTrainer.train(input=str(hub.parent / "train.txt"), model_prefix=str(tmp_path / "cf"),
                                           vocab_size=800, normalization_rule_name="nmt_nfkc_cf", num_threads=1,
                                           hard_vocab_limit=False, minloglevel=2)
  folder = tmp_path / "lower"
  folder.mkdir()
  shutil.copy(tmp_path / "cf.model", folder / "sentencepiece.bpe.model")
  (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}))
  tok = jbert.load_tokenizer(folder)
  assert tok.do_lower_case and tok.ids("HELLO World") == tok.ids("hello world")
  assert family_corpus.assert_matches_transformers(tok, folder, family_corpus.held_out()[-40:]) > 40
  with pytest.raises(ValueError, match="do_lower_case=False but the SentencePiece model .* does lower-case"):
    jbert.load_tokenizer(folder, do_lower_case=False)


def test_save_round_trip_keeps_the_model(hub, tmp_path):
  tok = jbert.load_tokenizer(hub.parent / "spm_only")
  written = sorted(p.rsplit("/", 1)[1] for p in tok.save(tmp_path / "saved"))
  assert written == ["sentencepiece.bpe.model", "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
  assert (tmp_path / "saved" / "sentencepiece.bpe.model").read_bytes() == (hub / "sentencepiece.bpe.model").read_bytes()
  texts = family_corpus.held_out()
  again = jbert.load_tokenizer(tmp_path / "saved")
  assert again.batch_ids(texts) == tok.batch_ids(texts) and again.model_max_length == 512
  assert family_corpus.assert_matches_transformers(again, tmp_path / "saved", texts[-30:]) > 30
  clone = pickle.loads(pickle.dumps(again))  # data loader workers receive it pickled
  assert clone.batch_ids(texts) == tok.batch_ids(texts)


def test_bad_models_are_one_line(tmp_path):
  (tmp_path / "sentencepiece.bpe.model").write_bytes(b"\x00not a model")
  with pytest.raises(ValueError, match="sentencepiece.bpe.model is not a SentencePiece model"):
    jbert.load_tokenizer(tmp_path)
  (tmp_path / "sentencepiece.bpe.model").unlink()
  (tmp_path / "sentencepiece.bpe.model").symlink_to("/dev/zero")
  with pytest.raises(jbert.errors.UserError, match=r"is a character device \(a link to /dev/zero\)"):
    jbert.load_tokenizer(tmp_path)
