"""The vocabulary `prepare --train_vocab` trains: fewer pieces than asked are said, a vocabulary of characters
alone is refused in one line (exit status 2, the shards kept), and a rerun that rewrites the manifest keeps the
vocabulary it trained."""
import os
import pathlib
import re
import subprocess
import sys

from jbert.data import prepare

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
