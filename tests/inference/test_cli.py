"""`python -m jbert.embed` and `python -m jbert.fill_mask` as users run them."""
import errno
import gc
import importlib
import json
import logging
import os
import pathlib
import signal
import subprocess
import sys
import time

from absl import flags
import numpy as np
import pytest

import jbert
from jbert import errors
from jbert.inference import cli, loading, progress
from jbert.inference import io as inference_io

from inference.tiny_models import TEXTS

REPO = pathlib.Path(__file__).resolve().parents[2]
MISS = "PERSISTENT COMPILATION CACHE MISS"  # JAX's line for each program it compiles (JAX_EXPLAIN_CACHE_MISSES)


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
  # A quiet console: the command's own lines and its warning (no "Unable to initialize backend 'tpu'", no INFO).
  lines = result.stderr.splitlines()
  assert len(lines) == 3 and lines[0].startswith("jbert.embed: 8 inputs") and lines[2].startswith(
      "jbert.embed: wrote 8 x 32") and lines[1].endswith("1 of 8 inputs had more than max_length=24 tokens and were "
                                                         "truncated."), result.stderr
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
  # --nopacking: each text a row of its own, the same embeddings to float32 rounding.
  assert _in_process("jbert.embed", f"--model={st_dir}", f"--input={source}", f"--output={tmp_path / 'alone.npy'}",
                     "--batch_size=4", "--nopacking") == 0
  np.testing.assert_allclose(np.load(tmp_path / "alone.npy"), got, atol=1e-6, rtol=0)


def test_embed_refuses_bad_input_with_one_message(tmp_path, st_dir, hf_model_dir, capsys):
  out = tmp_path / "out.npy"
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  latin = tmp_path / "latin.txt"
  latin.write_bytes("ok\ncaf\xe9\n".encode("latin-1"))
  surrogate = tmp_path / "surrogate.jsonl"
  surrogate.write_text('{"text": "ok"}\n{"text": "half a pair \\ud800"}\n')
  cases = [
      ((f"--model={st_dir}", f"--input={surrogate}", f"--output={out}"),
       "surrogate.jsonl, line 2: field 'text' holds the escape \\ud800, half of a UTF-16 surrogate pair"),
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
  # 320,000 inputs: packed, the command embeds ~9,000 a second on a quiet 2-core host, so this is half a minute
  # of work and the SIGTERM sent once the temporary file appears lands mid-run even when a loaded host delays it
  # by seconds (64,000 were once done, and the output committed, before the signal arrived in a full suite).
  source.write_text("\n".join(TEXTS * 40000) + "\n", encoding="utf-8")
  out = tmp_path / "out.npy"
  np.save(out, np.arange(3, dtype=np.float32))
  proc = subprocess.Popen([sys.executable, "-m", "jbert.embed", f"--model={st_dir}", f"--input={source}",
                           f"--output={out}", "--chunk_size=64", "--batch_size=8"], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 240
  while not list(tmp_path.glob(".out.npy.*.tmp")) and proc.poll() is None and time.monotonic() < deadline:
    time.sleep(0.05)
  assert proc.poll() is None, "the command finished before it could be interrupted"
  assert list(tmp_path.glob(".out.npy.*.tmp")), "no temporary output within 240 s; the signal would land too early"
  proc.send_signal(signal.SIGTERM)
  _, stderr = proc.communicate(timeout=120)
  assert proc.returncode == 130 and "jbert.embed: interrupted; no output was written." in stderr, \
      (proc.returncode, stderr[-3000:])
  np.testing.assert_array_equal(np.load(out), np.arange(3))  # The earlier file is as it was.
  assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.npy"]


def test_a_sigterm_python_drops_in_a_gc_callback_still_interrupts_before_the_output_is_committed(tmp_path, capsys):
  # The full suite once saw it: SIGTERM's KeyboardInterrupt raised inside JAX's garbage-collector callback was
  # printed as "Exception ignored" and jbert.embed went on to write its output with exit status 0.
  out = tmp_path / "out.npy"
  np.save(out, np.arange(3, dtype=np.float32))
  fired = []

  def during_gc(phase, info):
    del info
    if phase == "start" and not fired:
      fired.append(True)
      signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)  # the handler, where Python cannot raise

  with pytest.raises(SystemExit) as exit_info:
    with cli.user_errors("jbert.embed"):
      with inference_io.NpyWriter(str(out)) as writer:
        line = progress.ProgressLine(2, enabled=False)
        writer.write(np.ones((1, 4), np.float32))
        line.update(1)
        gc.callbacks.append(during_gc)
        try:
          gc.collect()  # the exception raised in the callback is dropped here
        finally:
          gc.callbacks.remove(during_gc)
        assert fired
        writer.write(np.ones((1, 4), np.float32))
        line.update(1)  # raises it again
  assert exit_info.value.code == 130
  assert "jbert.embed: interrupted; no output was written." in capsys.readouterr().err
  np.testing.assert_array_equal(np.load(out), np.arange(3))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npy"]
  assert not progress.INTERRUPTED.is_set()  # cleared for whatever this process runs next
  progress.ProgressLine(1, enabled=False).update(1)


# ----------------------------------------------------------------------------------------------------------
# Errors a user causes: one line, exit 2, nothing written; checked before any work.
# ----------------------------------------------------------------------------------------------------------


def _error_line(capsys, command):
  captured = capsys.readouterr()
  lines = captured.err.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith(f"{command}: "), captured.err
  return lines[0][len(command) + 2:]


def _tree(folder):
  return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_paths_that_cannot_work_are_named_before_the_model_loads(tmp_path, st_dir, mlm_dir, capsys, monkeypatch):
  source = tmp_path / "in.txt"
  source.write_text("a\n")
  (tmp_path / "read_only").mkdir()
  before = _tree(tmp_path)
  cases = [
      ("jbert.embed", (f"--model={tmp_path / 'nonexistent'}", f"--input={source}", f"--output={tmp_path / 'o.npy'}"),
       f"--model={tmp_path}/nonexistent does not exist; pass a model folder (Hugging Face, sentence-transformers, "
       "jbert, a training workdir) or a TF1 checkpoint prefix."),
      ("jbert.embed", (f"--model={st_dir}", f"--input={tmp_path}", f"--output={tmp_path / 'o.npy'}"),
       f"--input={tmp_path} is a directory; name a file in it."),
      ("jbert.embed", (f"--model={st_dir}", f"--input={source}", f"--output={source}/o.npy"),
       f"--output={source}/o.npy cannot be written: {source} is a file, not a folder; choose another path."),
      ("jbert.predict", (f"--model={st_dir}", f"--input={source}", f"--output={source}/o.jsonl"),
       f"--output={source}/o.jsonl cannot be written: {source} is a file, not a folder; choose another path."),
      ("jbert.fill_mask", (f"--model={mlm_dir}", f"--input={source}", f"--output={tmp_path}/read_only/o.jsonl"),
       f"--output={tmp_path}/read_only/o.jsonl cannot be written: {tmp_path}/read_only is read-only for this user; "
       "choose another folder."),
      ("jbert.predict", (f"--model={st_dir}", f"--input={tmp_path / 'missing.jsonl'}", f"--output={tmp_path}/o.jsonl"),
       f"--input={tmp_path}/missing.jsonl does not exist."),
  ]
  # Root writes anywhere, so the read-only folder is what os.access says of it.
  real_access = os.access
  monkeypatch.setattr(os, "access", lambda p, mode: "read_only" not in str(p) and real_access(p, mode))
  loaded = []
  monkeypatch.setattr(loading, "load_model", lambda *a, **k: loaded.append(a))
  for command, args, message in cases:
    assert _in_process(command, *args) == 2
    assert _error_line(capsys, command) == message
  assert loaded == [] and _tree(tmp_path) == before


NUMBERS = [
    ("jbert.embed", "--chunk_size=0", "--chunk_size=0 must be at least 1 (inputs embedded together, which bounds "
     "memory; leave it unset for 32768)."),
    ("jbert.embed", "--chunk_size=-5", "--chunk_size=-5 must be at least 1 (inputs embedded together, which "
     "bounds memory; leave it unset for 32768)."),
    ("jbert.embed", "--batch_size=0", "--batch_size=0 must be at least 1 (rows per batch)."),
    ("jbert.embed", "--max_length=1", "--max_length=1 must be at least 2 (tokens per input, [CLS] and [SEP] "
     "included)."),
    ("jbert.predict", "--batch_size=-1", "--batch_size=-1 must be at least 1 (rows per batch)."),
    ("jbert.predict", "--max_length=0", "--max_length=0 must be at least 3 (tokens per input, [CLS] and [SEP] "
     "included)."),
    ("jbert.predict", "--doc_stride=0", "--doc_stride=0 must be at least 1 (tokens between the starts of a long "
     "context's windows)."),
    ("jbert.predict", "--max_query_length=-1", "--max_query_length=-1 must be at least 1 (question tokens kept)."),
    ("jbert.predict", "--n_best_size=0", "--n_best_size=0 must be at least 1 (start/end candidates per window)."),
    ("jbert.predict", "--max_answer_length=0", "--max_answer_length=0 must be at least 1 (tokens in the longest "
     "answer)."),
    ("jbert.predict", "--null_score_diff_threshold=nan", "--null_score_diff_threshold=nan is not a number; give a "
     "number (or leave it unset)."),
    ("jbert.fill_mask", "--top_k=0", "--top_k=0 must be at least 1 (predictions per mask)."),
    ("jbert.fill_mask", "--batch_size=0", "--batch_size=0 must be at least 1 (rows per batch)."),
    ("jbert.fill_mask", "--max_length=2", "--max_length=2 must be at least 3 (tokens per input, [CLS] and [SEP] "
     "included)."),
]


def test_numbers_that_cannot_work_are_refused_before_anything_is_read(tmp_path, capsys, monkeypatch):
  """A --chunk_size of 0 or less was accepted and embedded the whole input at once (977 MB at 200k lines); every
  numeric flag of the three commands is checked before the input is read or the model loads."""
  source = tmp_path / "in.txt"
  source.write_text("the [MASK] sat\n")
  out = tmp_path / "out.npy"
  out.write_bytes(b"earlier output")
  before = _tree(tmp_path)
  loaded, scanned = [], []
  monkeypatch.setattr(loading, "load_model", lambda *a, **k: loaded.append(a))
  monkeypatch.setattr(cli.files, "scan", lambda *a, **k: scanned.append(a))
  for command, flag, message in NUMBERS:
    output = out if command == "jbert.embed" else out.with_suffix(".jsonl")
    args = [f"--model={tmp_path}", f"--input={source}", f"--output={output}", flag]
    if command == "jbert.embed":
      args.append("--pooling=mean")
    assert _in_process(command, *args) == 2, flag
    assert _error_line(capsys, command) == message
  assert loaded == [] and scanned == [] and _tree(tmp_path) == before


def test_a_full_disk_names_the_output_and_keeps_the_earlier_file(tmp_path, st_dir, capsys, monkeypatch):
  source = tmp_path / "in.txt"
  source.write_text("\n".join(TEXTS) + "\n")
  out = tmp_path / "out.npy"
  np.save(out, np.arange(3, dtype=np.float32))
  before = _tree(tmp_path)

  class FullDisk:  # the output file as a full disk has it: the first write fails

    def __init__(self, path, mode, **kwargs):
      self.real = open(path, mode, **kwargs)  # pylint: disable=consider-using-with
      self.full = os.path.basename(path).startswith(f".{out.name}.")  # the output's temporary file

    def write(self, data):
      if self.full:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
      return self.real.write(data)

    def __getattr__(self, name):
      return getattr(self.real, name)

  # The output is written through `jbert.runtime.atomic`, the one atomic writer.
  monkeypatch.setattr(inference_io.atomic, "open", FullDisk, raising=False)
  assert _in_process("jbert.embed", f"--model={st_dir}", f"--input={source}", f"--output={out}") == 2
  assert capsys.readouterr().err.strip().splitlines()[-1] == (
      f"jbert.embed: Writing {out} failed: No space left on device; free space or choose another path (nothing was "
      "written there).")
  assert _tree(tmp_path) == before


def test_traceback_on_request_and_for_bugs(tmp_path, st_dir, monkeypatch, capsys):
  source = tmp_path / "in.txt"
  source.write_text("a\n")
  args = (f"--model={tmp_path / 'nonexistent'}", f"--input={source}", f"--output={tmp_path / 'o.npy'}")
  monkeypatch.setenv(errors.TRACEBACK_ENV, "1")
  with pytest.raises(FileNotFoundError, match="does not exist; pass a model folder"):
    _in_process("jbert.embed", *args)
  monkeypatch.delenv(errors.TRACEBACK_ENV)

  def bug(*args, **kwargs):
    raise RuntimeError("an internal bug")

  monkeypatch.setattr(importlib.import_module("jbert.embed"), "Embedder", bug)
  with pytest.raises(RuntimeError, match="an internal bug"):  # not a one-line user error: the traceback stays
    _in_process("jbert.embed", f"--model={st_dir}", f"--input={source}", f"--output={tmp_path / 'o.npy'}")
  assert capsys.readouterr().err == "" and sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


@pytest.mark.parametrize("module, own", [("jbert.embed", ["pooling", "pair_column", "pairs"]),
                                         ("jbert.predict", ["doc_stride", "pair_column"]),
                                         ("jbert.fill_mask", ["top_k", "json"])])
def test_help_lists_each_commands_own_flags(module, own):
  importlib.import_module(module)
  listed = {f.name for f in flags.FLAGS.get_key_flags_for_module(module)}
  assert {"model", "input", "output", "tokenizer", "batch_size", "max_length", "dtype", *own} <= listed
  assert "--model: Model folder" in flags.FLAGS.module_help(module)


def test_library_info_lines_are_off_while_a_command_runs():
  from absl import logging as absl_logging
  before = absl_logging.get_verbosity()
  with cli.user_errors("jbert.test"):
    assert absl_logging.get_verbosity() == absl_logging.WARNING  # Orbax logs every step it opens at INFO
    assert not logging.getLogger("jax._src.xla_bridge").isEnabledFor(logging.INFO)  # "Unable to ... 'tpu'"
  assert absl_logging.get_verbosity() == before


def test_system_errors_become_one_line_naming_the_file(capsys):
  with pytest.raises(SystemExit) as exit_status:
    with cli.user_errors("jbert.embed"):
      raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), "/data/in.txt")
  assert exit_status.value.code == 2
  assert capsys.readouterr().err == ("jbert.embed: /data/in.txt: Permission denied; check the path and its "
                                     "permissions.\n")
  with pytest.raises(FileNotFoundError, match="^Model path /nonexistent does not exist; pass a model folder"):
    jbert.embed(["a text"], "/nonexistent")  # not "no pooling": the path is what is wrong


def _embed_cached(model, source, output, cache):
  env = dict(os.environ, JBERT_COMPILE_CACHE=str(cache), JAX_EXPLAIN_CACHE_MISSES="1")
  return subprocess.run([sys.executable, "-m", "jbert.embed", f"--model={model}", f"--input={source}",
                         f"--output={output}", "--pooling=mean", "--batch_size=4"],
                        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_a_second_embed_compiles_nothing_and_an_unwritable_cache_only_warns(tmp_path, hf_model_dir):
  model = hf_model_dir
  source = tmp_path / "in.txt"
  source.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
  cache = tmp_path / "cache"
  first = _embed_cached(model, source, tmp_path / "first.npy", cache)
  assert first.returncode == 0, first.stderr
  entries = sorted(p.name for p in cache.iterdir())
  programs = [e.removesuffix("-cache") for e in entries if e.endswith("-cache")]
  stored = [p for p in programs if p.startswith("jbert-program-")]  # found again without tracing (stored_programs)
  assert first.stderr.count(MISS) == len(programs) - len(stored) == len(stored) > 0  # each compiled once, written
  assert entries == sorted([f"{p}-cache" for p in programs] + [f"{p}-jbert" for p in programs])  # with its record
  second = _embed_cached(model, source, tmp_path / "second.npy", cache)
  assert second.returncode == 0, second.stderr
  assert second.stderr.count(MISS) == 0 and sorted(p.name for p in cache.iterdir()) == entries
  np.testing.assert_array_equal(np.load(tmp_path / "second.npy"), np.load(tmp_path / "first.npy"))

  blocker = tmp_path / "a_file"
  blocker.write_text("")
  third = _embed_cached(model, source, tmp_path / "third.npy", blocker / "xla")
  assert third.returncode == 0, third.stderr
  warnings = [line for line in third.stderr.splitlines() if "compile cache" in line]
  assert len(warnings) == 1 and warnings[0].endswith(
      f"compile cache {blocker / 'xla'}: Not a directory; compiling without a cache (set JBERT_COMPILE_CACHE to a "
      "writable directory, or to off)."), third.stderr
  assert third.stderr.count(MISS) == 0  # no cache: nothing looked up
  np.testing.assert_array_equal(np.load(tmp_path / "third.npy"), np.load(tmp_path / "first.npy"))
