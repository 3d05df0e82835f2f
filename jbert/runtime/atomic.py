"""Output files and folders of a training run that never exist half-written.

Each is written under a temporary name beside its destination and renamed into place only once complete, as
checkpoints and the inference outputs (`jbert.inference.io`) are: a run killed or failing mid-write leaves the
previous file (or folder) of that name as it was.

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


def _temporary(path: str, kind: str) -> str:
  folder, name = os.path.split(os.path.abspath(path))
  return os.path.join(folder, f".{name}.{os.getpid()}.{kind}")


@contextlib.contextmanager
def open_for_write(path: str, mode: str = "w", **kwargs) -> Iterator[IO]:
  """`open(path, mode, **kwargs)` on a temporary name, renamed to `path` when the block ends without an error
  (an error removes the temporary file and leaves `path` untouched). Creates the parent folder."""
  if storage.is_remote(path):
    with tempfile.TemporaryDirectory(prefix="jbert-out-") as local:
      file = os.path.join(local, os.path.basename(path))
      with open(file, mode, **kwargs) as f:
        yield f
      mirror.upload(file, path)
    return
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = _temporary(path, "tmp")
  try:
    with open(tmp, mode, **kwargs) as f:
      yield f
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


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
