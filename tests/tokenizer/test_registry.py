"""The registry of tokenizer kinds and how load_tokenizer picks one: tokenizer_config.json's tokenizer_class, then
the folder's files; DistilBERT's and ELECTRA's folders are BERT's WordPiece under their own class names."""
import json
import shutil

from etils.epath import gpath as epath_gpath
from etils.epath import testing as epath_testing
import pytest

import jbert
from jbert import tokenizer
from jbert.tokenizer import ByteLevelBPETokenizer, WordPieceTokenizer, XLMRobertaTokenizer, registry

from . import family_corpus

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


_TRAINED = {}


def _wordpiece_vocab(path, lowercase: bool):
  """A WordPiece vocab.txt trained on the shared text (once per casing in this module)."""
  if lowercase in _TRAINED:
    path.write_text(_TRAINED[lowercase], encoding="utf-8")
    return path
  from tokenizers import models, normalizers, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  import tokenizers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.train_from_iterator(family_corpus.training_lines(), trainers.WordPieceTrainer(
      vocab_size=900, special_tokens=SPECIALS, show_progress=False))
  pieces = sorted(tok.get_vocab(), key=tok.get_vocab().get)
  _TRAINED[lowercase] = "\n".join(pieces) + "\n"
  path.write_text(_TRAINED[lowercase], encoding="utf-8")
  return path


@pytest.mark.parametrize("cls,lowercase", [("DistilBertTokenizer", True), ("ElectraTokenizer", True),
                                           ("ElectraTokenizer", False)])
def test_distilbert_and_electra_folders_equal_transformers(tmp_path, cls, lowercase):
  import transformers  # pylint: disable=g-import-not-at-top
  family_corpus.quiet_transformers()
  (tmp_path / "raw").mkdir()
  vocab = _wordpiece_vocab(tmp_path / "raw" / "vocab.txt", lowercase)
  (tmp_path / "raw" / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": cls, "do_lower_case": lowercase, "model_max_length": 128}))
  folder = tmp_path / "hub"
  getattr(transformers, cls).from_pretrained(str(tmp_path / "raw")).save_pretrained(str(folder))
  shutil.copy(vocab, folder / "vocab.txt")  # the Hub's folders hold vocab.txt beside tokenizer.json
  tok = jbert.load_tokenizer(folder)
  assert isinstance(tok, WordPieceTokenizer) and tok.do_lower_case == lowercase and tok.model_max_length == 128
  theirs = transformers.AutoTokenizer.from_pretrained(str(folder))
  assert type(theirs).__name__ in (cls, "BertTokenizer")  # transformers 5 names ELECTRA's BertTokenizer
  texts = family_corpus.held_out()[::2]
  for text in texts:
    assert tok.ids(text) == theirs(text, add_special_tokens=False)["input_ids"], text
  for a, b in zip(texts[::3], texts[1::3]):
    if b:
      assert tok.encode(a, b)["input_ids"] == theirs(a, b)["input_ids"]
      if cls != "DistilBertTokenizer":  # DistilBERT's transformers tokenizer returns no token types
        assert tok.encode(a, b)["token_type_ids"] == theirs(a, b)["token_type_ids"]
  tok.save(tmp_path / "saved")
  config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
  stated = json.loads((folder / "tokenizer_config.json").read_text())["tokenizer_class"]  # v5 writes ELECTRA's as BERT's
  assert (config["tokenizer_class"], config["do_lower_case"], config["model_max_length"]) == (stated, lowercase, 128)
  raw = jbert.load_tokenizer(tmp_path / "raw")  # the class as the folder states it is kept
  raw.save(tmp_path / "raw_saved")
  assert json.loads((tmp_path / "raw_saved" / "tokenizer_config.json").read_text())["tokenizer_class"] == cls


def test_tokenizer_class_picks_the_file_and_the_files_pick_otherwise(tmp_path):
  """An XLM-R folder holds both tokenizer.json and sentencepiece.bpe.model: its class reads tokenizer.json; without
  tokenizer_config.json the .model is read (the same ids). A RoBERTa folder's tokenizer.json is byte-level BPE."""
  xlmr = family_corpus.train_xlmr(tmp_path / "x", vocab_size=500)
  assert tokenizer.find_tokenizer(xlmr) == str(xlmr / "tokenizer.json")
  bare = tmp_path / "bare"
  bare.mkdir()
  for name in ("tokenizer.json", "sentencepiece.bpe.model"):
    shutil.copy(xlmr / name, bare / name)
  assert tokenizer.find_tokenizer(bare) == str(bare / "sentencepiece.bpe.model")
  texts = family_corpus.held_out()
  assert jbert.load_tokenizer(bare).batch_ids(texts) == jbert.load_tokenizer(xlmr).batch_ids(texts)
  assert isinstance(jbert.load_tokenizer(bare / "tokenizer.json"), XLMRobertaTokenizer)
  roberta = family_corpus.train_bpe(tmp_path / "r", vocab_size=400)
  (roberta / "tokenizer_config.json").unlink()
  assert isinstance(jbert.load_tokenizer(roberta), ByteLevelBPETokenizer)
  assert tokenizer.find_tokenizer(roberta / "tokenizer.json") == str(roberta / "tokenizer.json")


def test_registry_names_and_classes():
  assert [k.name for k in registry.kinds()] == ["wordpiece", "bert_sentencepiece", "bpe", "sentencepiece"]
  assert registry.for_class("RobertaTokenizerFast").name == "bpe"
  assert registry.for_class("XLMRobertaTokenizer").name == registry.for_class("CamembertTokenizer").name
  assert registry.for_class("ElectraTokenizerFast").name == "wordpiece"
  assert registry.for_class("DebertaV2Tokenizer") is None and registry.for_class(None) is None
  with pytest.raises(ValueError, match="registered twice"):
    registry.register(registry.kinds()[0])
  assert registry.model_max_length({"model_max_length": 1e30}) is None
  assert registry.special_token({"mask_token": {"content": "<m>", "lstrip": True}}, "mask_token", "<mask>") == "<m>"


def test_folders_in_a_bucket_are_read_with_their_companion_files(tmp_path, monkeypatch):
  """gs:// folders: RoBERTa's vocab.json travels with its merges.txt, XLM-R's .model is told apart from jbert's own
  SentencePiece by its pieces read through etils, and both load as they do locally."""
  monkeypatch.setattr(epath_gpath, "_is_tf_installed", lambda: False)  # etils would hand gs:// to TensorFlow
  bucket = tmp_path / "bucket"
  roberta = family_corpus.train_bpe(tmp_path / "r", vocab_size=400).parent / "vocab_merges"
  xlmr = family_corpus.train_xlmr(tmp_path / "x", vocab_size=500).parent / "spm_only"
  shutil.copytree(roberta, bucket / "roberta")
  (bucket / "xlmr").mkdir()
  shutil.copy(xlmr / "sentencepiece.bpe.model", bucket / "xlmr" / "any.model")

  def local(fn):  # gs://bucket/... -> tmp_path/bucket/...
    def mocked(original, path, *args, **kwargs):
      return original(str(path).replace("gs://bucket", str(bucket)), *args, **kwargs)
    return mocked

  texts = family_corpus.held_out()
  with epath_testing.mock_epath(open=local("open"), exists=local("exists"), isdir=local("isdir"),
                                glob=lambda original, pattern: [p.replace(str(bucket), "gs://bucket") for p in
                                                                original(pattern.replace("gs://bucket", str(bucket)))]):
    remote_roberta = jbert.load_tokenizer("gs://bucket/roberta")
    remote_xlmr = jbert.load_tokenizer("gs://bucket/xlmr")
  assert remote_roberta.batch_ids(texts) == jbert.load_tokenizer(roberta).batch_ids(texts)
  assert isinstance(remote_xlmr, XLMRobertaTokenizer)
  assert remote_xlmr.batch_ids(texts) == jbert.load_tokenizer(xlmr).batch_ids(texts)
