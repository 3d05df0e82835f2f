"""Training documents from a prepared corpus (`python -m jbert.data prepare`): `data.source=prepared`,
`data.prepared=DIR`.

Opening one reads the manifest alone: grain's `ArrayRecordDataSource` is given each shard with its document
count (`path[0:n]`), so no shard is opened until a document of it is read, and the time to the first batch does
not grow with the corpus. Each data shard then reads only its own documents, by random access (ArrayRecord reads
local disk and gs:// itself). A document is read as the sentences prepare split it into, never split again.

Opening one also lists the directory: a shard that is missing or not the size its manifest records (a
truncated copy, another corpus's shards under the same names) is refused there, before anything is read; a
bucket's listing compares the checksums as well. On local disk each shard's CRC32C is checked on its first read
in a process (`jbert.data.shards`), and a read ArrayRecord cannot decode is one line naming the shard. Every one
of these says to rerun prepare, which writes again only what is damaged.

The held-out documents the manifest names form the eval split; the train split is every other document, indexed
without a table: train document i is corpus document i + (held-out documents at or before it).
"""
from __future__ import annotations

import functools
import os

import numpy as np

from jbert import errors
from jbert.data import manifest as manifest_lib
from jbert.data import paths
from jbert.data import shards as shards_lib
from jbert.data import sources

SPLITS = ("train", "eval")
_VERIFIED: set[tuple[str, int, int]] = set()  # local shards whose CRC32C this process checked: (path, size, mtime)


@functools.lru_cache(maxsize=8)
def _manifest(directory: str) -> dict:
  return manifest_lib.read(directory)


def check_directory(directory: str | None) -> str:
  if not directory:
    raise ValueError("data.source='prepared' needs data.prepared: prepare the corpus once with "
                     f"`{manifest_lib.PREPARE}`, then pass --config.data.prepared=DIR.")
  if paths.is_url(directory) and not directory.startswith("gs://"):
    raise ValueError(f"data.prepared={directory}: ArrayRecord reads prepared shards from local disk or gs:// only; "
                     "copy the directory to one of those.")
  return directory.rstrip("/")


def vocab_of(directory: str) -> str | None:
  """The path of the vocabulary the corpus carries, or None."""
  directory = check_directory(directory)
  name = _manifest(directory).get("vocab")
  return paths.join(directory, name) if name else None


class PreparedDocuments(sources.DocumentSource):
  """One split of a prepared corpus: `len(src)` documents, `src[i]` its sentences."""

  def __init__(self, directory: str, split: str = "train"):
    if split not in SPLITS:
      raise ValueError(f"split={split!r}; expected one of {SPLITS}.")
    self.directory = check_directory(directory)
    manifest = _manifest(self.directory)
    super().__init__(manifest["settings"]["max_line_chars"])
    self.split, self.manifest = split, manifest
    self._held_out = np.asarray(manifest["held_out"]["documents"], np.int64)
    self._total = int(manifest["documents"])
    # Held-out document k, less the k held out before it: where it would sit among the train documents.
    self._gaps = self._held_out - np.arange(len(self._held_out))
    self._records = [s for s in manifest["shards"] if s["documents"]]
    self._shards = [f"{paths.join(self.directory, s['name'])}[0:{s['documents']}]" for s in self._records]
    self._ends = np.cumsum([s["documents"] for s in self._records])
    self._reader = None  # opened on first read: grain workers get a source without one
    found = shards_lib.problems(self.directory, manifest["shards"], read=False)
    if found:
      raise ValueError(damaged(self.directory, found))

  def __len__(self) -> int:
    return len(self._held_out) if self.split == "eval" else self._total - len(self._held_out)

  @property
  def origin(self) -> str:
    return f"prepared corpus {self.directory} ({self.split} split)"

  def corpus_index(self, indices: np.ndarray) -> np.ndarray:
    """The corpus-wide index of documents `indices` of this split."""
    indices = np.asarray(indices, np.int64)
    if self.split == "eval":
      return self._held_out[indices]
    return indices + np.searchsorted(self._gaps, indices, side="right")

  def _source(self):
    if self._reader is None:
      import grain  # pylint: disable=g-import-not-at-top
      self._reader = grain.sources.ArrayRecordDataSource(self._shards)
    return self._reader

  def __getstate__(self):
    state = self.__dict__.copy()
    state["_reader"] = None
    return state

  def __getitem__(self, index: int) -> list[str]:
    return self.get_many([index])[0]

  def get_many(self, indices) -> list[list[str]]:
    """The sentences of several documents, read in parallel across shards (one request each on gs://)."""
    keys = [int(i) for i in self.corpus_index(np.asarray(indices, np.int64).reshape(-1))]
    touched = sorted(set(np.searchsorted(self._ends, keys, side="right").tolist()))
    self._verify(touched)
    try:
      records = self._source().__getitems__(keys)
    except RuntimeError as e:  # ArrayRecord/Riegeli: "Corrupted Riegeli/records file: ...", "open() failed: ..."
      names = [self._records[i]["name"] for i in touched]
      raise ValueError(damaged(self.directory, [f"reading {errors.listing(names, shown=3)} failed "
                                                f"({errors.shorten(str(e), 200)})"])) from e
    return [self.decode(r, f"{self.origin} document {k}").split("\n") for r, k in zip(records, keys)]

  def _verify(self, shards: list[int]) -> None:
    """Checks the CRC32C of each local shard of `shards` that this process has not read before."""
    if paths.is_url(self.directory):
      return  # the listing at open compared the store's own checksums
    for i in shards:
      record = self._records[i]
      path = paths.join(self.directory, record["name"])
      stat = os.stat(paths.local_path(path))
      key = (path, stat.st_size, stat.st_mtime_ns)
      if key in _VERIFIED:
        continue
      issue = shards_lib.problem(record["name"], record, (stat.st_size, None), shards_lib.crc32c(path))
      if issue:
        raise ValueError(damaged(self.directory, [issue]))
      _VERIFIED.add(key)


def damaged(directory: str, found: list[str]) -> str:
  """The one line for shards that are not what the manifest records: which, and what to run."""
  return (f"prepared corpus {directory} is damaged: {errors.listing(found, shown=4)}; rerun the `python -m "
          "jbert.data prepare` command that made it (the same --input, --output and settings): it writes again only "
          "the damaged or missing shards, and the manifest.")
