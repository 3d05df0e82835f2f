"""The generated offline corpus: deterministic, consistent facts, a closed vocabulary with ## pieces."""
import collections
import re

from jbert.data import sources
from jbert.data import synthetic
from jbert.tokenizer import load_tokenizer


def test_generated_once_and_deterministic(tmp_path):
  a = synthetic.ensure_corpus(tmp_path / "a", num_train=300, num_eval=30)
  b = synthetic.ensure_corpus(tmp_path / "b", num_train=300, num_eval=30)
  for name in ("train.txt", "eval.txt", "vocab.txt"):
    assert (a.directory / name).read_bytes() == (b.directory / name).read_bytes()
  stamp = a.train.stat().st_mtime_ns
  assert synthetic.ensure_corpus(tmp_path / "a") == a
  assert a.train.stat().st_mtime_ns == stamp
  assert len(sources.BertFormatFiles(str(a.train))) == 300
  assert len(sources.BertFormatFiles(str(a.eval))) == 30
  assert a.train.read_text() != a.eval.read_text()


def test_vocabulary_covers_corpus_with_word_pieces(tmp_path):
  corpus = synthetic.ensure_corpus(tmp_path, num_train=300, num_eval=30)
  tok = load_tokenizer(corpus.vocab)
  assert tok.do_lower_case
  assert tok.convert_ids_to_tokens(list(tok.special_ids)) == list(synthetic.SPECIAL_TOKENS)
  lines = corpus.train.read_text().splitlines()
  pieces = collections.Counter(p for line in lines for p in tok.tokenize(line))
  assert "[UNK]" not in pieces
  assert pieces["##s"] > 100 and pieces["##ed"] > 10
  assert tok.tokenize("The cats walked.") == ["the", "cat", "##s", "walk", "##ed", "."]


def test_facts_are_consistent():
  docs = synthetic.generate(500, seed=5)
  homes = collections.defaultdict(set)
  for doc in docs:
    for sentence in doc:
      m = re.match(r"(\w+) (?:is a \w+ who )?lives in (\w+)", sentence.lower())
      if m:
        homes[m.group(1)].add(m.group(2))
  assert len(homes) == len(synthetic._NAMES)
  assert all(len(cities) == 1 for cities in homes.values())
  assert all(3 <= len(doc) <= 9 for doc in docs)
  assert synthetic.generate(20, seed=5) == docs[:20]
