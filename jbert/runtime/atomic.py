"""Files and folders that never exist half-written: jbert's one way of writing them.

Each is written under a temporary name beside its destination (`.NAME.PID.tmp`) and renamed into place only once
complete: a process killed or failing mid-write leaves the previous file (or folder) of that name as it was, and
a reader never sees part of one. The training run's outputs, the workdir's records, metrics.jsonl's rewrites, the
compile cache, search indexes and the inference commands' outputs (`jbert.inference.io`, which names the fix of a
failed write) all go through here.

In a bucket (`gs://`), which has no rename: a file is written locally and uploaded as one object, which appears
whole or not at all; a folder is filled locally, uploaded beside its destination, then copied over it inside
the store (`mirror.publish_folder`): only a crash during that copy (seconds) leaves it incomplete, and the
trainer's results.json, written last, tells a complete set of outputs.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import IO, Iterator

from jbert.runtime import mirror
from jbert.runtime import storage


def _temporary(path: str, kind: str, writer: str | None = None) -> str:
  folder, name = os.path.split(os.path.abspath(path))
  return os.path.join(folder, f".{name}.{writer or os.getpid()}.{kind}")


class AtomicFile:
  """`open(path, mode, **kwargs)` on a temporary name beside `path` (in a local temporary folder for a gs://
  `path`): `commit()` flushes it to the disk and renames (uploads) it to `path`; `abort()` removes it, and `path`
  keeps whatever it held. As a context manager, a clean exit commits and an exception (KeyboardInterrupt
  included) aborts. The folder of a local `path` must exist. `writer` names the writer in the temporary name
  (default: the pid; `jbert.data.paths` adds the host, so a dead writer's leftovers on shared storage are told
  from a live one's on another host)."""

  def __init__(self, path: str, mode: str = "w", *, writer: str | None = None, **kwargs):
    self.remote = storage.is_remote(path)
    self.path = path if self.remote else os.path.abspath(path)
    self._local = tempfile.mkdtemp(prefix="jbert-out-") if self.remote else None
    self.tmp_path = (os.path.join(self._local, os.path.basename(path)) if self.remote
                     else _temporary(self.path, "tmp", writer))
    try:
      self.file: IO = open(self.tmp_path, mode, **kwargs)  # pylint: disable=consider-using-with
    except BaseException:
      self._remove()
      raise

  def commit(self) -> None:
    try:
      self.file.flush()  # a full disk shows here, or in the fsync
      os.fsync(self.file.fileno())
      self.file.close()
      if self.remote:
        mirror.upload(self.tmp_path, self.path)  # one object, written whole
        self._remove()
      else:
        os.replace(self.tmp_path, self.path)
    except BaseException:
      self.abort()
      raise

  def abort(self) -> None:
    try:
      self.file.close()
    except OSError:
      pass  # the buffered rest could not be written: the file goes anyway
    self._remove()

  def _remove(self) -> None:
    if self._local is not None:
      shutil.rmtree(self._local, ignore_errors=True)
    elif os.path.exists(self.tmp_path):
      os.remove(self.tmp_path)

  def __enter__(self):
    return self

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is None:
      self.commit()
    else:
      self.abort()


@contextlib.contextmanager
def open_for_write(path: str, mode: str = "w", *, writer: str | None = None, **kwargs) -> Iterator[IO]:
  """`open(path, mode, **kwargs)` as an `AtomicFile`: `path` is replaced when the block ends without an error (an
  error removes the temporary file and leaves `path` untouched). Creates the parent folder (a bucket has none)."""
  if not storage.is_remote(path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with AtomicFile(path, mode, writer=writer, **kwargs) as atomic:
    yield atomic.file


@contextlib.contextmanager
def folder_for_write(path: str) -> Iterator[str]:
  """A temporary folder beside `path` to fill in the block; it then replaces `path` (a folder or nothing).

  POSIX cannot swap two non-empty folders in one rename: the old folder is renamed aside, the new one into
  place, then the old one removed, so only a crash between the two renames (microseconds) leaves `path` absent,
  never half-written. An error in the block removes the temporary folder and leaves `path` untouched.
  """
  if storage.is_remote(path):
    with tempfile.TemporaryDirectory(prefix="jbert-out-") as local:
      yield local
      folder, name = path.rstrip("/").rsplit("/", 1)
      mirror.publish_folder(local, path, f"{folder}/.{name}.{os.getpid()}.tmp")
    return
  tmp, old = _temporary(path, "tmp"), _temporary(path, "old")
  for leftover in (tmp, old):
    shutil.rmtree(leftover, ignore_errors=True)
  os.makedirs(tmp)
  try:
    yield tmp
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  if os.path.exists(path):
    os.rename(path, old)
  os.rename(tmp, path)
  shutil.rmtree(old, ignore_errors=True)
