"""Data files by path or URL: local files and whatever fsspec opens (gs:// through gcsfs, s3://, memory:// in the
tests), comma-separated globs, decompression by suffix (.gz, .zst, .bz2, .xz), and whole-file writes that never
leave a half-written file under its final name.

Every reader of training text (the direct sources, `python -m jbert.data prepare`) opens files here, so a bucket
path, a compressed file and a file whose bytes are not what its name says behave the same everywhere. A local
path without a compression suffix takes Python's own `open` (the fastest route, and the one that seeks).
Writes go to a temporary name and are renamed (local), or are uploaded whole (object stores create an object
only when its upload completes).
"""
from __future__ import annotations

import glob
import os
import socket
from collections.abc import Sequence
from typing import IO

import fsspec

from jbert.runtime import atomic
from jbert.runtime import processes
from jbert.runtime import storage_failures

# Suffix -> fsspec compression name, and the bytes each compressed stream starts with.
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".bz2": "bz2", ".xz": "xz"}
_MAGIC = {"gzip": b"\x1f\x8b", "zstd": b"\x28\xb5\x2f\xfd", "bz2": b"BZh", "xz": b"\xfd7zXZ\x00"}
# What each fsspec protocol needs installed, for the one-line error when it is missing.
_PACKAGES = {"gs": "gcsfs", "gcs": "gcsfs", "s3": "s3fs", "az": "adlfs", "abfs": "adlfs", "hf": "huggingface_hub"}


def is_url(path: str) -> bool:
  """True for a path fsspec must open (gs://, memory://, ...); plain and file:// paths are local."""
  return "://" in path and not path.startswith("file://")


def local_path(path: str) -> str:
  return os.path.expanduser(path.removeprefix("file://"))


def filesystem(url: str):
  """`(fs, path inside fs)` for a URL; a protocol whose package is missing is one line naming the package."""
  try:
    return fsspec.core.url_to_fs(url)
  except ImportError as e:
    protocol = url.split("://", 1)[0]
    package = _PACKAGES.get(protocol, f"the fsspec implementation of {protocol}://")
    raise ValueError(f"{url}: reading {protocol}:// paths needs {package}; install it (`pip install "
                     f"{package}`).") from e
  except ValueError as e:  # fsspec: "Protocol not known"
    raise ValueError(f"{url}: {e}; use a local path or a URL fsspec knows (gs://, s3://, ...).") from e


def compression(path: str) -> str | None:
  """The compression its suffix names (gzip, zstd, bz2, xz), or None."""
  return COMPRESSIONS.get(os.path.splitext(path)[1].lower())


def without_compression(path: str) -> str:
  """The name without its compression suffix: `a.jsonl.zst` -> `a.jsonl`."""
  base, suffix = os.path.splitext(path)
  return base if suffix.lower() in COMPRESSIONS else path


def expand_globs(patterns: str | Sequence[str], what: str) -> list[str]:
  """The files matching comma-separated globs, each glob's sorted, in the order of the globs; each glob must match
  at least one file. Local matches are plain paths, remote ones full URLs."""
  if isinstance(patterns, str):
    patterns = [p for p in patterns.split(",") if p.strip()]
  if not patterns:
    raise ValueError(f"{what} is empty; set it to a glob of input files, e.g. "
                     f"--config.data.{what}=/data/*.txt")
  files = []
  for pattern in (p.strip() for p in patterns):
    if is_url(pattern):
      fs, inner = filesystem(pattern)
      matches = sorted(fs.unstrip_protocol(p) for p in fs.glob(inner) if fs.isfile(p))
    else:
      matches = sorted(p for p in glob.glob(local_path(pattern), recursive=True) if os.path.isfile(p))
    if not matches:
      raise FileNotFoundError(f"{what}: no file matches the glob {pattern!r}; check the path.")
    files += matches
  return files


def size(path: str) -> int:
  """The size in bytes of the file as stored (compressed files: their compressed size)."""
  if not is_url(path):
    return os.path.getsize(local_path(path))
  fs, inner = filesystem(path)
  return int(fs.size(inner))


def open_raw(path: str) -> IO[bytes]:
  """The file's stored bytes, not decompressed."""
  if not is_url(path):
    return open(local_path(path), "rb")
  fs, inner = filesystem(path)
  return fs.open(inner, "rb")


def check_compression(path: str, head: bytes) -> None:
  """A ValueError naming `path` when its first bytes contradict its suffix: a `.gz` that is not gzip, or a plain
  name over gzip/zstd/xz data (bz2's magic is text and is not guessed)."""
  named = compression(path)
  found = next((name for name, magic in _MAGIC.items() if head.startswith(magic)), None)
  if named and found != named:
    what = f"{found}-compressed" if found else "not compressed"
    raise ValueError(f"{path} is named {os.path.splitext(path)[1]} but is {what} (it starts with {head[:8]!r}); "
                     f"rename it to match its contents, or recompress it.")
  if not named and found in ("gzip", "zstd", "xz"):
    suffix = {"gzip": ".gz", "zstd": ".zst", "xz": ".xz"}[found]
    raise ValueError(f"{path} is {found}-compressed but its name does not say so; rename it to {path}{suffix} (the "
                     "suffix picks the decompression).")


def open_data(path: str) -> IO[bytes]:
  """The file's bytes, decompressed as its suffix says; a suffix that contradicts the bytes is a ValueError."""
  with open_raw(path) as f:
    head = f.read(8)
  check_compression(path, head)
  kind = compression(path)
  if kind is None:
    return open_raw(path)
  if kind == "zstd":
    try:
      import zstandard  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError as e:
      raise ValueError(f"{path}: reading .zst files needs the zstandard package; install it (`pip install "
                       "zstandard`).") from e
  return fsspec.open(path if is_url(path) else local_path(path), "rb", compression=kind).open()


def read_bytes(path: str) -> bytes:
  """The whole file, decompressed."""
  with open_data(path) as f:
    return f.read()


def read_range(path: str, start: int, end: int) -> bytes:
  """Bytes [start, end) of an uncompressed file (a ranged read on object stores)."""
  if not is_url(path):
    with open(local_path(path), "rb") as f:
      f.seek(start)
      return f.read(end - start)
  fs, inner = filesystem(path)
  return fs.cat_file(inner, start, end)


def join(directory: str, *names: str) -> str:
  return "/".join([directory.rstrip("/"), *names])


def exists(path: str) -> bool:
  if not is_url(path):
    return os.path.exists(local_path(path))
  fs, inner = filesystem(path)
  return fs.exists(inner)


def makedirs(path: str) -> None:
  if is_url(path):
    fs, inner = filesystem(path)
    fs.makedirs(inner, exist_ok=True)
  else:
    os.makedirs(local_path(path), exist_ok=True)


def listdir(path: str) -> list[str]:
  """The names in a directory (empty when it does not exist)."""
  if not is_url(path):
    return sorted(os.listdir(local_path(path))) if os.path.isdir(local_path(path)) else []
  fs, inner = filesystem(path)
  if not fs.exists(inner):
    return []
  return sorted(os.path.basename(p.rstrip("/")) for p in fs.ls(inner, detail=False))


def temporary(final: str) -> str:
  """A local file to write `final` under until it is complete: beside it for a local path (so the rename is
  atomic), in the system's temporary directory for a remote one. The name carries host and pid, so a writer
  never meets another's file and `remove_stale` can tell a dead writer's."""
  tag = f"{socket.gethostname()}.{os.getpid()}.tmp"
  if is_url(final):
    import tempfile  # pylint: disable=g-import-not-at-top
    return os.path.join(tempfile.gettempdir(), f"jbert-{os.path.basename(final)}.{tag}")
  directory, name = os.path.split(local_path(final))
  return os.path.join(directory, f".{name}.{tag}")


def _name_storage_failure(final: str, error: Exception) -> None:
  """Raises the storage failure a failed upload to `final` is in the user's terms (a bucket that does not exist, a
  storage that cannot be reached); returns when it is none, for the caller to raise the client's own error."""
  storage = storage_failures.describe(error, final)
  if storage is not None:
    raise OSError(f"cannot write {final}: {storage}.") from error


def commit(temporary_file: str, final: str) -> None:
  """Moves a finished temporary file to its final name in one step (rename, or one whole upload)."""
  if is_url(final):
    fs, inner = filesystem(final)
    try:
      fs.put_file(temporary_file, inner)
    except Exception as e:  # gcsfs raises aiohttp's errors too
      _name_storage_failure(final, e)
      raise
    finally:
      os.remove(temporary_file)
  else:
    os.replace(temporary_file, local_path(final))


def write_atomic(final: str, data: bytes) -> None:
  """`data` as the whole of `final`, never seen half-written: jbert's atomic writer (`jbert.runtime.atomic`) for a
  local path; one whole-object write for a URL (an object store shows an object whole or not at all)."""
  if is_url(final):
    fs, inner = filesystem(final)
    try:
      fs.pipe_file(inner, data)
    except Exception as e:  # gcsfs raises aiohttp's errors too
      _name_storage_failure(final, e)
      raise
    return
  try:
    with atomic.open_for_write(local_path(final), "wb", writer=f"{socket.gethostname()}.{os.getpid()}") as f:
      f.write(data)
  except OSError as e:
    if not e.filename:  # a full disk fails the write, which names no file
      raise OSError(e.errno, e.strerror, final) from e
    raise


def remove_stale(directory: str) -> list[str]:
  """Removes the temporary files (`temporary`) that dead writers of this host left in a local `directory`;
  returns their names."""
  if is_url(directory) or not os.path.isdir(local_path(directory)):
    return []
  host, removed = socket.gethostname(), []
  for name in os.listdir(local_path(directory)):
    parts = name.rsplit(".", 2)
    if len(parts) == 3 and parts[2] == "tmp" and parts[1].isdigit() and parts[0].endswith(f".{host}"):
      if processes.alive(int(parts[1])):
        continue
      os.remove(os.path.join(local_path(directory), name))
      removed.append(name)
  return removed
