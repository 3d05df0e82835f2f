"""Tokenizer fixtures for the task families' featurisation tests: a tiny hand-made vocabulary, plus BERT-base's when
present (the conftest files of tests/tasks and tests/data import them)."""
import pathlib

import pytest

from jbert.tokenizer import load_tokenizer

BERT_VOCAB = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "bert-base-uncased-vocab.txt"

TINY_VOCAB = (
    "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "?", "-",
    "the", "a", "cat", "sat", "on", "mat", "is", "in", "of", "who", "what", "where", "lives", "city",
    "capital", "france", "paris", "zoe", "muller", "john", "smith", "went", "to", "new", "york", "river",
    "un", "##bel", "##iev", "##able", "go", "##rba", "##chev", "good", "bad", "movie", "not", "and", "it",
    "was", "very",
)

TOKENIZERS = ["tiny"] + (["bert-base-uncased"] if BERT_VOCAB.exists() else [])


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory):
  path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
  path.write_text("\n".join(TINY_VOCAB) + "\n", encoding="utf-8")
  return load_tokenizer(path)


@pytest.fixture(scope="session", params=TOKENIZERS)
def tokenizer(request, tiny_tokenizer):
  """Every available vocabulary: the tiny one always, BERT-base uncased when /work/shared/data holds it."""
  return tiny_tokenizer if request.param == "tiny" else load_tokenizer(BERT_VOCAB)


@pytest.fixture(scope="session", params=["roberta", "xlmr"])
def family_folder(request, tmp_path_factory):
  """A RoBERTa (byte-level BPE) or XLM-R (SentencePiece) tokenizer folder as transformers saves it, trained on
  the shared text (tests/tokenizer/family_corpus.py)."""
  from tests.tokenizer import family_corpus  # pylint: disable=g-import-not-at-top
  train = family_corpus.train_bpe if request.param == "roberta" else family_corpus.train_xlmr
  return train(tmp_path_factory.mktemp(request.param), vocab_size=600)
