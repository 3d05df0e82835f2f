"""The atomic .npy / JSONL writers of the inference commands (the readers are tested in tests/data/test_files.py)."""
import json

import numpy as np
import pytest

from jbert.inference import io


def test_npy_writer_streams_blocks(tmp_path):
  path = tmp_path / "out.npy"
  blocks = [np.random.default_rng(i).standard_normal((n, 7)).astype(np.float32) for i, n in enumerate((3, 0, 5))]
  with io.NpyWriter(str(path)) as out:
    for block in blocks:
      out.write(block)
    assert not path.exists()  # Only the temporary file exists until the writer closes.
  loaded = np.load(path)
  assert loaded.dtype == np.float32 and loaded.shape == (8, 7)
  np.testing.assert_array_equal(loaded, np.concatenate(blocks))
  assert list(tmp_path.iterdir()) == [path]


def test_interrupted_writes_leave_no_partial_file(tmp_path):
  path = tmp_path / "out.npy"
  np.save(path, np.ones((2, 2), np.float32))
  with pytest.raises(KeyboardInterrupt):
    with io.NpyWriter(str(path)) as out:
      out.write(np.zeros((4, 2), np.float32))
      raise KeyboardInterrupt
  np.testing.assert_array_equal(np.load(path), np.ones((2, 2)))  # The earlier file is untouched.
  assert [p.name for p in tmp_path.iterdir()] == ["out.npy"]
  jsonl = tmp_path / "out.jsonl"
  with io.JsonlWriter(str(jsonl)) as out:
    out.write({"index": 0, "text": "é"})
  assert [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()] == [{"index": 0, "text": "é"}]
  with pytest.raises(FileNotFoundError, match="Output folder .* does not exist"):
    io.NpyWriter(str(tmp_path / "no" / "out.npy"))


def test_unwritable_outputs_are_refused_before_any_work(tmp_path, monkeypatch):
  (tmp_path / "file").write_text("x")
  (tmp_path / "folder").mkdir()
  cases = {
      tmp_path / "file" / "out.npy": f"--output={tmp_path}/file/out.npy cannot be written: {tmp_path}/file is a "
                                     "file, not a folder; choose another path.",
      tmp_path / "no" / "deeper" / "out.npy": f"The folder of --output={tmp_path}/no/deeper/out.npy does not exist; "
                                              f"create {tmp_path}/no/deeper first.",
      tmp_path / "folder": f"--output={tmp_path}/folder is a directory; name a file in it.",
  }
  for path, message in cases.items():
    with pytest.raises(io.OutputError) as error:
      io.check_writable(str(path))
    assert str(error.value) == message
  # Tests run as root, which writes anywhere: a read-only folder is what os.access answers for it.
  monkeypatch.setattr(io.os, "access", lambda path, mode: path != str(tmp_path / "folder"))
  with pytest.raises(io.OutputError, match=rf"^--output={tmp_path}/folder/out.jsonl cannot be written: "
                                           rf"{tmp_path}/folder is read-only for this user; choose another folder.$"):
    io.check_writable(str(tmp_path / "folder" / "out.jsonl"))
  io.check_writable(str(tmp_path / "out.npy"))
  assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]  # nothing created by the checks
  assert list((tmp_path / "folder").iterdir()) == []


class _FullDisk:
  """A file whose writes fail with ENOSPC once `room` bytes are written, as on a full disk."""

  def __init__(self, real, room):
    self.real, self.room = real, room

  def write(self, data):
    if len(data) > self.room:
      raise OSError(28, "No space left on device")
    self.room -= len(data)
    return self.real.write(data)

  def __getattr__(self, name):
    return getattr(self.real, name)


def _fail_to_flush(self):
  self.real.close()
  raise OSError(28, "No space left on device")


def _fail_to_seek(self, offset):
  raise OSError(28, "No space left on device")


# At the header, among the rows, at the final flush, at the seek back to the header (which flushes the rows).
@pytest.mark.parametrize("room", [0, 200, 10_000, "seek"])
def test_a_full_disk_names_the_output_and_leaves_no_partial_file(tmp_path, monkeypatch, room):
  path = tmp_path / "out.npy"
  np.save(path, np.arange(3, dtype=np.float32))
  before = path.read_bytes()
  real_open = open
  # The writers open their temporary file through `jbert.runtime.atomic`, the one atomic writer.
  monkeypatch.setattr(io.atomic, "open", lambda p, mode, **kwargs: _FullDisk(real_open(p, mode, **kwargs),
                                                                          10_000 if room == "seek" else room),
                      raising=False)
  if room == 10_000:  # the rows fit the buffer: the failure comes when the file is flushed on close
    monkeypatch.setattr(_FullDisk, "close", _fail_to_flush, raising=False)
  if room == "seek":
    monkeypatch.setattr(_FullDisk, "seek", _fail_to_seek, raising=False)
  with pytest.raises(io.OutputError) as error:
    with io.NpyWriter(str(path)) as out:
      for _ in range(4):
        out.write(np.ones((10, 8), np.float32))
  assert str(error.value) == (f"Writing {path} failed: No space left on device; free space or choose another path "
                              "(nothing was written there).")
  assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["out.npy"]


def test_jsonl_is_always_standard_json(tmp_path):
  with pytest.raises(ValueError, match="Out of range float values are not JSON compliant"):
    with io.JsonlWriter(str(tmp_path / "out.jsonl")) as out:
      out.write({"score": float("nan")})
  assert list(tmp_path.iterdir()) == []
