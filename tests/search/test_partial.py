"""jbert.search.partial's chunk files: a chunk as its build writes it reads back as the same vectors; every kind of
damage (junk bytes, cut short, bytes after the rows, another shape or dtype, a pickled object array, a NaN) is
named, and nothing in a chunk is ever unpickled."""
import os
import pathlib

import numpy as np
import pytest

from jbert.inference import io
from jbert.search import partial

ROWS, DIM = 5, 4


def _chunk(path: pathlib.Path, vectors: np.ndarray) -> pathlib.Path:
  with io.NpyWriter(str(path)) as out:  # as the build writes its chunks
    out.write(vectors)
  return path


class _Payload:
  """Unpickling it creates the file `MARKER`: a chunk must never be unpickled."""
  MARKER = ""

  def __reduce__(self):
    return (open, (self.MARKER, "w"))


def test_a_chunk_reads_back_as_written_and_is_counted(tmp_path):
  vectors = np.arange(ROWS * DIM, dtype=np.float32).reshape(ROWS, DIM) / 7
  (tmp_path / "chunks").mkdir()
  _chunk(tmp_path / "chunks" / "000000.npy", vectors)
  got = partial.read_chunk(str(tmp_path / "chunks" / "000000.npy"), ROWS, DIM, check_values=True)
  assert got.dtype == np.float32 and got.shape == (ROWS, DIM)
  np.testing.assert_array_equal(got, vectors)
  # Counted: files under their final names, wherever the gaps; a killed writer's hidden file is not one.
  _chunk(tmp_path / "chunks" / "000002.npy", vectors)
  (tmp_path / "chunks" / ".000001.npy.123.tmp").write_bytes(b"\x93NUMPY")
  assert partial.complete_chunks(str(tmp_path)) == 2
  assert partial.complete_chunks(str(tmp_path / "missing")) == 0


def _damaged(tmp_path: pathlib.Path, kind: str) -> pathlib.Path:
  path = tmp_path / "000000.npy"
  good = np.ones((ROWS, DIM), np.float32)
  if kind == "junk":  # what a chunk overwritten by another program holds
    path.write_bytes(b"PK\x03\x04 not a chunk at all " * 8)
  elif kind == "empty":
    path.write_bytes(b"")
  elif kind == "cut short":
    data = _chunk(path, good).read_bytes()
    path.write_bytes(data[:-5])
  elif kind == "cut in its header":
    data = _chunk(path, good).read_bytes()
    path.write_bytes(data[:40])
  elif kind == "trailing bytes":
    data = _chunk(path, good).read_bytes()
    path.write_bytes(data + b"\0" * 12)
  elif kind == "shape":
    np.save(path, np.ones((ROWS + 1, DIM), np.float32))
  elif kind == "dtype":
    np.save(path, np.ones((ROWS, DIM), np.float64))
  elif kind == "fortran":
    np.save(path, np.asfortranarray(np.ones((ROWS, DIM), np.float32)))
  elif kind == "pickle":
    _Payload.MARKER = str(tmp_path / "unpickled")
    payload = np.empty((ROWS, DIM), dtype=object)
    payload[0, 0] = _Payload()
    np.save(path, payload, allow_pickle=True)
  elif kind == "nan":
    bad = good.copy()
    bad[3, 1] = np.nan
    _chunk(path, bad)
  elif kind == "version":
    data = bytearray(_chunk(path, good).read_bytes())
    data[6] = 9
    path.write_bytes(bytes(data))
  return path


@pytest.mark.parametrize("kind, reason", [
    ("junk", r"it is not a \.npy file \(the magic string is not correct; expected b'\\x93NUMPY', got b'PK\\x03\\x04 "
             r"n'\)"),
    ("empty", r"it is not a \.npy file \(EOF: reading magic string, expected 8 bytes got 0\)"),
    ("cut short", r"it is cut short \(203 of 208 bytes\)"),
    ("cut in its header", r"it is not a \.npy file \(EOF: reading array header"),
    ("trailing bytes", r"12 bytes follow its vectors"),
    ("shape", r"it holds an array of shape \[6, 4\] where \[5, 4\] belongs"),
    ("dtype", r"it holds float64 values, not float32"),
    ("fortran", r"it holds float32 Fortran-ordered values, not float32"),
    ("pickle", r"it holds pickled Python objects, not float32 vectors"),
    ("nan", r"it holds values that are not finite numbers"),
    ("version", r"it is a \.npy file of version 9\.0, not 1\.0"),
])
def test_each_kind_of_damage_is_named_and_nothing_is_unpickled(tmp_path, kind, reason):
  path = _damaged(tmp_path, kind)
  with pytest.raises(partial.DamagedChunk, match=rf"^{reason}"):
    partial.read_chunk(str(path), ROWS, DIM, check_values=True)
  assert not os.path.exists(tmp_path / "unpickled")
  if kind == "nan":  # values are read only when asked: the build's final pass relies on the check at its start
    assert partial.read_chunk(str(path), ROWS, DIM).shape == (ROWS, DIM)
