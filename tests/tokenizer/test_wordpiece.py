"""WordPiece parity with BERT's pure-Python tokenizer and transformers' BertTokenizer.

The reference is transformers' `BertTokenizerLegacy`: google-research/bert's BasicTokenizer and
WordpieceTokenizer in Python, plus special tokens kept whole and an NFC step BERT lacks.
"""
import pathlib
import pickle
import unicodedata

import numpy as np
import pytest
import transformers
from etils.epath import gpath as epath_gpath
from etils.epath import testing as epath_testing
from transformers.models.bert import tokenization_bert_legacy

import jbert
from jbert.tokenizer import WordPieceTokenizer, truncate_pair

REAL_VOCAB = pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / "bert-base-uncased-vocab.txt"

SPECIALS = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
UNCASED_WORDS = """hello world , ! ? . - ( ) [ ] { } ' $ 5 ##0 0 un ##aff ##able a ##a b c x ##x wait don t
cafe naive angstrom café naïve ångström é ##é e ##e 中 文 字 符 日 本 語 mixed ##text text zero width join ##er
bo ##m soft hyphen tab new line nb ##sp ideo ο ##δ ##ο ##ς ##σ σ ς α ##α istanbul i ##stanbul emoji mask cls
sep 😀 \U0002B820 \U0002B8F0 \U0002B920""".split()
CASED_WORDS = "Hello World Café NA ##ÏVE Å ##ngström ΟΔΟΣ Ο ##Δ ##Ο ##Σ İ ##stanbul CLS".split()

# All NFC: the legacy reference composes text to NFC first, which BERT does not (see test_decomposed_accents).
TEXTS = [
    "Hello, World!", "hello world", "unaffable", "Unaffable UNAFFABLE",
    "café naïve Ångström", "Café NAÏVE ÅNGSTRÖM",
    "中文字符 日本語 mixed中文text", "wait...!!?? --- (a)[b]{c}", "don't $5.00",
    "a\x00b\x07c\ufffdd \x1f\x85", "zero\u200bwidth\u200djoin\ufeffer bo\u200bm", "soft\u00adhyphen",
    "x" * 100, "x" * 101, "hello " + "x" * 101 + " world", "un" + "a" * 120,
    "tab\tnew\nline\r\u00a0nb\u2028sp\u3000ideo\u2029x", "", "   \t\n ", "\u00a0\u3000\u200b",
    "[CLS] hello [SEP] [mask] x[MASK]y [UNK] [PAD]", "ΟΔΟΣ ΑΣ. ΣΑ Α'Σ ΑΣ\x07 ΑΣΣ",
    "x\U0002B820x\U0002B8F0x\U0002B920x", "emoji 😀x İstanbul", "Ⅻ ﬁ ß ½ ²",
]
# transformers' fast BertTokenizer lower-cases a final capital sigma to "σ" (Python and BERT: "ς") and misses
# the CJK range U+2B820..U+2B91F; it is a reference only on the other texts.
FAST_PARITY_TEXTS = [t for t in TEXTS if "Σ" not in t and "\U0002B820" not in t]
VOCAB_NAMES = ["uncased", "cased"] + (["real_uncased", "real_forced_cased"] if REAL_VOCAB.exists() else [])


def _write_vocab(path, words):
  path.write_text("\n".join(SPECIALS + words) + "\n", encoding="utf-8")
  return path


@pytest.fixture(scope="module")
def vocab_files(tmp_path_factory):
  """name -> (path, do_lower_case); the real vocabulary also runs cased to exercise the explicit override."""
  tmp = tmp_path_factory.mktemp("vocab")
  files = {"uncased": (_write_vocab(tmp / "uncased.txt", UNCASED_WORDS), True),
           "cased": (_write_vocab(tmp / "cased.txt", UNCASED_WORDS + CASED_WORDS), False)}
  if REAL_VOCAB.exists():
    files["real_uncased"] = (REAL_VOCAB, True)
    files["real_forced_cased"] = (REAL_VOCAB, False)
  return files


@pytest.fixture(scope="module", params=VOCAB_NAMES)
def setup(request, vocab_files):
  """(jbert tokenizer, BERT's pure-Python tokenizer, transformers' fast tokenizer) for one vocabulary."""
  path, lower = vocab_files[request.param]
  tok = jbert.load_tokenizer(path, do_lower_case=False if request.param == "real_forced_cased" else None)
  assert tok.do_lower_case == lower
  reference = tokenization_bert_legacy.BertTokenizerLegacy(str(path), do_lower_case=lower)
  fast = transformers.BertTokenizer(str(path), do_lower_case=lower)
  return tok, reference, fast


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_matches_bert_reference(setup, text):
  tok, reference, _ = setup
  expected = reference.tokenize(text)
  assert tok.tokenize(text) == expected
  assert tok.ids(text) == reference.convert_tokens_to_ids(expected)


def test_tokenize_matches_transformers_fast(setup):
  tok, _, fast = setup
  for text in FAST_PARITY_TEXTS:
    assert tok.tokenize(text) == fast.tokenize(text), text


def test_batch_ids_equal_ids(setup):
  tok, _, _ = setup
  assert tok.batch_ids(TEXTS) == [tok.ids(t) for t in TEXTS]
  assert tok.batch_ids([]) == []


def _normalize(text, lower):
  """BERT's normalisation of a span: drop what text cleaning deletes; uncased: lower-case, strip accents.

  Sigma is compared in one form, as its final form depends on context a span lacks.
  """
  text = "".join(c for c in text if not unicodedata.category(c).startswith("C"))
  if lower:
    text = unicodedata.normalize("NFD", text.lower().replace("ς", "σ"))
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
  return text


def test_offsets_point_into_original_text(setup):
  tok, _, _ = setup
  checked = 0
  for text in TEXTS:
    ids, offsets = tok.ids_with_offsets(text)
    assert ids == tok.ids(text)
    for i, (start, end) in zip(ids, offsets):
      if i == tok.unk_id:
        continue
      piece = tok.convert_ids_to_tokens([i])[0]
      if tok.special_mask[i]:
        assert text[start:end] == piece
      else:
        span = _normalize(text[start:end], tok.do_lower_case)
        assert span == _normalize(piece.removeprefix("##"), tok.do_lower_case), (text, piece, start, end)
        assert start < end and _normalize(text[start], False), "spans start at a kept character"
      checked += 1
  assert checked > 80


def _vocab_file(tmp_path, pieces):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(pieces) + "\n", encoding="utf-8")
  return path


SMALL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "cafe", "##s", "naive", "!", "a", "b", "c", "d", "##d"]


def test_offsets_known_value(tmp_path):
  tok = WordPieceTokenizer(_vocab_file(tmp_path, SMALL), do_lower_case=True)
  text = "\u200bCAFÉs,  NAÏVE!"
  ids, offsets = tok.ids_with_offsets(text)
  assert tok.convert_ids_to_tokens(ids) == ["cafe", "##s", "[UNK]", "naive", "!"]
  assert ids == [5, 6, 1, 7, 8]
  assert offsets == [(1, 5), (5, 6), (6, 7), (9, 14), (14, 15)]


def test_decomposed_accents_follow_bert_not_nfc(tmp_path):
  """BERT does not compose "e" + U+0301: cased, the word stays decomposed; uncased strips the accent."""
  vocab = _vocab_file(tmp_path, SMALL + ["café", "Cafe", "##\u0301"])
  text = "Cafe\u0301 café"
  cased = WordPieceTokenizer(vocab, do_lower_case=False)
  assert cased.tokenize(text) == ["Cafe", "##\u0301", "café"]
  assert cased.tokenize(text) == transformers.BertTokenizer(str(vocab), do_lower_case=False).tokenize(text)
  assert WordPieceTokenizer(vocab, do_lower_case=True).tokenize(text) == ["cafe", "cafe"]


def test_final_sigma_as_python_lower(tmp_path):
  vocab = _vocab_file(tmp_path, SMALL + ["ο", "##δ", "##ο", "##σ", "##ς", "σ", "ς", "α", "##α", "'", "."])
  tok = WordPieceTokenizer(vocab, do_lower_case=True)
  assert tok.tokenize("ΟΔΟΣ") == ["ο", "##δ", "##ο", "##ς"]
  assert tok.tokenize("ΑΣΣ Σ ΣΑ Α'Σ") == ["α", "##σ", "##ς", "σ", "σ", "##α", "α", "'", "ς"]


@pytest.mark.parametrize("max_length", [None, 3, 4, 5, 6, 8, 12, 40])
def test_encode_matches_transformers(setup, max_length):
  """Truncation against transformers' Python tokenizer, which truncates as BERT does.

  transformers' fast tokenizer (Rust) gives the odd token of an odd budget to the second text instead, so it
  is a reference only without truncation.
  """
  tok, reference, fast = setup
  pairs = [("Hello, World! unaffable", "café naïve"), ("wait...!!", "中文字符 日本語 mixed中文text hello world"),
           ("a b c d e f", "c b a c b a c b a"), ("x", " "), ("", "\t")]
  kwargs = dict(return_token_type_ids=True, return_attention_mask=True)
  if max_length is not None:
    kwargs.update(max_length=max_length, truncation="longest_first")
  for a, b in pairs:
    expected = {k: list(v) for k, v in reference(a, b, **kwargs).items()}
    assert tok.encode(a, b, max_length=max_length) == expected, (a, b)
    expected = {k: list(v) for k, v in reference(a, **kwargs).items()}
    assert tok.encode(a, max_length=max_length) == expected, a
    if max_length is None:
      assert tok.encode(a, b) == {k: list(v) for k, v in fast(a, b).items()}, (a, b)
  # An empty second text is no second text, as in BERT's run_classifier.py (transformers' Python tokenizer
  # adds a second [SEP] instead).
  assert tok.encode("x", "", max_length=max_length) == tok.encode("x", max_length=max_length)
  assert tok.encode("x", "") == {k: list(v) for k, v in fast("x", "").items()}


def test_encode_layout_known_value(tmp_path):
  tok = WordPieceTokenizer(_vocab_file(tmp_path, SMALL), do_lower_case=True)
  assert tok.encode("a b c", "dd") == dict(input_ids=[2, 9, 10, 11, 3, 12, 13, 3],
                                          token_type_ids=[0, 0, 0, 0, 0, 1, 1, 1], attention_mask=[1] * 8)
  assert tok.encode("a b c", "d", max_length=5) == dict(input_ids=[2, 9, 3, 12, 3],
                                                       token_type_ids=[0, 0, 0, 1, 1], attention_mask=[1] * 5)
  assert tok.encode("a b", max_length=6, pad_to_max_length=True) == dict(
      input_ids=[2, 9, 10, 3, 0, 0], token_type_ids=[0] * 6, attention_mask=[1, 1, 1, 1, 0, 0])
  with pytest.raises(ValueError, match="max_length=2 leaves no room for the 3 special tokens"):
    tok.encode("a", "b", max_length=2)
  with pytest.raises(ValueError, match="pad_to_max_length=True needs max_length"):
    tok.encode("a", pad_to_max_length=True)


def _truncate_like_bert(a, b, max_tokens):
  """google-research/bert `_truncate_seq_pair`."""
  a, b = list(a), list(b)
  while len(a) + len(b) > max_tokens:
    (a if len(a) > len(b) else b).pop()
  return a, b


def test_truncate_pair_matches_bert_loop():
  for len_a in range(7):
    for len_b in range(7):
      for max_tokens in range(14):
        a, b = list(range(len_a)), list(range(100, 100 + len_b))
        assert truncate_pair(a, b, max_tokens) == _truncate_like_bert(a, b, max_tokens)
  assert truncate_pair([1, 2, 3], None, 2) == ([1, 2], None)


def test_masks_and_special_ids(vocab_files):
  tok = jbert.load_tokenizer(vocab_files["uncased"][0])
  assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 2, 3, 4, 5)
  assert tok.vocab_size == len(SPECIALS) + len(UNCASED_WORDS)
  assert np.flatnonzero(tok.special_mask).tolist() == [0, 2, 3, 4, 5]
  pieces = tok.convert_ids_to_tokens(range(tok.vocab_size))
  assert np.flatnonzero(tok.continuation_mask).tolist() == [i for i, p in enumerate(pieces) if p[:2] == "##"]
  assert tok.continuation_mask[tok.convert_tokens_to_ids(["##aff", "un", "##", "[UNK]"])].tolist() == [
      True, False, False, False]
  assert tok.continuation_mask.dtype == tok.special_mask.dtype == np.bool_


def test_convert_and_decode(vocab_files):
  tok = jbert.load_tokenizer(vocab_files["uncased"][0])
  ids = tok.ids("Unaffable hello, world!")
  assert tok.convert_ids_to_tokens(ids) == ["un", "##aff", "##able", "hello", ",", "world", "!"]
  assert tok.convert_tokens_to_ids(["hello", "nope", "[MASK]"]) == [6, tok.unk_id, 5]
  assert tok.decode(tok.encode("Unaffable hello")["input_ids"]) == "[CLS] unaffable hello [SEP]"
  assert tok.decode(tok.encode("Unaffable hello")["input_ids"], skip_special_tokens=True) == "unaffable hello"


def test_lower_case_detection(vocab_files):
  assert jbert.load_tokenizer(vocab_files["uncased"][0]).do_lower_case
  assert not jbert.load_tokenizer(vocab_files["cased"][0]).do_lower_case
  assert not jbert.load_tokenizer(vocab_files["uncased"][0], do_lower_case=False).do_lower_case
  assert jbert.load_tokenizer(vocab_files["cased"][0], do_lower_case=True).do_lower_case


def test_load_from_directory(tmp_path):
  _vocab_file(tmp_path, SMALL)
  tok = jbert.load_tokenizer(tmp_path)
  assert isinstance(tok, WordPieceTokenizer) and tok.vocab_size == len(SMALL)
  (tmp_path / "other.model").write_bytes(b"")
  with pytest.raises(ValueError, match=r"several tokenizers \['vocab.txt', 'other.model'\]"):
    jbert.load_tokenizer(tmp_path)


def test_errors(tmp_path):
  missing = tmp_path / "nope" / "vocab.txt"
  with pytest.raises(FileNotFoundError, match=str(missing)):
    jbert.load_tokenizer(missing)
  with pytest.raises(FileNotFoundError, match="holds no tokenizer \\(vocab.txt, a"):
    jbert.load_tokenizer(tmp_path)
  vocab = _vocab_file(tmp_path, ["[PAD]", "[UNK]", "[SEP]", "hello"])
  with pytest.raises(ValueError, match=r"lacks the special tokens \['\[CLS\]', '\[MASK\]'\]"):
    jbert.load_tokenizer(vocab)
  other = tmp_path / "vocab.json"
  other.write_text("{}")
  with pytest.raises(ValueError, match="Cannot tell the tokenizer kind"):
    jbert.load_tokenizer(other)


def test_pickle_round_trip(vocab_files):
  """Data loader workers receive the tokenizer pickled."""
  tok = jbert.load_tokenizer(vocab_files["uncased"][0])
  clone = pickle.loads(pickle.dumps(tok))
  assert clone.batch_ids(TEXTS) == tok.batch_ids(TEXTS) and clone.do_lower_case


def test_vocabulary_on_gcs_is_read_through_epath(vocab_files, tmp_path, monkeypatch):
  # etils sends gs:// to TensorFlow's file system whenever TF is installed, past its own mock.
  monkeypatch.setattr(epath_gpath, "_is_tf_installed", lambda: False)
  bucket = tmp_path / "bucket"
  (bucket / "bert").mkdir(parents=True)
  (bucket / "bert" / "vocab.txt").write_bytes(pathlib.Path(vocab_files["uncased"][0]).read_bytes())
  seen = []

  def local(fn):  # gs://bucket/... -> tmp_path/bucket/..., recording what was asked for.
    def mocked(original, path, *args, **kwargs):
      seen.append(str(path))
      return original(str(path).replace("gs://bucket", str(bucket)), *args, **kwargs)
    return mocked

  with epath_testing.mock_epath(open=local("open"), exists=local("exists"), isdir=local("isdir"),
                                glob=lambda original, pattern: [p.replace(str(bucket), "gs://bucket") for p in
                                                                original(pattern.replace("gs://bucket", str(bucket)))]):
    tok = jbert.load_tokenizer("gs://bucket/bert")
  assert "gs://bucket/bert/vocab.txt" in seen
  expected = jbert.load_tokenizer(vocab_files["uncased"][0])
  assert tok.vocab_size == expected.vocab_size and tok.do_lower_case
  assert tok.encode("Hello there.", max_length=8) == expected.encode("Hello there.", max_length=8)


def test_save_is_read_by_transformers_auto_tokenizer_with_the_same_ids(setup, tmp_path):
  tok, _, _ = setup
  written = tok.save(tmp_path / "saved")
  assert sorted(pathlib.Path(p).name for p in written) == ["special_tokens_map.json", "tokenizer_config.json",
                                                           "vocab.txt"]
  hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "saved")
  assert type(hf).__name__ == "BertTokenizer" and hf.do_lower_case == tok.do_lower_case
  for text in FAST_PARITY_TEXTS:
    assert hf(text)["input_ids"] == tok.encode(text)["input_ids"], text
  pair = hf("Hello, World!", "unaffable café", truncation=True, max_length=7)
  assert pair["input_ids"] == tok.encode("Hello, World!", "unaffable café", max_length=7)["input_ids"]
  assert pair["token_type_ids"] == tok.encode("Hello, World!", "unaffable café", max_length=7)["token_type_ids"]
  back = jbert.load_tokenizer(tmp_path / "saved")
  assert back.do_lower_case == tok.do_lower_case and back.batch_ids(TEXTS) == tok.batch_ids(TEXTS)


def test_tokenizer_json_alone_gives_the_same_tokenizer(vocab_files, tmp_path):
  for name in ("uncased", "cased"):
    path, lower = vocab_files[name]
    # Model directories saved by transformers 5 hold tokenizer.json and no vocab.txt.
    transformers.BertTokenizer(str(path), do_lower_case=lower).save_pretrained(tmp_path / name)
    (tmp_path / name / "vocab.txt").unlink(missing_ok=True)
    tok = jbert.load_tokenizer(tmp_path / name)
    assert tok.vocab_file == str(tmp_path / name / "tokenizer.json") and tok.do_lower_case == lower
    assert tok.batch_ids(TEXTS) == jbert.load_tokenizer(path).batch_ids(TEXTS)
    pieces = SPECIALS + UNCASED_WORDS + ([] if lower else CASED_WORDS)
    if not lower:  # "##stanbul" is on two lines; the json keeps the last, the earlier id is unreachable
      first = pieces.index("##stanbul")
      pieces[first] = f"[unreachable{first}]"
    assert tok.convert_ids_to_tokens(range(tok.vocab_size)) == pieces


def test_tokenizer_json_of_another_model_is_refused(tmp_path):
  (tmp_path / "tokenizer.json").write_text('{"model": {"type": "WordLevel", "vocab": {}}}')
  with pytest.raises(ValueError, match="Cannot tell the tokenizer kind"):
    jbert.load_tokenizer(tmp_path / "tokenizer.json")
  with pytest.raises(FileNotFoundError, match="holds no tokenizer \\(vocab.txt, a"):
    jbert.load_tokenizer(tmp_path)


def test_a_vocabulary_with_repeated_tokens_loads_and_check_unique_names_each_with_its_lines(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b", "a", "a", "b", "c"]) + "\n")
  tok = WordPieceTokenizer(str(path))  # published models with a repeat still load (the last line wins)
  assert tok.convert_tokens_to_ids(["a", "b", "c"]) == [8, 9, 10]
  with pytest.raises(ValueError) as error:
    tok.check_unique()
  assert str(error.value) == (f"vocabulary {path} repeats 2 token(s): 'a' (lines 6, 8, 9), 'b' (lines 7, 10); each "
                              "token must be on one line only: remove the repeats (a token's id is its line number, "
                              "from 0).")
