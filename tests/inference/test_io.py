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
