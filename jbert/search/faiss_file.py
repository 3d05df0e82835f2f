"""index.faiss: written and read through Python file objects (storage errors are OSErrors naming the file, and
a CRC-32 of the bytes is taken on the way), and checked against index.json before faiss reads it.

faiss sizes each array from a count stored in front of it and allocates it before reading it (up to 1 TB), so
a file crafted or damaged in one size field makes a query allocate gigabytes. `check` walks the layout of the
three kinds jbert writes (`IndexFlatIP` "IxFI", `IndexHNSWFlat` "IHNf", `IndexIVFFlat` "IwFl" with its
`ArrayInvertedLists` "ilar"), reading only headers and counts, and refuses any count that reaches past the end of
the file or disagrees with the index's recorded dimension and document count; the file must end where the
layout does. What faiss then allocates is what the file holds. The layout is faiss' `index_write.cpp`, unchanged
since faiss 1.5 for these kinds.
"""
from __future__ import annotations

import os
import struct
import zlib
from typing import BinaryIO

from jbert.errors import UserError

FOURCC = {"flat": b"IxFI", "hnsw": b"IHNf", "ivf": b"IwFl"}
_INNER_PRODUCT = 0  # faiss.METRIC_INNER_PRODUCT
_BLOCK = 1 << 20
REBUILD = "rebuild the index with `python -m jbert.search index` (or restore the folder from a copy)."


def damaged(path: str, what: str) -> UserError:
  return UserError(f"{path} is damaged: {what}; {REBUILD}")


class Crc32:
  """The CRC-32 of bytes fed in pieces, as 8 hex digits: it finds damage (a cut, a flipped bit, swapped lines)
  at about 1.4 GB/s here, several times the speed of sha256, and nobody forging a file is kept out by either:
  index.json can be rewritten to match."""

  def __init__(self):
    self.value = 0

  def update(self, data: bytes) -> None:
    self.value = zlib.crc32(data, self.value)

  def hexdigest(self) -> str:
    return f"{self.value:08x}"


def write(faiss, index, path: str) -> tuple[int, str]:
  """Writes `index` to `path` (flushed to the disk); returns its size and CRC-32. A full or read-only disk is
  the OSError of the write, with `path` as its filename."""
  digest, size = Crc32(), 0

  def put(data: bytes) -> int:
    nonlocal size
    f.write(data)
    digest.update(data)
    size += len(data)
    return len(data)

  try:
    with open(path, "wb") as f:
      faiss.write_index(index, faiss.PyCallbackIOWriter(put, _BLOCK))
      f.flush()
      os.fsync(f.fileno())
  except OSError as e:  # raised in `put` (through faiss), by the flush or by open: the name is ours to give
    raise OSError(e.errno, e.strerror, path) from None
  return size, digest.hexdigest()


def read(faiss, path: str):
  """(the index, CRC-32 of the bytes faiss read); call `check` first."""
  digest = Crc32()
  with open(path, "rb") as f:

    def take(n: int) -> bytes:
      data = f.read(n)
      digest.update(data)
      return data

    try:
      index = faiss.read_index(faiss.PyCallbackIOReader(take, _BLOCK))
    except RuntimeError as e:  # a check of faiss' own that the layout passed
      reason = str(e).strip().splitlines()[-1].split("failed: ")[-1]
      raise damaged(path, f"faiss cannot read it ({reason})") from None
    if f.read(1):
      raise damaged(path, "faiss stopped before its end")
  return index, digest.hexdigest()


class _Layout:
  """Reads the fixed-size fields of a faiss file and skips its arrays, each checked against the file's size."""

  def __init__(self, f: BinaryIO, path: str, size: int):
    self.f, self.path, self.size = f, path, size

  @property
  def at(self) -> int:
    return self.f.tell()

  def take(self, n: int, what: str) -> bytes:
    data = self.f.read(n)
    if len(data) != n:
      raise damaged(self.path, f"it ends at byte {self.size}, inside {what} (cut short?)")
    return data

  def int32(self, what: str) -> int:
    return struct.unpack("<i", self.take(4, what))[0]

  def uint64(self, what: str) -> int:
    return struct.unpack("<Q", self.take(8, what))[0]

  def fourcc(self, what: str) -> bytes:
    return self.take(4, what)

  def array(self, item_bytes: int, what: str, expected: int | None = None, *, keep: bool = False):
    """An array stored as its length (uint64) and its items: skipped (or returned as bytes with `keep`)."""
    n = self.uint64(f"the length of {what}")
    end = self.at + n * item_bytes
    if end > self.size:
      raise damaged(self.path, f"{what} claim {n:,} entries ({n * item_bytes} bytes) beyond the end of the file "
                               f"({self.size} bytes)")
    if expected is not None and n != expected:
      raise damaged(self.path, f"{what} has {n:,} entries where {expected:,} belong")
    if keep:
      return self.take(n * item_bytes, what)
    self.f.seek(end)
    return n

  def header(self, kind: str, what: str) -> tuple[int, int]:
    """(d, ntotal) of an index header of `kind`, refused unless an inner-product index of that kind."""
    magic = self.fourcc(f"the header of {what}")
    if magic != FOURCC[kind]:
      raise damaged(self.path, f"{what} starts with {magic!r} where a faiss {kind} index has {FOURCC[kind]!r}")
    d, ntotal = self.int32(f"the header of {what}"), struct.unpack("<q", self.take(8, f"the header of {what}"))[0]
    self.take(8 + 8 + 1, f"the header of {what}")  # two unused fields, is_trained
    if self.int32(f"the header of {what}") != _INNER_PRODUCT:
      raise damaged(self.path, f"{what} is not an inner-product index")
    return d, ntotal


def check(path: str, meta_path: str, kind: str, dim: int, count: int) -> None:
  """Refuses `path` unless it is a faiss `kind` index of `count` `dim`-dimensional vectors, every array within
  the file and the file no longer than its layout. Reads headers and counts only."""
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    layout = _Layout(f, path, size)
    d, ntotal = layout.header(kind, "the index")
    if (d, ntotal) != (dim, count):
      what = (f"{ntotal} vectors where {os.path.basename(meta_path)} says {count}" if ntotal != count else
              f"{d}-dimensional vectors where {os.path.basename(meta_path)} says {dim}")
      raise UserError(f"{path} does not match {meta_path}: it holds {what}; {REBUILD}")
    if kind == "flat":
      _flat(layout, dim, count, "the vectors")
    elif kind == "hnsw":
      _hnsw(layout, dim, count)
    else:
      _ivf(layout, dim, count)
    if layout.at != size:
      raise damaged(path, f"{size - layout.at} bytes follow the end of the index")


def _flat(layout: _Layout, dim: int, count: int, what: str) -> None:
  layout.array(4, what, count * dim)  # stored as 4-byte words: dim per vector


def _hnsw(layout: _Layout, dim: int, count: int) -> None:
  levels = layout.array(8, "the level probabilities")
  layout.array(4, "the neighbours per level", levels + 1)
  layout.array(4, "the node levels", count)
  layout.array(8, "the neighbour offsets", count + 1)
  end = layout.at
  layout.f.seek(end - 8)
  neighbours = layout.uint64("the last neighbour offset")  # where node count's neighbours end: their total
  layout.f.seek(end)
  layout.array(4, "the neighbour lists", neighbours)
  layout.take(5 * 4, "the graph's entry point and search settings")
  d, ntotal = layout.header("flat", "the HNSW graph's storage")
  if (d, ntotal) != (dim, count):
    raise damaged(layout.path, f"the HNSW storage holds {ntotal} {d}-dimensional vectors, not {count} of {dim}")
  _flat(layout, dim, count, "the HNSW graph's vectors")


def _ivf(layout: _Layout, dim: int, count: int) -> None:
  nlist = layout.uint64("the number of cells")
  layout.uint64("nprobe")
  if not 1 <= nlist <= layout.size // (4 * dim):  # each cell's centroid is in the file
    raise damaged(layout.path, f"it claims {nlist:,} cells, more than the file can hold")
  d, ntotal = layout.header("flat", "the cell centroids")
  if (d, ntotal) != (dim, nlist):
    raise damaged(layout.path, f"the centroids are {ntotal} {d}-dimensional vectors, not {nlist} of {dim}")
  _flat(layout, dim, nlist, "the centroids")
  if layout.take(1, "the direct map")[0] != 0:
    raise damaged(layout.path, "its direct map is not the empty one jbert writes")
  layout.array(8, "the direct map", 0)
  if layout.fourcc("the inverted lists") != b"ilar":
    raise damaged(layout.path, "its inverted lists are not faiss' array lists")
  if layout.uint64("the number of lists") != nlist or layout.uint64("the code size") != 4 * dim:
    raise damaged(layout.path, f"its inverted lists are not {nlist} lists of {dim}-dimensional vectors")
  sizes = [0] * nlist
  kind = layout.fourcc("the list sizes")
  if kind == b"full":
    sizes = list(struct.unpack(f"<{nlist}Q", layout.array(8, "the list sizes", nlist, keep=True)))
  elif kind == b"sprs":  # (cell, size) pairs of the non-empty lists
    pairs = layout.array(8, "the list sizes", keep=True)
    values = struct.unpack(f"<{len(pairs) // 8}Q", pairs)
    if len(values) % 2 or any(cell >= nlist for cell in values[0::2]):
      raise damaged(layout.path, f"its list sizes are not (cell, size) pairs of {nlist} cells")
    for cell, n in zip(values[0::2], values[1::2]):
      sizes[cell] = n
  else:
    raise damaged(layout.path, f"its list sizes are stored as {kind!r}")
  total = sum(sizes)
  end = layout.at + total * (4 * dim + 8)  # each list: its vectors, then their ids (int64)
  if end > layout.size:
    raise damaged(layout.path, f"the lists claim {total:,} entries ({end - layout.at} bytes) beyond the end of the "
                               f"file ({layout.size} bytes)")
  if total != count:
    raise damaged(layout.path, f"its lists hold {total:,} vectors where {count} belong")
  layout.f.seek(end)
