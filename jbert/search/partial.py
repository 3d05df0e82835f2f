"""INDEX_DIR.partial: the folder of an unfinished build (its lock, manifest and chunks), and what dead builders
left beside the index.

One builder at a time holds an exclusive `flock` on `INDEX_DIR.partial/.lock`; the kernel drops it however the
process ends. The file goes with the folder when a build ends, so a builder that opened it just before checks
that the file it locked is still the one of that name (else it opens the new one). Holding the lock, no other
builder of this index is alive, so the holder removes what killed ones left: hidden temporary files in the folder
(a chunk or the manifest cut short), `.INDEX_DIR.PID.tmp` beside the index (a final save cut short) when its
process is gone, and the whole folder when the index already exists (a build killed between renaming the index
into place and removing its folder, or a second builder that lost the race).

A chunk under its final name was written whole, yet may be damaged since (junk bytes, cut short, another array
put in its place): `read_chunk` checks its header, size and values without unpickling anything, and the build
embeds such a chunk again.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from typing import Any

import numpy as np

from jbert.errors import UserError
from jbert.runtime import atomic
from jbert.runtime import processes

MANIFEST, CHUNKS, LOCK = "manifest.json", "chunks", ".lock"
_CHUNK_NAME = re.compile(r"\d{6}\.npy")


class BuildFolder:
  """The locked folder of one build of `index_dir`: `take` it, read or write its manifest and chunks, then
  `remove` it (the index is saved) or `close` it (the build stopped: the folder stays for the rerun)."""

  def __init__(self, index_dir: str, fd: int):
    self.index_dir, self.path, self._fd = index_dir, f"{index_dir}.partial", fd

  @classmethod
  def take(cls, index_dir: str) -> "BuildFolder":
    """Creates and locks INDEX_DIR.partial; a live builder holding it is refused. Storage errors are the OSError
    of the failing call."""
    folder = cls.try_take(index_dir)
    if folder is None:
      partial = f"{index_dir}.partial"
      raise UserError(f"{index_dir} is being built by another process (it holds {partial}/{LOCK}); wait for it to "
                      "finish, or choose another --index.")
    return folder

  @classmethod
  def try_take(cls, index_dir: str) -> "BuildFolder | None":
    """The locked folder, or None when a live builder holds it."""
    partial = f"{index_dir}.partial"
    while True:
      os.makedirs(os.path.join(partial, CHUNKS), exist_ok=True)
      lock = os.path.join(partial, LOCK)
      try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
      except FileNotFoundError:  # the folder was removed in between (a build finishing): make it again
        continue
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        os.close(fd)
        return None
      try:
        same = os.stat(lock).st_ino == os.fstat(fd).st_ino
      except FileNotFoundError:
        same = False
      if same:
        return cls(index_dir, fd)
      os.close(fd)  # we locked a file its build removed on finishing: lock the one there now

  def close(self) -> None:
    if self._fd is not None:
      os.close(self._fd)
      self._fd = None

  def remove(self) -> None:
    """Removes the folder (its lock file with it), then drops the lock."""
    shutil.rmtree(self.path, ignore_errors=True)
    self.close()

  def remove_leftovers(self) -> list[str]:
    """What killed builders of this index left (see the module docstring); returns the paths removed."""
    removed = []
    for folder in (self.path, os.path.join(self.path, CHUNKS)):
      for name in os.listdir(folder):
        if name.startswith(".") and name != LOCK:
          _remove(os.path.join(folder, name))
          removed.append(os.path.join(folder, name))
    parent, name = os.path.split(self.index_dir)
    pattern = re.compile(rf"\.{re.escape(name)}\.(\d+)\.tmp")
    for entry in os.listdir(parent):
      match = pattern.fullmatch(entry)
      # This process's own leftover counts as dead: it is saving nothing while it holds the lock.
      if match and (int(match.group(1)) == os.getpid() or not processes.alive(int(match.group(1)))):
        _remove(os.path.join(parent, entry))
        removed.append(os.path.join(parent, entry))
    return removed

  def chunk_path(self, k: int) -> str:
    return chunk_path(self.path, k)

  def read_manifest(self) -> dict[str, Any] | None:
    path = os.path.join(self.path, MANIFEST)
    if not os.path.isfile(path):
      return None
    try:
      with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    except (ValueError, UnicodeDecodeError):
      manifest = None
    if not isinstance(manifest, dict):
      raise UserError(f"{path} is damaged (not a JSON object); remove {self.path} to start the build over.")
    return manifest

  def write_manifest(self, manifest: dict[str, Any]) -> None:
    with atomic.open_for_write(os.path.join(self.path, MANIFEST), encoding="utf-8") as f:
      json.dump(manifest, f, indent=2)


def chunk_path(partial: str, k: int) -> str:
  return os.path.join(partial, CHUNKS, f"{k:06d}.npy")


def complete_chunks(partial: str) -> int:
  """The chunk files of an unfinished build under their final names (a killed writer leaves its chunk under a
  hidden one); each may still be damaged: `read_chunk`."""
  try:
    names = os.listdir(os.path.join(partial, CHUNKS))
  except OSError:
    return 0
  return sum(1 for name in names if _CHUNK_NAME.fullmatch(name))


class DamagedChunk(Exception):
  """A chunk file that is not the float32 [rows, dim] array its build writes; the message says how."""


def read_chunk(path: str, rows: int, dim: int, *, check_values: bool = False) -> np.ndarray:
  """The chunk at `path` as a read-only memory map of `rows` float32 vectors of `dim`, its header and size
  checked first (and with `check_values`, every value finite: the embedder refuses any other); `DamagedChunk`
  otherwise. Nothing in the file is ever unpickled: the header is parsed as a literal, the rows are mapped."""
  try:
    size = os.path.getsize(path)
    with open(path, "rb") as f:
      try:
        version = np.lib.format.read_magic(f)
        read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                       (2, 0): np.lib.format.read_array_header_2_0}.get(version)
        if read_header is None:
          raise DamagedChunk(f"it is a .npy file of version {version[0]}.{version[1]}, not 1.0")
        shape, fortran_order, dtype = read_header(f)
      # Junk where the header belongs fails inside numpy's parsing in many ways (a bad magic string, a header
      # that is no dict literal, an unknown dtype...): each means the same here.
      except (ValueError, SyntaxError, TypeError, UnicodeDecodeError, RecursionError, MemoryError) as e:
        raise DamagedChunk(f"it is not a .npy file ({_brief(e)})") from None
      start = f.tell()
  except OSError as e:
    raise DamagedChunk(f"it cannot be read: {e.strerror or e}") from None
  if dtype.hasobject:
    raise DamagedChunk("it holds pickled Python objects, not float32 vectors")
  if dtype != np.dtype("<f4") or fortran_order:
    raise DamagedChunk(f"it holds {dtype}{' Fortran-ordered' if fortran_order else ''} values, not float32")
  if tuple(shape) != (rows, dim):
    raise DamagedChunk(f"it holds an array of shape {list(shape)} where [{rows}, {dim}] belongs")
  expected = start + rows * dim * 4
  if size != expected:
    raise DamagedChunk(f"it is cut short ({size:,} of {expected:,} bytes)" if size < expected else
                       f"{size - expected:,} bytes follow its vectors")
  vectors = np.memmap(path, dtype="<f4", mode="r", offset=start, shape=(rows, dim))
  if check_values:
    block = max(1, (1 << 22) // dim)  # 16 MB at a time
    for row in range(0, rows, block):
      if not np.isfinite(vectors[row:row + block]).all():
        raise DamagedChunk("it holds values that are not finite numbers")
  return vectors


def _brief(error: Exception) -> str:
  text = str(error).strip().splitlines()
  return text[0][:120] if text else type(error).__name__


def remove_orphan(index_dir: str) -> bool:
  """INDEX_DIR.partial and the temporary files of dead builders, when the index exists and no live builder holds
  the folder: what a build killed between renaming the index into place and removing its folder left."""
  if not os.path.isdir(f"{index_dir}.partial"):
    return False
  try:
    folder = BuildFolder.try_take(index_dir)
  except OSError:  # read-only: leave it
    return False
  if folder is None:
    return False
  folder.remove_leftovers()
  folder.remove()
  return True


def _remove(path: str) -> None:
  """Best effort: a leftover that cannot be removed (a read-only folder) is left for a later run."""
  if os.path.isdir(path) and not os.path.islink(path):
    shutil.rmtree(path, ignore_errors=True)
  else:
    try:
      os.remove(path)
    except OSError:
      pass
