"""ModernBERT's tokenizer: a byte-level BPE tokenizer.json with BERT's layout (`[CLS] A [SEP] B [SEP]`, a
TemplateProcessing post-processor, read by transformers' PreTrainedTokenizerFast), built offline as ModernBERT's is
(its special tokens, [MASK] taking the space before it), through `load_tokenizer`: ids equal transformers'.

Words of a pre-split text (NER) are tokenized as inside running text (`Ġword`, what the model saw); transformers
tokenizes them without the space for this tokenizer class whatever add_prefix_space says, so that is not compared."""
import json

import pytest

import jbert
from jbert.tokenizer import ByteLevelBPETokenizer

from . import family_corpus


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
  return family_corpus.train_modernbert(tmp_path_factory.mktemp("modernbert") / "tok")


def test_modernbert_tokenizer_equals_transformers_on_texts_and_pairs(folder):
  tok = jbert.load_tokenizer(folder)
  assert isinstance(tok, ByteLevelBPETokenizer) and tok.source.endswith("tokenizer.json")
  assert tok.pair_separator_ids == (tok.sep_id,) and tok.num_special_tokens(True) == 3
  assert family_corpus.assert_matches_transformers(tok, folder, family_corpus.held_out(), split_words=False) > 400
  ids = tok.encode("The [MASK] of France.")["input_ids"]  # " [MASK]" is one token: [MASK] takes the space
  head = tok.ids("The")  # one token on the novel; pieces on the generated text used where ../shared is absent
  assert ids[:len(head) + 2] == [tok.cls_id, *head, tok.mask_id]


def test_saved_folder_is_read_back_by_transformers_and_jbert(folder, tmp_path):
  tok = jbert.load_tokenizer(folder)
  tok.save(tmp_path / "saved")
  config = json.loads((tmp_path / "saved" / "tokenizer_config.json").read_text())
  assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "bos_token" not in config
  texts = family_corpus.held_out()
  again = jbert.load_tokenizer(tmp_path / "saved")
  assert again.batch_ids(texts) == tok.batch_ids(texts) and again.pair_separator_ids == (tok.sep_id,)
  assert family_corpus.assert_matches_transformers(again, tmp_path / "saved", texts[-30:], split_words=False) > 0
