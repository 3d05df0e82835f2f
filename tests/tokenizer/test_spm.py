"""SentencePiece tokenizer: training with BERT's special ids, encoding, offsets and masks."""
import pickle
import random
import re

import numpy as np
import pytest
import sentencepiece

import jbert
from jbert import tokenizer
from jbert.tokenizer import SentencePieceTokenizer

WORDS = ["alpha", "beta", "gamma", "delta", "token", "tokenizer", "piece", "pieces", "hello", "world", "café"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("corpus")
  rng = random.Random(0)
  syllables = ["ka", "lo", "mi", "nu", "ser", "tan", "vo", "rel", "pi", "qu", "zo", "da"]
  words = WORDS + ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(300)]
  path = tmp / "corpus.txt"
  lines = (" ".join(rng.choice(words).capitalize() if rng.random() < 0.2 else rng.choice(words)
                    for _ in range(rng.randint(3, 12))) + "." for _ in range(3000))
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def tok(request, corpus):
  prefix = corpus.parent / request.param / "spm"
  return tokenizer.train([str(corpus)], str(prefix), vocab_size=64, model_type=request.param, lowercase=True,
                        character_coverage=1.0)


def test_special_ids_are_fixed(tok):
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
  assert tok.convert_ids_to_tokens(range(5)) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert tok.vocab_size == 64
  assert np.flatnonzero(tok.special_mask).tolist() == [0, 1, 2, 3, 4]
  sp = tok.backend
  assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (0, 1, -1, -1)
  assert [sp.is_control(i) for i in range(2, 5)] == [True, True, True]


def test_encode_and_round_trip(tok):
  ids = tok.ids("Hello world tokenizer pieces.")
  assert tok.unk_id not in ids
  assert tok.decode(ids) == "hello world tokenizer pieces."
  assert tok.ids("alpha,")[-1] == tok.unk_id  # "," is not in the corpus.
  assert tok.decode(tok.ids("alpha beta gamma delta.")) == "alpha beta gamma delta."
  enc = tok.encode("alpha beta", "gamma")
  ids_a, ids_b = tok.ids("alpha beta"), tok.ids("gamma")
  assert enc["input_ids"] == [2, *ids_a, 3, *ids_b, 3]
  assert enc["token_type_ids"] == [0] * (len(ids_a) + 2) + [1] * (len(ids_b) + 1)
  assert enc["attention_mask"] == [1] * (len(ids_a) + len(ids_b) + 3)
  assert tok.decode(enc["input_ids"]) == "[CLS] alpha beta [SEP] gamma [SEP]"
  assert tok.decode(enc["input_ids"], skip_special_tokens=True) == "alpha beta gamma"
  texts = ["alpha beta", "", "Hello World"]
  assert tok.batch_ids(texts) == [tok.ids("alpha beta"), [], tok.ids("hello world")]
  # Control symbols are never produced from text.
  assert not set(tok.ids("[CLS] [SEP] [MASK] [PAD]")) & {0, 2, 3, 4}


def test_tokenize_and_continuation_mask(tok):
  pieces = tok.tokenize("tokenizer hello")
  ids = tok.convert_tokens_to_ids(pieces)
  assert ids == tok.ids("tokenizer hello")
  assert pieces[0].startswith("▁") and "".join(pieces).replace("▁", " ").strip() == "tokenizer hello"
  assert tok.continuation_mask[ids].tolist() == [not p.startswith("▁") for p in pieces]
  every = tok.convert_ids_to_tokens(range(tok.vocab_size))
  expected = [i for i, p in enumerate(every) if i > 4 and not p.startswith("▁")]
  assert np.flatnonzero(tok.continuation_mask).tolist() == expected
  assert tok.convert_tokens_to_ids(["▁not-a-piece"]) == [1]


def test_offsets_point_into_original_text(tok):
  text = "  Hello  tokenizer world."
  ids, offsets = tok.ids_with_offsets(text)
  assert ids == tok.ids(text)
  spans = [text[s:e].strip().lower() for s, e in offsets]
  assert spans == [p.lstrip("▁") for p in tok.convert_ids_to_tokens(ids)]
  assert offsets[0][0] >= 2 and offsets[-1][1] == len(text)


def test_lower_case_is_part_of_the_model(tok, corpus):
  assert tok.do_lower_case and tok.ids("HELLO") == tok.ids("hello")
  with pytest.raises(ValueError, match="do_lower_case=False but SentencePiece model .* does lower-case"):
    SentencePieceTokenizer(tok.model_file, do_lower_case=False)
  cased = tokenizer.train([str(corpus)], str(corpus.parent / "cased" / "m"), vocab_size=64)
  assert not cased.do_lower_case and cased.ids("HELLO") != cased.ids("hello")


def test_load_tokenizer(tok):
  assert isinstance(jbert.load_tokenizer(tok.model_file), SentencePieceTokenizer)
  loaded = jbert.load_tokenizer(tok.model_file.rsplit("/", 1)[0])
  assert loaded.ids("hello world") == tok.ids("hello world") and loaded.do_lower_case


def test_save_copies_the_model(tok, tmp_path):
  written = tok.save(tmp_path / "run" / "tokenizer")
  assert written == [str(tmp_path / "run" / "tokenizer" / "spm.model")]
  with open(tok.model_file, "rb") as original, open(written[0], "rb") as copy:
    assert copy.read() == original.read()
  loaded = jbert.load_tokenizer(tmp_path / "run")  # a training workdir: its tokenizer/ copy
  texts = ["Hello world tokenizer pieces.", "alpha beta"]
  assert loaded.batch_ids(texts) == tok.batch_ids(texts) and loaded.do_lower_case


def test_a_model_file_that_is_no_regular_file_is_refused_by_name(tmp_path):
  """SentencePiece reads its model file whole: a link to /dev/zero would never end. The folder's .model is read by
  jbert, bounded by its size, and anything but a regular file is named."""
  (tmp_path / "spm.model").symlink_to("/dev/zero")
  with pytest.raises(jbert.errors.UserError, match=r"spm.model is a character device \(a link to /dev/zero\), not a "
                     "regular file"):
    jbert.load_tokenizer(tmp_path)


def test_model_without_bert_specials_is_read_in_fairseq_layout(corpus, tmp_path):
  """A SentencePiece model without [CLS] is XLM-R's kind (jbert/tokenizer/xlmr.py): a unigram model in
  SentencePiece's default layout is numbered as fairseq numbers it; a BPE one has no such reading and is refused."""
  sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "plain"),
                                           vocab_size=64, minloglevel=2)
  tok = jbert.load_tokenizer(tmp_path / "plain.model")
  sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "plain.model"))
  assert type(tok).__name__ == "XLMRobertaTokenizer"
  assert tok.ids("alpha beta") == [i + 1 for i in sp.encode("alpha beta")]
  assert (tok.cls_id, tok.pad_id, tok.sep_id, tok.unk_id, tok.mask_id) == (0, 1, 2, 3, 65)
  sentencepiece.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "bpe"),
                                           vocab_size=64, model_type="bpe", minloglevel=2)
  with pytest.raises(ValueError, match="not a SentencePiece model in XLM-R's layout"):
    jbert.load_tokenizer(tmp_path / "bpe.model")


def test_train_argument_errors(corpus, tmp_path):
  with pytest.raises(ValueError, match="model_type='char' is not supported"):
    tokenizer.train([str(corpus)], str(tmp_path / "m"), 40, model_type="char")
  with pytest.raises(ValueError, match="No input files"):
    tokenizer.train([], str(tmp_path / "m"), 40)


def test_pickle_round_trip(tok):
  """Data loader workers receive the tokenizer pickled."""
  clone = pickle.loads(pickle.dumps(tok))
  texts = ["Hello world tokenizer pieces.", "alpha beta"]
  assert clone.batch_ids(texts) == tok.batch_ids(texts) and clone.mask_id == 4
