"""The shard files of a prepared corpus against the size and CRC32C that prepare recorded for each (in its part
file, then in the manifest): what a rerun of prepare rewrites, and what a training run refuses before it reads
another corpus's shards or a damaged one.

Sizes come from one listing of the directory, so checking every shard costs no read. A bucket's listing carries
each object's CRC32C as well (GCS computes it on upload), so there the checksums are compared for free too; on
local disk a checksum means reading the shard, which the reader does once per process on a shard's first read
(`jbert.data.prepared`), never at start-up, and prepare on a rerun.
"""
from __future__ import annotations

import base64
import os
from collections.abc import Iterable

from jbert.data import paths

_CHUNK = 8 << 20  # bytes read at a time while checksumming


def crc32c(path: str) -> str:
  """The CRC32C of the file's bytes as 8 hex digits."""
  import google_crc32c  # pylint: disable=g-import-not-at-top  (C; installed with google-cloud-storage)
  checksum = google_crc32c.Checksum()
  with paths.open_raw(path) as f:
    while chunk := f.read(_CHUNK):
      checksum.update(chunk)
  return checksum.digest().hex()


def remove(path: str) -> None:
  if paths.is_url(path):
    fs, inner = paths.filesystem(path)
    fs.rm(inner)
  else:
    os.remove(paths.local_path(path))


def listing(directory: str) -> dict[str, tuple[int, str | None]]:
  """{file name: (size, CRC32C when the store lists one)} of a directory, in one listing."""
  if not paths.is_url(directory):
    local = paths.local_path(directory)
    if not os.path.isdir(local):
      return {}
    return {e.name: (e.stat().st_size, None) for e in os.scandir(local) if e.is_file()}
  fs, inner = paths.filesystem(directory)
  if not fs.exists(inner):
    return {}
  found = {}
  for entry in fs.ls(inner, detail=True):
    crc = entry.get("crc32c")
    found[os.path.basename(entry["name"].rstrip("/"))] = (
        int(entry["size"]), base64.b64decode(crc).hex() if isinstance(crc, str) else None)
  return found


def problem(name: str, record: dict, found: tuple[int, str | None] | None, crc: str | None = None) -> str | None:
  """What is wrong with shard `name` (recorded as `record`: bytes, crc32c) as found, or None. `crc` is the
  checksum computed from its bytes, when it was."""
  if found is None:
    return f"{name} is missing"
  size, listed = found
  if size != record["bytes"]:
    return f"{name} holds {size:,} bytes, not the {record['bytes']:,} prepare wrote"
  for checksum in (listed, crc):
    if checksum is not None and checksum != record["crc32c"]:
      return f"{name} has CRC32C {checksum}, not the {record['crc32c']} of the shard prepare wrote"
  return None


def problems(directory: str, records: Iterable[dict], *, read: bool) -> list[str]:
  """What is wrong with each shard of `records` (name, bytes, crc32c) in `directory`: missing, another size, and
  (the store's listed checksum, or with `read` the one of its bytes) another checksum."""
  listed = listing(directory)
  found = []
  for record in records:
    there = listed.get(record["name"])
    crc = (crc32c(paths.join(directory, record["name"])) if read and there is not None and there[1] is None
           and there[0] == record["bytes"] else None)
    issue = problem(record["name"], record, there, crc)
    if issue:
      found.append(issue)
  return found
