"""The vocabulary `prepare --train_vocab` trains: fewer pieces than asked are said, a vocabulary of characters
alone is refused in one line (exit status 2, the shards kept), a rerun that rewrites the manifest keeps the
vocabulary it trained, and a rerun on a finished corpus installs a damaged one again."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from jbert.data import prepare
from jbert.data import shards as shards_lib

REPO = pathlib.Path(__file__).resolve().parents[2]


def cli(*args) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "jbert.data", "prepare", *args], cwd=REPO, capture_output=True,
                        text=True, timeout=300, check=False)


def test_a_corpus_that_teaches_no_word_is_refused_and_the_shards_are_kept(tmp_path):
  (tmp_path / "tiny.txt").write_text("Hello there world.\n\nAnother small document here.\n")
  out = tmp_path / "out"
  flags = [f"--input={tmp_path}/tiny.txt", f"--output={out}", "--workers=1"]
  result = cli(*flags, "--train_vocab=30522")
  # (How many merges tie-breaking keeps varies from run to run of the trainer: the count is matched, not fixed.)
  assert result.returncode == 2 and re.fullmatch(
      r"jbert\.data: --train_vocab=30522: the 2 sampled document\(s\) taught WordPiece \d\d pieces, their "
      r"characters and no word \(a piece must be seen at least twice\), too few to train a model with; prepare more "
      r"text, or copy a vocabulary in with --vocab=PATH \(e\.g\. bert-base-uncased's vocab\.txt\)\. The shards "
      r"written are kept\.\n", result.stderr), result.stderr
  assert sorted(os.listdir(out)) == ["documents-00000-of-00001.array_record", "parts", "plan.json"]
  # The way out the line names: the shards are reused, the manifest written.
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hello", "world", "."]) + "\n")
  result = cli(*flags, f"--vocab={vocab}")
  assert result.returncode == 0, result.stderr
  assert "1 already written" in result.stdout and (out / "manifest.json").exists()


def test_fewer_pieces_than_asked_are_said_and_a_rerun_keeps_the_trained_vocabulary(tmp_path):
  (tmp_path / "small.txt").write_text("the cat sat on the mat. the cat ate.\n\nthe dog sat on the cat.\n")
  options = prepare.Options(inputs=str(tmp_path / "small.txt"), output=str(tmp_path / "out"), workers=1,
                            train_vocab=30522)
  lines = []
  prepare.prepare(options, log=lines.append)
  assert any(re.fullmatch(r"prepare: the vocabulary has \d\d pieces, not the 30,522 asked: the 2 sampled "
                          r"document\(s\) hold no more pieces seen at least twice \(more text gives more\)", line)
             for line in lines), lines
  vocab = tmp_path / "out" / "vocab.txt"
  assert {"the", "cat", "sat"} <= set(vocab.read_text().split())
  before, stamp = vocab.read_bytes(), vocab.stat().st_mtime_ns
  (tmp_path / "out" / "manifest.json").write_text("{")  # a damaged manifest: rewritten, the vocabulary kept
  lines.clear()
  manifest = prepare.prepare(options, log=lines.append)
  assert "prepare: keeping the vocabulary trained before on these shards (vocab.txt)" in lines
  assert manifest["vocab"] == "vocab.txt" and (vocab.read_bytes(), vocab.stat().st_mtime_ns) == (before, stamp)


def test_a_damaged_vocabulary_of_a_finished_corpus_is_found_and_installed_again_by_the_same_command(tmp_path):
  """A rerun on a finished corpus checks its vocabulary, as it checks its shards: a trained vocab.txt whose CRC32C
  is not the one parts/vocab.json records (or whose record is unreadable) is named and trained again, to the same
  bytes, and a copied one that is not --vocab's bytes is copied again; an intact one is left alone."""
  (tmp_path / "small.txt").write_text("the cat sat on the mat. the cat ate.\n\nthe dog sat on the cat.\n")
  out = tmp_path / "out"
  vocab, record, manifest = out / "vocab.txt", out / "parts" / "vocab.json", out / "manifest.json"
  flags = [f"--input={tmp_path}/small.txt", f"--output={out}", "--workers=1", "--train_vocab=100"]
  assert cli(*flags).returncode == 0
  trained, recorded, listed = vocab.read_bytes(), record.read_bytes(), manifest.read_bytes()
  crc = json.loads(recorded)["crc32c"]

  vocab.write_bytes(trained.replace(b"cat", b"cot", 1))  # one word changed: the size stays, the CRC32C does not
  damaged = shards_lib.crc32c(str(vocab))
  result = cli(*flags)
  assert (result.returncode, result.stderr) == (0, ""), result.stderr
  assert (f"prepare: {vocab} is damaged (CRC32C {damaged}, where {record} records {crc}); the vocabulary is "
          "trained again.") in result.stdout.splitlines()
  assert (vocab.read_bytes(), record.read_bytes(), manifest.read_bytes()) == (trained, recorded, listed)

  record.write_text("{")  # the record itself damaged: the vocabulary cannot be vouched for
  result = cli(*flags)
  assert (f"prepare: {record}, the record of {vocab}, is missing or unreadable; the vocabulary is trained "
          "again.") in result.stdout.splitlines()
  assert (vocab.read_bytes(), record.read_bytes()) == (trained, recorded)
  assert f"prepare: {out} is already prepared (2 documents); nothing to do." in cli(*flags).stdout.splitlines()

  copied = tmp_path / "copied"
  source = tmp_path / "vocab.txt"
  source.write_bytes(trained)
  copy_flags = [f"--input={tmp_path}/small.txt", f"--output={copied}", "--workers=1", f"--vocab={source}"]
  assert cli(*copy_flags).returncode == 0
  (copied / "vocab.txt").write_bytes(trained[:-10])  # cut short
  result = cli(*copy_flags)
  assert (f"prepare: {copied / 'vocab.txt'} is not the bytes of --vocab={source}; the vocabulary is copied "
          "again.") in result.stdout.splitlines()
  assert (copied / "vocab.txt").read_bytes() == trained


def _novel(tmp_path) -> pathlib.Path:
  """The shared novel plus generated multilingual text as documents of 8 lines (tests/tokenizer/family_corpus.py)."""
  from tests.tokenizer import family_corpus
  lines = family_corpus.training_lines()
  path = tmp_path / "novel.txt"
  path.write_text("\n\n".join(" ".join(lines[i:i + 8]) for i in range(0, len(lines), 8)) + "\n", encoding="utf-8")
  return path


@pytest.mark.parametrize("kind,name,cls", [("wordpiece", "vocab.txt", "WordPieceTokenizer"),
                                           ("bpe", "tokenizer.json", "ByteLevelBPETokenizer"),
                                           ("sentencepiece", "sentencepiece.bpe.model", "XLMRobertaTokenizer")])
def test_each_kind_trains_reproducibly_and_is_recorded(tmp_path, kind, name, cls):
  """The same command on the same text, twice (two processes: no hash order or thread count can differ the
  bytes): byte-identical vocabularies of the kind asked, named in the manifest, recorded with their kind."""
  import jbert
  novel = _novel(tmp_path)
  made = []
  for run in ("a", "b"):
    result = cli(f"--input={novel}", f"--output={tmp_path / run}", "--workers=1", "--train_vocab=700",
                 f"--vocab_kind={kind}", "--nolowercase")
    assert result.returncode == 0, result.stderr
    made.append((tmp_path / run / name).read_bytes())
  assert made[0] == made[1]
  manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
  assert manifest["vocab"] == name
  assert manifest["finalize"].get("vocab_kind") == (None if kind == "wordpiece" else kind)
  record = json.loads((tmp_path / "a" / "parts" / "vocab.json").read_text())
  assert record["trained"].get("vocab_kind", "wordpiece") == kind and record["trained"]["train_vocab"] == 700
  tok = jbert.load_tokenizer(tmp_path / "a" / name)
  assert type(tok).__name__ == cls and tok.vocab_size == 700 and not tok.do_lower_case
  assert tok.unk_id not in tok.ids("Москва 東京 café")
  again = cli(f"--input={novel}", f"--output={tmp_path / 'a'}", "--workers=1", "--train_vocab=700",
              f"--vocab_kind={kind}", "--nolowercase")
  assert again.returncode == 0 and "already prepared" in again.stdout, again.stderr


def test_vocab_kind_refusals_are_one_line(tmp_path):
  (tmp_path / "tiny.txt").write_text("Hello there world.\n\nAnother small document here.\n")
  flags = [f"--input={tmp_path}/tiny.txt", f"--output={tmp_path / 'out'}", "--workers=1"]
  result = cli(*flags, "--train_vocab=300", "--vocab_kind=unigram")
  assert (result.returncode, result.stderr) == (2, "jbert.data: --vocab_kind=unigram; expected one of wordpiece, bpe, "
                                                   "sentencepiece.\n")
  result = cli(*flags, "--vocab_kind=bpe")
  assert result.returncode == 2 and result.stderr.startswith("jbert.data: --vocab_kind=bpe without --train_vocab=N")
  assert not (tmp_path / "out").exists()
  result = cli(*flags, "--train_vocab=200", "--vocab_kind=bpe")
  assert (result.returncode, result.stderr) == (2, "jbert.data: --train_vocab=200 leaves no room for merges beside "
                                                   "byte-level BPE's 256 bytes and 5 special tokens; RoBERTa's is "
                                                   "50265.\n")
  assert sorted(os.listdir(tmp_path / "out")) == ["documents-00000-of-00001.array_record", "parts", "plan.json"]


def test_a_corpus_with_a_trained_sentencepiece_vocabulary_trains(tmp_path, kind="sentencepiece"):
  """XLM-R's kind through run.py (the byte-level BPE kind shares its tokenizer class, jbert/tokenizer/pipeline.py,
  and one run is the cost worth paying here)."""
  novel = _novel(tmp_path)
  result = cli(f"--input={novel}", f"--output={tmp_path / 'corpus'}", "--workers=1", "--train_vocab=600",
               f"--vocab_kind={kind}", "--eval_documents=8")
  assert result.returncode == 0, result.stderr
  trained = subprocess.run(
      [sys.executable, "run.py", "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}",
       "--config.data.source=prepared", f"--config.data.prepared={tmp_path / 'corpus'}", "--config.total_steps=2",
       "--config.eval_every_steps=2", "--config.eval_batches=1", "--config.batch_size=8",
       "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5"],
      cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
  assert trained.returncode == 0, trained.stderr[-3000:]
  metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
  assert any("train/loss" in m and m["step"] == 2 for m in metrics)
  import jbert
  saved = jbert.load_tokenizer(tmp_path / "run")  # the run keeps the corpus's tokenizer, of its kind
  assert saved.vocab_size == 600 and saved.mask_id == (4 if kind == "bpe" else 599)
