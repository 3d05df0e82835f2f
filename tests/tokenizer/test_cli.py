"""`python -m jbert.tokenizer`: train and show."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

import jbert
from jbert.tokenizer import __main__ as cli

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("cli")
  words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "Hello", "World"]
  for part in range(2):
    lines = [" ".join(words[(i * 7 + j * 3 + part) % len(words)] for j in range(6)) + "." for i in range(400)]
    (tmp / f"part{part}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
  return tmp


def test_train_writes_model_with_fixed_special_ids(corpus_dir, capsys):
  prefix = corpus_dir / "out" / "spm"
  assert cli.main(["train", f"--input={corpus_dir}/part*.txt", "--vocab_size=40", "--model_type=bpe",
                   f"--out={prefix}", "--lowercase"]) == 0
  printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
  assert printed == dict(model=f"{prefix}.model", vocab_size=40, pad_id=0, unk_id=1, cls_id=2, sep_id=3,
                         mask_id=4)
  assert (corpus_dir / "out" / "spm.vocab").read_text(encoding="utf-8").split("\n")[4].startswith("[MASK]\t")
  tok = jbert.load_tokenizer(f"{prefix}.model")
  assert tok.do_lower_case and tok.decode(tok.ids("Hello World alpha.")) == "hello world alpha."


def test_train_without_matching_input_exits(tmp_path, capsys):
  with pytest.raises(SystemExit) as error:
    cli.main(["train", f"--input={tmp_path}/*.txt", "--vocab_size=40", f"--out={tmp_path}/m"])
  assert error.value.code == 2
  assert f"--input={tmp_path}/*.txt matches no files" in capsys.readouterr().err


def test_show_prints_pieces_ids_and_offsets(tmp_path, capsys):
  vocab = tmp_path / "vocab.txt"
  pieces = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able", "!"]
  vocab.write_text("\n".join(pieces) + "\n")
  assert cli.main(["show", f"--vocab={vocab}", "UNAFFABLE", "x!"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[0].startswith("WordPieceTokenizer(") and "do_lower_case=True" in lines[0]
  assert [line.split() for line in lines[1:]] == [
      ["5", "un", "[0:2]"], ["6", "##aff", "[2:5]"], ["7", "##able", "[5:9]"], ["1", "[UNK]", "[10:11]"],
      ["8", "!", "[11:12]"]]


def test_module_entry_point(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hi"]) + "\n")
  env = dict(os.environ, PYTHONPATH=str(REPO))
  result = subprocess.run([sys.executable, "-m", "jbert.tokenizer", "show", "--vocab", str(tmp_path), "Hi"],
                          capture_output=True, text=True, check=True, cwd=tmp_path, env=env, timeout=60)
  assert result.stdout.splitlines()[1].split() == ["5", "hi", "[0:2]"]


def test_show_lower_case_override_and_flags_after_the_text(tmp_path, capsys):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "hi", "Hi"]) + "\n")
  assert cli.main(["show", "Hi", f"--vocab={vocab}", "--do_lower_case=true"]) == 0
  lines = capsys.readouterr().out.strip().splitlines()
  assert "do_lower_case=True" in lines[0] and lines[1].split() == ["5", "hi", "[0:2]"]
  assert cli.main(["show", f"--vocab={vocab}", "--nodo_lower_case", "Hi"]) == 0
  assert capsys.readouterr().out.strip().splitlines()[1].split() == ["6", "Hi", "[0:2]"]


@pytest.mark.parametrize("argv, message", [
    ([], "give a command, one of train, show."),
    (["tokenize"], "give a command, one of train, show."),
    (["train", "--input=x.txt"], "train needs --vocab_size, --out."),
    (["show", "hello"], "show needs --vocab=PATH"),
    (["show", "--vocab=v.txt", "--bogus=1", "x"], "Unknown command line flag 'bogus'"),
    (["train", "--input=x", "--vocab_size=many", "--out=m"], "flag --vocab_size=many"),
])
def test_usage_errors_name_the_problem_and_show_the_usage(argv, message, capsys):
  with pytest.raises(SystemExit) as error:
    cli.main(argv)
  assert error.value.code == 2
  err = capsys.readouterr().err
  assert err.startswith(f"python -m jbert.tokenizer: {message}") and "usage:\n  python -m jbert.tokenizer train" in err


def test_a_vocabulary_that_cannot_be_read_is_one_line(tmp_path, capsys):
  vocab = tmp_path / "vocab.txt"
  vocab.write_bytes(b"\xff\xfe not utf-8\n")
  with pytest.raises(SystemExit) as status:
    cli.main(["show", f"--vocab={vocab}", "Hi"])
  assert status.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(f"{cli.PROG}: ")
