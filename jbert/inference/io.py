"""Output files of the inference commands, which never exist half-written.

Outputs are written to a temporary name in the destination's folder and renamed over it only when complete
(`jbert.runtime.atomic`), so an interrupted run leaves any earlier file of that name as it was and no partial
one. A `gs://` output is written to a local temporary file and uploaded as one object when complete, which likewise
appears whole or not at all. Inputs are read by `jbert.data.files`, the reader the trainer uses too.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Any

import numpy as np

from jbert.runtime import atomic
from jbert.runtime import storage


class OutputError(OSError):
  """An output file that cannot be written (a read-only folder, a full disk), named with the fix."""


def check_writable(path: str, flag: str = "--output") -> None:
  """Refuses, before any work, an output `path` that could not be written: its folder missing or not a folder,
  `path` a folder, or a folder this process may not write (read-only, another owner). Creates nothing (in a
  bucket, a probe object is written and deleted: only a write shows the permission)."""
  if storage.is_remote(path):
    _check_remote_writable(path, flag)
    return
  path = os.path.abspath(path)
  folder = os.path.dirname(path)
  if os.path.isdir(path):
    raise OutputError(f"{flag}={path} is a directory; name a file in it.")
  probe = folder
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise OutputError(f"{flag}={path} cannot be written: {probe} is a file, not a folder; choose another path.")
  if probe != folder:
    raise OutputError(f"The folder of {flag}={path} does not exist; create {folder} first.")
  if not os.access(folder, os.W_OK | os.X_OK):
    raise OutputError(f"{flag}={path} cannot be written: {folder} is read-only for this user; choose another "
                      "folder.")


def _check_remote_writable(path: str, flag: str) -> None:
  from etils import epath  # pylint: disable=g-import-not-at-top
  storage.require([path], flag)
  if epath.Path(path).is_dir():
    raise OutputError(f"{flag}={path} is a directory; name a file in it.")
  probe = epath.Path(path).parent / f".{os.path.basename(path)}.{os.getpid()}.probe"
  try:
    probe.write_bytes(b"")
    probe.unlink()
  except Exception as e:  # pylint: disable=broad-except  (each storage client has its own errors)
    raise OutputError(f"{flag}={path} cannot be written: {' '.join(str(e).split())[:300]}; check the bucket's "
                      "name and this machine's permission to write it.") from None


def _write_error(path: str, e: OSError) -> OutputError:
  return OutputError(f"Writing {path} failed: {e.strerror or e}; free space or choose another path (nothing was "
                     "written there).")


class AtomicFile(atomic.AtomicFile):
  """A binary `atomic.AtomicFile` whose failures (a read-only folder, a full disk) are one `OutputError` naming
  the file and the fix; the folder must exist already (a command's output folder is the user's to make)."""

  def __init__(self, path: str):
    folder = os.path.dirname(os.path.abspath(path))
    if not storage.is_remote(path) and not os.path.isdir(folder):
      raise FileNotFoundError(f"Output folder {folder} does not exist; create it first.")
    try:
      super().__init__(path, "wb")
    except OSError as e:
      raise _write_error(path if storage.is_remote(path) else os.path.abspath(path), e) from e

  def _write(self, data: bytes) -> None:
    try:
      self.file.write(data)
    except OSError as e:
      raise _write_error(self.path, e) from e

  def commit(self) -> None:
    try:
      super().commit()  # aborts itself when it fails
    except OutputError:
      raise
    except OSError as e:
      raise _write_error(self.path, e) from e

  def __exit__(self, exc_type, exc, tb) -> None:
    if exc_type is None:
      self.close()
    else:
      self.abort()

  def close(self) -> None:
    self.commit()


_NPY_MAGIC = b"\x93NUMPY\x01\x00"
_NPY_HEADER_BYTES = 128  # Room for any [N, D] shape; .npy headers are padded to a multiple of 64 bytes.


class NpyWriter(AtomicFile):
  """A float32 `[N, D]` .npy file written row block by row block; N is filled in when it is closed."""

  def __init__(self, path: str):
    super().__init__(path)
    self.rows, self.dim = 0, None
    try:
      self._write(self._header(0, 0))
    except BaseException:
      self.abort()  # not yet inside `with`: nothing else would remove the temporary file
      raise

  def write(self, block: np.ndarray) -> None:
    block = np.ascontiguousarray(block, dtype="<f4")
    if block.ndim != 2 or (self.dim is not None and block.shape[1] != self.dim):
      raise ValueError(f"NpyWriter: rows of shape {block.shape[1:]} after rows of width {self.dim}.")
    self.dim = block.shape[1]
    self._write(block.tobytes())
    self.rows += block.shape[0]

  def close(self) -> None:
    try:
      self.file.seek(0)  # flushes the buffered rows first: a full disk can show here
      self._write(self._header(self.rows, self.dim or 0))
    except OutputError:
      self.abort()  # raised inside __exit__: nothing else would remove the temporary file
      raise
    except OSError as e:
      self.abort()
      raise _write_error(self.path, e) from e
    self.commit()

  @staticmethod
  def _header(rows: int, dim: int) -> bytes:
    body = repr({"descr": "<f4", "fortran_order": False, "shape": (rows, dim)})
    body = body.ljust(_NPY_HEADER_BYTES - len(_NPY_MAGIC) - 2 - 1) + "\n"
    return _NPY_MAGIC + struct.pack("<H", len(body)) + body.encode("latin1")


class JsonlWriter(AtomicFile):
  """One JSON object per line, always standard JSON: a NaN or inf is an error, never a `NaN` token."""

  def write(self, obj: Any) -> None:
    self._write(json.dumps(obj, ensure_ascii=False, allow_nan=False).encode("utf-8") + b"\n")
