"""`python -m jbert.embed` and `python -m jbert.fill_mask` as users run them."""
import importlib
import json
import pathlib
import signal
import subprocess
import sys
import time

from absl import flags
import numpy as np

import jbert

from inference.tiny_models import TEXTS

REPO = pathlib.Path(__file__).resolve().parents[2]


def _run(module, *args):
  return subprocess.run([sys.executable, "-m", module, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                        timeout=300)


def _in_process(module, *args) -> int:
  """The command's main in this process (no interpreter start-up): its exit status."""
  command = importlib.import_module(module)
  flags.FLAGS.unparse_flags()
  try:
    command.main(flags.FLAGS([module, *map(str, args)]))
    return 0
  except SystemExit as e:
    return e.code
  finally:
    flags.FLAGS.unparse_flags()


def test_embed_file_to_npy_and_jsonl(tmp_path, st_dir):
  source = tmp_path / "in.txt"
  source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")  # TEXTS holds an empty line and a long one.
  result = _run("jbert.embed", f"--model={st_dir}", f"--input={source}", f"--output={tmp_path / 'out.npy'}",
                "--batch_size=4")
  assert result.returncode == 0, result.stderr
  want = jbert.embed(TEXTS, str(st_dir), batch_size=4)
  got = np.load(tmp_path / "out.npy")
  assert got.shape == (len(TEXTS), 32)
  np.testing.assert_allclose(got, want, atol=1e-6)
  assert result.stderr.count("truncated") == 1 and "1 of 8 inputs had more than max_length=24" in result.stderr
  assert _in_process("jbert.embed", f"--model={st_dir}", f"--input={source}", f"--output={tmp_path / 'out.jsonl'}",
                     "--nonormalize", "--pooling=cls") == 0
  rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
  assert [r["index"] for r in rows] == list(range(len(TEXTS)))
  np.testing.assert_allclose([r["embedding"] for r in rows],
                             jbert.embed(TEXTS, str(st_dir), pooling="cls", normalize=False), atol=1e-6)


def test_embed_refuses_bad_input_with_one_message(tmp_path, st_dir, hf_model_dir, capsys):
  out = tmp_path / "out.npy"
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  latin = tmp_path / "latin.txt"
  latin.write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
  cases = [
      ((f"--model={st_dir}", f"--input={empty}", f"--output={out}"), "empty.txt holds no inputs; nothing to embed"),
      ((f"--model={st_dir}", f"--input={latin}", f"--output={out}"), "latin.txt, line 2: byte 4"),
      ((f"--model={hf_model_dir}", f"--input={tmp_path / 'missing.txt'}", f"--output={out}"), "does not exist"),
  ]
  (tmp_path / "in.txt").write_text("a\n")
  cases.append(((f"--model={hf_model_dir}", f"--input={tmp_path / 'in.txt'}", f"--output={out}"),
                "pass pooling= (--pooling=) one of"))
  for args, message in cases:
    assert _in_process("jbert.embed", *args) == 2
    stderr = capsys.readouterr().err
    lines = [line for line in stderr.splitlines() if line.startswith("jbert.embed: ")]
    assert len(lines) == 1 and message in lines[0], stderr
  assert list(tmp_path.glob("out*")) == [] and list(tmp_path.glob(".out*")) == []


def test_fill_mask_command(mlm_dir, capsys):
  texts = ["paris is the [MASK] of france.", "the [MASK] sat on the [MASK]."]
  result = _run("jbert.fill_mask", f"--model={mlm_dir}", "--top_k=3", "--json", *texts)
  assert result.returncode == 0, result.stderr
  printed = [json.loads(line) for line in result.stdout.splitlines()]
  want = jbert.fill_mask(texts, str(mlm_dir), top_k=3)
  assert [p["text"] for p in printed] == texts
  for record, mine in zip(printed, want):
    assert [[p["token"] for p in m] for m in record["masks"]] == [[p["token"] for p in m] for m in mine]
  capsys.readouterr()
  assert _in_process("jbert.fill_mask", f"--model={mlm_dir}", "--top_k=2", texts[1]) == 0
  first = want[1][0]
  assert capsys.readouterr().out.splitlines()[:2] == [texts[1], "  [MASK] 1: " + " | ".join(
      f"{p['token_str']} {p['score']:.4f}" for p in first[:2])]
  assert _in_process("jbert.fill_mask", f"--model={mlm_dir}", "no mask") == 2
  assert "jbert.fill_mask: Text 0 ('no mask') has no [MASK]" in capsys.readouterr().err
  # Importing the command modules leaves jbert.embed / jbert.fill_mask callable as the functions.
  assert jbert.fill_mask(texts[:1], str(mlm_dir), top_k=3)[0][0][0]["token"] == want[0][0][0]["token"]


def test_interrupted_run_leaves_earlier_output_alone(tmp_path, st_dir):
  source = tmp_path / "in.txt"
  source.write_text("\n".join(TEXTS * 400) + "\n", encoding="utf-8")
  out = tmp_path / "out.npy"
  np.save(out, np.arange(3, dtype=np.float32))
  proc = subprocess.Popen([sys.executable, "-m", "jbert.embed", f"--model={st_dir}", f"--input={source}",
                           f"--output={out}", "--chunk_size=64", "--batch_size=8"], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 240
  while not list(tmp_path.glob(".out.npy.*.tmp")) and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
  assert proc.poll() is None, "the command finished before it could be interrupted"
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 130 and "jbert.embed: interrupted; no output was written." in stderr
  np.testing.assert_array_equal(np.load(out), np.arange(3))  # The earlier file is as it was.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.npy"]
