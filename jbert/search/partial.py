"""INDEX_DIR.partial: the folder of an unfinished build (its lock, manifest and chunks), and what dead builders
left beside the index.

One builder at a time holds an exclusive `flock` on `INDEX_DIR.partial/.lock`; the kernel drops it however the
process ends. The file goes with the folder when a build ends, so a builder that opened it just before checks
that the file it locked is still the one of that name (else it opens the new one). Holding the lock, no other
builder of this index is alive, so the holder removes what killed ones left: hidden temporary files in the folder
(a chunk or the manifest cut short), `.INDEX_DIR.PID.tmp` beside the index (a final save cut short) when its
process is gone, and the whole folder when the index already exists (a build killed between renaming the index
into place and removing its folder, or a second builder that lost the race).
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
from typing import Any

from jbert.errors import UserError
from jbert.runtime import atomic
from jbert.runtime import processes

MANIFEST, CHUNKS, LOCK = "manifest.json", "chunks", ".lock"


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
  """The chunks of an unfinished build that are complete (a killed writer leaves its chunk under a hidden name)."""
  done = 0
  while os.path.isfile(chunk_path(partial, done)):
    done += 1
  return done


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
