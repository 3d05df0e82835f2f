"""Training outputs are replaced whole or not at all (`jbert.runtime.atomic`)."""
import os

import pytest

from jbert.runtime import atomic


def test_open_for_write_replaces_the_file_only_when_the_block_ends(tmp_path):
  path = tmp_path / "sub" / "results.json"
  with atomic.open_for_write(str(path), encoding="utf-8") as f:
    f.write("first")
  assert path.read_text() == "first"
  with pytest.raises(OSError, match="disk full"):
    with atomic.open_for_write(str(path), encoding="utf-8") as f:
      f.write("sec")
      raise OSError("disk full")
  assert path.read_text() == "first"
  assert sorted(os.listdir(path.parent)) == ["results.json"]


def test_folder_for_write_swaps_the_whole_folder_or_keeps_the_old_one(tmp_path):
  export = tmp_path / "export"
  with atomic.folder_for_write(str(export)) as folder:
    (tmp_path / folder / "config.json").write_text("v1")
  with pytest.raises(KeyboardInterrupt):
    with atomic.folder_for_write(str(export)) as folder:
      (tmp_path / folder / "config.json").write_text("v2")
      raise KeyboardInterrupt
  assert sorted(os.listdir(tmp_path)) == ["export"] and (export / "config.json").read_text() == "v1"
  with atomic.folder_for_write(str(export)) as folder:
    (tmp_path / folder / "weights").write_text("v3")
  assert sorted(os.listdir(tmp_path)) == ["export"] and sorted(os.listdir(export)) == ["weights"]


def test_a_write_that_fails_on_its_way_to_the_disk_keeps_the_old_file(tmp_path, monkeypatch):
  """The one atomic writer under every output: a full disk at the flush (here at fsync) keeps the earlier bytes
  and leaves no temporary file, for a streamed `AtomicFile`, `open_for_write` and metrics.jsonl's rewrite."""
  from jbert.runtime import metrics  # pylint: disable=import-outside-toplevel
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1}\n{"step": 2}\n')
  full = OSError(28, "No space left on device")
  monkeypatch.setattr(atomic.os, "fsync", lambda fd: (_ for _ in ()).throw(full))
  with pytest.raises(OSError, match="No space left"):
    with atomic.AtomicFile(str(path), "wb") as f:
      f.file.write(b"new")
  with pytest.raises(OSError, match="No space left"):
    with atomic.open_for_write(str(path)) as f:
      f.write("new")
  log = metrics._LocalLog(str(path))  # pylint: disable=protected-access
  with pytest.raises(OSError, match="No space left"):
    log.rewrite(['{"step": 1}'])
  assert path.read_text() == '{"step": 1}\n{"step": 2}\n' and os.listdir(tmp_path) == ["metrics.jsonl"]
  monkeypatch.undo()
  log.rewrite(['{"step": 1}'])
  log.append('{"step": 2}')
  log.close()
  assert path.read_text() == '{"step": 1}\n{"step": 2}\n' and os.listdir(tmp_path) == ["metrics.jsonl"]
