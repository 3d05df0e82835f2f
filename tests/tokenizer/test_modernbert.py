"""ModernBERT's tokenizer: a byte-level BPE tokenizer.json with BERT's layout (`[CLS] A [SEP] B [SEP]`, a
TemplateProcessing post-processor, read by transformers' PreTrainedTokenizerFast), built offline as ModernBERT's is
(its special tokens, [MASK] taking the space before it), through `load_tokenizer`: ids equal transformers'.

Words of a pre-split text (NER) are tokenized as inside running text (`Ġword`, what the model saw); transformers
tokenizes them without the space for this tokenizer class whatever add_prefix_space says, so that is not compared."""
import json

import pytest
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

import jbert
from jbert.tokenizer import ByteLevelBPETokenizer

from . import family_corpus

SPECIALS = ["[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]


def modernbert_folder(folder, vocab_size=1200):
  """answerdotai/ModernBERT-base's tokenizer files, on a vocabulary trained on the shared corpus: NFC, byte-level
  pre-tokenizer without a prefix space, its BERT-style template, and tokenizer_config.json naming the tokens."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.normalizer = normalizers.NFC()
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|padding|>", "<|endoftext|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(family_corpus.training_lines(), trainer=trainer)
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False, lstrip=t == "[MASK]")
                          for t in SPECIALS])
  ids = {t: tok.token_to_id(t) for t in SPECIALS}
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
      special_tokens=[("[CLS]", ids["[CLS]"]), ("[SEP]", ids["[SEP]"])])
  folder.mkdir(parents=True, exist_ok=True)
  tok.save(str(folder / "tokenizer.json"))
  (folder / "tokenizer_config.json").write_text(json.dumps({
      "tokenizer_class": "PreTrainedTokenizerFast", "cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
      "unk_token": "[UNK]", "mask_token": "[MASK]", "model_max_length": 8192, "clean_up_tokenization_spaces": True,
      "model_input_names": ["input_ids", "attention_mask"]}))
  return folder


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  return modernbert_folder(tmp_path_factory.mktemp("modernbert") / "tok")


def test_modernbert_tokenizer_equals_transformers_on_texts_and_pairs(folder):
  tok = jbert.load_tokenizer(folder)
  assert isinstance(tok, ByteLevelBPETokenizer) and tok.source.endswith("tokenizer.json")
  assert tok.pair_separator_ids == (tok.sep_id,) and tok.num_special_tokens(True) == 3
  assert family_corpus.assert_matches_transformers(tok, folder, family_corpus.held_out(), split_words=False) > 400
  ids = tok.encode("The [MASK] of France.")["input_ids"]  # " [MASK]" is one token: [MASK] takes the space
  assert ids[:3] == [tok.cls_id, *tok.ids("The"), tok.mask_id][:3] and ids[2] == tok.mask_id


def test_saved_folder_is_read_back_by_transformers_and_jbert(folder, tmp_path):
  tok = jbert.load_tokenizer(folder)
  tok.save(tmp_path / "saved")
  config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
  assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "bos_token" not in config
  texts = family_corpus.held_out()
  again = jbert.load_tokenizer(tmp_path / "saved")
  assert again.batch_ids(texts) == tok.batch_ids(texts) and again.pair_separator_ids == (tok.sep_id,)
  assert family_corpus.assert_matches_transformers(again, tmp_path / "saved", texts[-30:], split_words=False) > 0
