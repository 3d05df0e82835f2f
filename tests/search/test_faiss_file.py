"""index.faiss is checked against index.json and its own length before faiss reads it: a crafted size field that
would make faiss allocate a gigabyte (or the 16 GB of the report) is refused by name, even with index.json's
checksums forged to match, and reading stays within a few megabytes of peak memory; intact files of every kind
pass and load."""
import json
import re
import struct

import numpy as np
import pytest

from jbert.errors import UserError
from jbert.search import Index, IndexSettings
from jbert.search import stored

COUNT, DIM = 200, 16
HEADER = 4 + 4 + 8 + 8 + 8 + 1 + 4  # fourcc, d, ntotal, two dummies, is_trained, metric


def _saved(tmp_path, kind: str):
  rng = np.random.default_rng(0)
  x = rng.standard_normal((COUNT, DIM)).astype(np.float32)
  settings = IndexSettings(kind, nlist=4 if kind == "ivf" else None, hnsw_m=4)
  folder = tmp_path / kind
  Index.build(x / np.linalg.norm(x, axis=1, keepdims=True), settings=settings).save(str(folder))
  return folder


def _u64(data: bytes, at: int) -> int:
  return struct.unpack_from("<Q", data, at)[0]


def _size_field(data: bytes, kind: str) -> int:
  """The offset of the size field that the crafted files change: the flat vectors, the HNSW neighbour list, the
  first IVF list (faiss' own layout, walked here independently of jbert's reader)."""
  if kind == "flat":
    return HEADER
  if kind == "hnsw":
    at = HEADER
    for item in (8, 4, 4, 8):  # assign_probas (double), cum_nneighbor_per_level, levels (int), offsets (size_t)
      at += 8 + item * _u64(data, at)
    return at  # neighbors
  at = HEADER + 8 + 8  # nlist, nprobe
  at += HEADER + 8 + 4 * _u64(data, at + HEADER)  # the quantizer: a flat index of the centroids
  at += 1 + 8 + 8 * _u64(data, at + 1)  # the direct map: its type, then an (empty) array
  assert data[at:at + 4] == b"ilar" and data[at + 20:at + 24] == b"full"
  return at + 4 + 8 + 8 + 4 + 8  # fourcc, nlist, code_size, list type, the sizes' count: the first list's size


def _forge_checksums(folder) -> None:
  """index.json rewritten to agree with the crafted index.faiss, as someone crafting both would."""
  meta = json.loads((folder / "index.json").read_text())
  meta["files"]["index.faiss"] = stored.file_record(folder / "index.faiss")
  meta["checksum"] = stored.meta_checksum(meta)
  (folder / "index.json").write_text(json.dumps(meta))


def _peak_mb() -> float:
  with open("/proc/self/status", encoding="ascii") as f:
    return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) / 1024


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_a_crafted_size_is_refused_before_faiss_allocates_it(tmp_path, kind):
  folder = _saved(tmp_path, kind)
  assert Index.load(str(folder)).size == COUNT  # intact: it loads
  path = folder / "index.faiss"
  data = bytearray(path.read_bytes())
  at = _size_field(data, kind)
  claim = 2 ** 24 if kind == "ivf" else 2 ** 28  # 1 GiB: an IVF list of 64-byte codes, or 4-byte values
  struct.pack_into("<Q", data, at, claim)
  path.write_bytes(bytes(data))
  _forge_checksums(folder)
  with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
    f.write("5")  # the peak resident memory starts again from now
  start = _peak_mb()
  with pytest.raises(UserError) as refused:
    Index.load(str(folder))
  assert _peak_mb() - start < 32  # the gigabyte was never allocated
  assert re.fullmatch(rf"{re.escape(str(path))} is damaged: .* \(\d+ bytes\) beyond the end of the file "
                      rf"\({len(data)} bytes\); rebuild the index with `python -m jbert.search index` \(or restore "
                      r"the folder from a copy\)\.", str(refused.value)), refused.value


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_a_file_of_another_count_or_dimension_than_index_json_is_refused(tmp_path, kind):
  folder = _saved(tmp_path, kind)
  meta = json.loads((folder / "index.json").read_text())
  for key, value, what in (("count", COUNT - 1, f"{COUNT} vectors where index.json says {COUNT - 1}"),
                           ("dim", DIM * 2, f"{DIM}-dimensional vectors where index.json says {DIM * 2}")):
    forged = {**meta, key: value}
    forged["checksum"] = stored.meta_checksum(forged)
    (folder / "index.json").write_text(json.dumps(forged))
    with pytest.raises(UserError, match=rf"^{folder}/index.faiss does not match {folder}/index.json: it holds "
                                        rf"{what}; rebuild the index"):
      Index.load(str(folder))
