"""`jbert.search index` under storage faults and after dead builders: a read-only folder or a disk that fills at
any write (the manifest, a chunk, index.faiss, docs.jsonl) is one line naming the file, exit status 2, with
what was embedded kept; once there is room the same command finishes the index an uninterrupted build makes. A
kill -9 during the final save, an orphan DIR.partial beside a finished index and a second builder that lost the
race leave nothing behind on the next start, and the loser embeds nothing. A damaged chunk of an unfinished build
is named and embedded again (never unpickled); a run refused for its model, or stopped before its first chunk,
leaves no DIR.partial, while one holding an earlier run's chunks keeps them."""
import fcntl
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

import storage_faults
from jbert.inference import loading
from jbert.search import BuildOptions, Index, build_index
from jbert.search import build as build_lib
from jbert.search import faiss_file

from search.conftest import OPTIONS_KW, command, dead_pid, interrupted_build, one_line, tree_hashes

REPO = pathlib.Path(__file__).resolve().parents[2]
OPTIONS = BuildOptions(**OPTIONS_KW)


def _index_args(corpus, model, index_dir):
  return ("index", f"--model={model}", f"--corpus={corpus}", "--text_column=body", "--id_column=doc",
          f"--index={index_dir}", "--chunk_size=16")


def _count_embedded(monkeypatch) -> list[int]:
  embedded = []
  real = build_lib.Embedder.__call__
  monkeypatch.setattr(build_lib.Embedder, "__call__", lambda self, texts, **kw: embedded.append(len(texts)) or
                      real(self, texts, **kw))
  return embedded


def _no_model_load(monkeypatch):
  def refuse(*args, **kwargs):
    raise AssertionError("the model was loaded")
  monkeypatch.setattr(loading, "load_model", refuse)


def test_a_read_only_folder_is_one_line_naming_it(tmp_path, bi_encoder, corpus, capsys, monkeypatch):
  if storage_faults.MODE == "simulated":
    pytest.skip("needs a read-only mount or chmod")
  folder = tmp_path / "ro"
  folder.mkdir()
  (folder / "notes.txt").write_text("kept")
  before = tree_hashes(folder)
  _no_model_load(monkeypatch)
  with storage_faults.read_only(folder):
    assert command(*_index_args(corpus, bi_encoder, folder / "index")) == 2
  assert one_line(capsys) == (f"jbert.search: cannot create {folder}/index.partial: Read-only file system; make "
                              f"{folder} writable or choose another --index folder.")
  assert tree_hashes(folder) == before
  # An unfinished build on storage that became read-only since: the rerun names the file and keeps the chunk.
  monkeypatch.undo()
  interrupted_build(folder / "index", corpus, bi_encoder)
  before = tree_hashes(folder)
  with storage_faults.read_only(folder):
    assert command(*_index_args(corpus, bi_encoder, folder / "index")) == 2
  assert one_line(capsys) == (f"jbert.search: cannot write {folder}/index.partial/.lock: Read-only file system; "
                              f"make {folder}/index.partial writable and rerun the same command (the 1 chunk "
                              f"embedded so far is kept in {folder}/index.partial).")
  assert tree_hashes(folder) == before


@pytest.mark.parametrize("point", ["manifest", "chunk", "index.faiss", "docs.jsonl"])
def test_a_disk_that_fills_is_one_line_naming_the_file_and_the_rerun_finishes_the_index(
    point, small_disk, built_dir, bi_encoder, corpus, capsys, monkeypatch):
  index_dir = small_disk.directory / "index"
  partial = small_disk.directory / "index.partial"
  with monkeypatch.context() as m:
    if point == "manifest":
      small_disk.fill()
    elif point == "chunk":  # full once the first chunk is on disk
      real = build_lib.Embedder.__call__
      m.setattr(build_lib.Embedder, "__call__", lambda self, texts, **kw: (
          small_disk.fill() if (partial / "chunks" / "000000.npy").exists() else None) or real(self, texts, **kw))
    elif point == "index.faiss":
      real_save = Index.save
      m.setattr(Index, "save", lambda self, d: small_disk.fill() or real_save(self, d))
    else:  # full once index.faiss is written
      real_write = faiss_file.write
      m.setattr(faiss_file, "write", lambda *a: (real_write(*a), small_disk.fill())[0])
    assert command(*_index_args(corpus, bi_encoder, index_dir)) == 2
  name = {"manifest": f"{partial}/manifest.json", "chunk": f"{partial}/chunks/000001.npy",
          "index.faiss": f"{index_dir}/index.faiss", "docs.jsonl": f"{index_dir}/docs.jsonl"}[point]
  kept = {"manifest": "nothing was embedded yet", "chunk": f"the 1 chunk embedded so far is kept in {partial}"}.get(
      point, f"the 3 chunks embedded so far are kept in {partial}")
  assert one_line(capsys) == (f"jbert.search: cannot write {name}: No space left on device; free space on "
                              f"{small_disk.directory} and rerun the same command ({kept}).")
  assert not index_dir.exists() and not list(small_disk.directory.glob(".index.*"))
  assert not list(partial.rglob(".*.tmp"))  # no half-written file under any name
  # With nothing embedded the folder goes too; else the chunks are kept.
  assert partial.exists() == (point != "manifest")
  before = tree_hashes(partial) if partial.exists() else {}
  small_disk.grow()
  embedded = _count_embedded(monkeypatch)
  assert command(*_index_args(corpus, bi_encoder, index_dir)) == 0
  assert embedded == {"manifest": [16, 16, 8], "chunk": [16, 8]}.get(point, [])
  assert tree_hashes(index_dir) == tree_hashes(built_dir)  # bit for bit the uninterrupted index
  assert not partial.exists() and (before or point == "manifest")  # the kept chunks were used, then removed


# Builds in a child that kills itself with SIGKILL once index.faiss is written under the temporary name.
_KILLED_IN_SAVE = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from jbert.search import build, faiss_file
real = faiss_file.write
def write(*args):
  out = real(*args)
  os.kill(os.getpid(), signal.SIGKILL)
faiss_file.write = write
build.build_index({corpus!r}, {model!r}, {index!r}, options=build.BuildOptions(text_column="body", id_column="doc",
                  chunk_size=16))
"""


def test_a_kill_during_the_final_save_leaves_nothing_after_the_next_start(tmp_path, built_dir, bi_encoder, corpus,
                                                                          monkeypatch):
  index_dir = tmp_path / "index"
  child = subprocess.Popen([sys.executable, "-c", _KILLED_IN_SAVE.format(repo=str(REPO), corpus=str(corpus),
                                                                        model=str(bi_encoder), index=str(index_dir))],
                           stderr=subprocess.PIPE, text=True)
  _, err = child.communicate(timeout=300)
  assert child.returncode == -9, err
  leftover = tmp_path / f".index.{child.pid}.tmp"
  assert sorted(os.listdir(leftover)) == ["index.faiss"] and not index_dir.exists()
  live = tmp_path / f".index.{os.getppid()}.tmp"  # a live process' save in progress: not ours to remove
  live.mkdir()
  embedded = _count_embedded(monkeypatch)
  build_index(str(corpus), str(bi_encoder), str(index_dir), options=OPTIONS)
  assert embedded == []  # every chunk was complete
  assert tree_hashes(index_dir) == tree_hashes(built_dir)
  assert sorted(os.listdir(tmp_path)) == [live.name, "index"]


def test_an_orphan_partial_beside_a_finished_index_is_removed_by_the_next_start(tmp_path, built_dir, bi_encoder,
                                                                                 corpus, capsys, monkeypatch):
  index_dir = tmp_path / "index"
  shutil.copytree(built_dir, index_dir)
  # A build killed between the rename of its index and the removal of its folder.
  partial = tmp_path / "index.partial"
  (partial / "chunks").mkdir(parents=True)
  (partial / "chunks" / "000000.npy").write_bytes(b"\x93NUMPY")
  (partial / ".lock").touch()
  stale = tmp_path / f".index.{dead_pid()}.tmp"
  stale.mkdir()
  before = tree_hashes(index_dir)
  _no_model_load(monkeypatch)
  with open(partial / ".lock", encoding="utf-8") as held:  # while a live builder holds it, it stays
    fcntl.flock(held, fcntl.LOCK_EX)
    assert command(*_index_args(corpus, bi_encoder, index_dir)) == 2
    assert partial.exists()
  message = (f"jbert.search: --index={index_dir} already exists; choose another path, or remove it to build it "
             "again.")
  assert one_line(capsys) == message
  assert command(*_index_args(corpus, bi_encoder, index_dir)) == 2
  assert one_line(capsys) == message
  assert sorted(os.listdir(tmp_path)) == ["index"] and tree_hashes(index_dir) == before


def test_a_second_builder_that_loses_the_race_embeds_nothing_and_leaves_nothing(tmp_path, built_dir, bi_encoder,
                                                                                 corpus, monkeypatch):
  index_dir = tmp_path / "index"
  real_scan = build_lib.scan

  def scan_then_the_other_builder_finishes(*args):
    count = real_scan(*args)
    shutil.copytree(built_dir, index_dir)
    return count

  monkeypatch.setattr(build_lib, "scan", scan_then_the_other_builder_finishes)
  _no_model_load(monkeypatch)
  with pytest.raises(ValueError, match=rf"^--index={index_dir} already exists"):
    build_index(str(corpus), str(bi_encoder), str(index_dir), options=OPTIONS)
  assert sorted(os.listdir(tmp_path)) == ["index"]
  assert tree_hashes(index_dir) == tree_hashes(built_dir)


class _Payload:
  """Unpickling it creates the file `MARKER`."""
  MARKER = ""

  def __reduce__(self):
    return (open, (self.MARKER, "w"))


@pytest.mark.parametrize("damage", ["junk and a pickled array", "cut short"])
def test_a_damaged_chunk_is_named_recomputed_and_the_index_is_the_uninterrupted_one(
    damage, tmp_path, built_dir, bi_encoder, corpus, caplog, monkeypatch):
  """A junk chunk gave numpy's "This file contains pickled (object) data. If you trust the file..." and stopped
  the build; the rerun now names each damaged chunk, embeds just those again and keeps the good ones."""
  index_dir, partial = tmp_path / "index", tmp_path / "index.partial"
  interrupted_build(index_dir, corpus, bi_encoder, chunks=2)
  chunks = partial / "chunks"
  if damage == "cut short":
    data = (chunks / "000000.npy").read_bytes()
    (chunks / "000000.npy").write_bytes(data[:-100])
    reasons = [f"{chunks}/000000.npy is damaged: it is cut short (2,076 of 2,176 bytes); recomputing it "
               "(documents 1 to 16)."]
  else:
    (chunks / "000000.npy").write_bytes(b"\x80\x04junk that is no array" * 20)
    _Payload.MARKER = str(tmp_path / "unpickled")
    payload = np.empty((16, 32), dtype=object)
    payload[0, 0] = _Payload()
    np.save(chunks / "000001.npy", payload, allow_pickle=True)
    reasons = [f"{chunks}/000000.npy is damaged: it is not a .npy file (the magic string is not correct; expected "
               "b'\\x93NUMPY', got b'\\x80\\x04junk'); recomputing it (documents 1 to 16).",
               f"{chunks}/000001.npy is damaged: it holds pickled Python objects, not float32 vectors; recomputing it "
               "(documents 17 to 32)."]
  embedded = _count_embedded(monkeypatch)
  with caplog.at_level("WARNING", logger="jbert"):
    assert command(*_index_args(corpus, bi_encoder, index_dir)) == 0  # the command the user reruns
  assert [r.getMessage() for r in caplog.records if "is damaged" in r.getMessage()] == reasons
  assert embedded == ([16, 8] if damage == "cut short" else [16, 16, 8])  # chunk 1, intact, was kept
  assert tree_hashes(index_dir) == tree_hashes(built_dir)  # bit for bit the uninterrupted index
  assert not partial.exists() and not (tmp_path / "unpickled").exists()


def _hostile_models(root: pathlib.Path, bi_encoder: pathlib.Path) -> list[tuple[pathlib.Path, str]]:
  """Model folders refused by name (each file a folder supplies is read as a regular file up to its size; the
  config is checked against the weights): (folder, the start of the refusal)."""
  zero = shutil.copytree(bi_encoder, root / "zero")
  (zero / "tokenizer.json").unlink()
  (zero / "tokenizer.json").symlink_to("/dev/zero")
  fifo = shutil.copytree(bi_encoder, root / "fifo")
  (fifo / "modules.json").unlink()
  os.mkfifo(fifo / "modules.json")
  layers = shutil.copytree(bi_encoder, root / "layers")
  config = json.loads((layers / "config.json").read_text())
  (layers / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1_000_000}))
  return [(zero, f"{zero}/tokenizer.json is a character device (a link to /dev/zero), not a regular file"),
          (fifo, f"{fifo}/modules.json is a FIFO (named pipe), not a regular file"),
          (layers, f"{layers}/config.json describes a BERT of 8,544,005,472 values")]


@pytest.fixture
def alarm():
  """Fails a test that blocks (a FIFO opened for reading waits for a writer) instead of hanging the suite."""

  def expire(signum, frame):
    raise TimeoutError("blocked on a file of the model folder")

  previous = signal.signal(signal.SIGALRM, expire)
  signal.alarm(120)
  yield
  signal.alarm(0)
  signal.signal(signal.SIGALRM, previous)


def test_a_refused_model_leaves_no_partial_and_keeps_an_earlier_runs_chunks(tmp_path, built_dir, bi_encoder,
                                                                            corpus, capsys, alarm):
  """Each refusal left an empty DIR.partial/ with its .lock."""
  models = tmp_path / "models"
  models.mkdir()
  out = tmp_path / "out"
  out.mkdir()
  index_dir, partial = out / "index", out / "index.partial"
  for model, message in _hostile_models(models, bi_encoder):
    assert command(*_index_args(corpus, model, index_dir)) == 2, model
    assert one_line(capsys).startswith(f"jbert.search: {message}")
    assert os.listdir(out) == []
  # What a run killed before its first chunk left (its lock and the manifest of other settings): a refused run
  # removes it too, and a good one builds over it (nothing was embedded with those settings).
  for good in (False, True):
    (partial / "chunks").mkdir(parents=True)
    (partial / ".lock").touch()
    (partial / "manifest.json").write_text(json.dumps({"chunk_size": 99, "model": {}}))
    assert command(*_index_args(corpus, bi_encoder if good else model, index_dir)) == (0 if good else 2)
    if good:
      assert tree_hashes(index_dir) == tree_hashes(built_dir) and os.listdir(out) == ["index"]
      shutil.rmtree(index_dir)
      capsys.readouterr()
    else:
      assert one_line(capsys).startswith(f"jbert.search: {message}") and os.listdir(out) == []
  # An earlier run's chunk is real work: a refused model leaves it as it was, and the same command finishes.
  interrupted_build(index_dir, corpus, bi_encoder)
  before = tree_hashes(partial)
  assert command(*_index_args(corpus, model, index_dir)) == 2
  assert one_line(capsys).startswith(f"jbert.search: {message}") and tree_hashes(partial) == before
  assert command(*_index_args(corpus, bi_encoder, index_dir)) == 0
  assert tree_hashes(index_dir) == tree_hashes(built_dir) and os.listdir(out) == ["index"]


def test_ctrl_c_before_the_first_chunk_leaves_nothing(tmp_path, bi_encoder, corpus, capsys, monkeypatch):
  def interrupt(self, texts, **kw):
    raise KeyboardInterrupt

  monkeypatch.setattr(build_lib.Embedder, "__call__", interrupt)
  assert command(*_index_args(corpus, bi_encoder, tmp_path / "index")) == 130
  assert capsys.readouterr().err.splitlines()[-1] == ("jbert.search: interrupted before anything was embedded; "
                                                      "nothing was written.")
  assert os.listdir(tmp_path) == []
