"""The files of a saved index, written so that damage is found and read so that it is named.

  index.json   the index settings, the document count and dimension, the model record, each data file's size and
               CRC-32 (`files`), and `checksum`: the sha256 of everything else in it, so an edit (another pooling,
               a count) shows
  docs.jsonl   `{"id", "text"}` per document, in index order
  index.faiss  faiss' file (`jbert.search.faiss_file`: checked against index.json before faiss reads it)

A query checks what is cheap to check: every key index.json needs, its checksum, each file's size, every line of
docs.jsonl and its CRC-32 (reordered or edited lines), and index.faiss' CRC-32 as faiss reads it. Each failure
is one line naming the file and the fix. Indexes of format 1 (before the checksums) are read with the checks their
files allow.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Any, Sequence

from jbert.errors import UserError
from jbert.search.faiss_file import REBUILD, Crc32, damaged

VECTORS, DOCS, META = "index.faiss", "docs.jsonl", "index.json"
FORMAT_VERSION = 2
_REQUIRED = {"format": int, "count": int, "dim": int, "settings": dict}
_BLOCK = 1 << 20


class StorageError(UserError):
  """A file of an index that could not be written (a read-only folder, a full disk): `path` as the user will see
  it and the OSError."""

  def __init__(self, path: str, error: OSError):
    self.path, self.error = path, error
    super().__init__(f"cannot write {path}: {error.strerror or error}; free space or make its folder writable, "
                     "then save again.")


def meta_checksum(meta: dict[str, Any]) -> str:
  body = {k: v for k, v in meta.items() if k != "checksum"}
  return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def file_record(path: str | os.PathLike) -> dict[str, Any]:
  digest = Crc32()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(_BLOCK), b""):
      digest.update(block)
  return {"bytes": os.path.getsize(path), "crc32": digest.hexdigest()}


def write_docs(path: str, ids: Sequence[Any], texts: Sequence[str]) -> dict[str, Any]:
  """docs.jsonl, flushed to the disk; its size and CRC-32."""
  digest, size = Crc32(), 0
  with open(path, "wb") as f:
    for i, text in zip(ids, texts):
      line = (json.dumps({"id": i, "text": text}, ensure_ascii=False) + "\n").encode("utf-8")
      f.write(line)
      digest.update(line)
      size += len(line)
    f.flush()
    os.fsync(f.fileno())
  return {"bytes": size, "crc32": digest.hexdigest()}


def write_meta(path: str, meta: dict[str, Any]) -> None:
  meta = {**meta, "checksum": meta_checksum(meta)}
  with open(path, "w", encoding="utf-8") as f:
    json.dump(meta, f, indent=2)
    f.write("\n")
    f.flush()
    os.fsync(f.fileno())


def read_meta(directory: str) -> dict[str, Any]:
  """index.json, refused by name unless it is whole: valid JSON, every key a load needs, its checksum."""
  path = os.path.join(directory, META)
  try:
    with open(path, encoding="utf-8") as f:
      meta = json.load(f)
  except (ValueError, UnicodeDecodeError):
    raise damaged(path, "it is not valid JSON (cut short or overwritten?)") from None
  if not isinstance(meta, dict):
    raise damaged(path, "it is not a JSON object")
  for key, kind in _REQUIRED.items():
    if key not in meta:
      raise UserError(f"{path} lacks \"{key}\": the file is damaged; {REBUILD}")
    if not isinstance(meta[key], kind) or isinstance(meta[key], bool):
      raise UserError(f"{path}: \"{key}\" is {meta[key]!r}, not a {kind.__name__}: the file is damaged; {REBUILD}")
  if meta["format"] > FORMAT_VERSION:
    raise UserError(f"{path} is of format {meta['format']}, written by a newer jbert (this one reads up to "
                    f"{FORMAT_VERSION}); upgrade jbert to query it.")
  if meta["format"] >= 2 and meta.get("checksum") != meta_checksum(meta):
    raise UserError(f"{path} was changed after the build (its checksum does not match its contents); {REBUILD}")
  if meta["count"] < 0 or not 1 <= meta["dim"] <= 1 << 20:
    raise damaged(path, f"it records {meta['count']} documents of dimension {meta['dim']}")
  return meta


def check_size(path: str, meta: dict[str, Any], *, shorter: bool = True) -> None:
  """`path` exists and has the size index.json records for it (format 2); with `shorter=False` only a longer
  file is refused (a shorter one is left to a check that can say where it was cut)."""
  if not os.path.isfile(path):
    raise UserError(f"{path} is missing: the index is incomplete; {REBUILD}")
  recorded = (meta.get("files") or {}).get(os.path.basename(path))
  size = os.path.getsize(path)
  if recorded is not None and (size > recorded["bytes"] or (shorter and size != recorded["bytes"])):
    raise damaged(path, f"it has {size} bytes where index.json records {recorded['bytes']}")


def check_crc(path: str, meta: dict[str, Any], crc: str) -> None:
  recorded = (meta.get("files") or {}).get(os.path.basename(path))
  if recorded is not None and crc != recorded.get("crc32"):
    raise UserError(f"{path} does not match the checksum index.json records for it: it was damaged or changed "
                    f"after the build; {REBUILD}")


def read_docs(path: str, meta: dict[str, Any]) -> tuple[list[Any], list[str]]:
  """The ids and texts of docs.jsonl, every line checked, then the count and the file's checksum."""
  check_size(path, meta, shorter=False)  # a longer file than recorded is not read at all
  with open(path, "rb") as f:
    data = f.read()
  digest = Crc32()
  digest.update(data)
  try:
    lines = data.decode("utf-8").split("\n")
  except UnicodeDecodeError as e:
    line = data.count(b"\n", 0, e.start) + 1
    raise UserError(f"{path} line {line} is not UTF-8 text: the file is damaged; {REBUILD}") from None
  if lines[-1] == "":
    lines.pop()
  ids, texts = [], []
  for number, line in enumerate(lines, 1):
    try:
      doc = json.loads(line)
    except ValueError:
      doc = None
    if not isinstance(doc, dict):
      raise UserError(f"{path} line {number} is not a JSON object (cut short?): the file is damaged; {REBUILD}")
    if "id" not in doc or "text" not in doc:
      key = "id" if "id" not in doc else "text"
      raise UserError(f"{path} line {number} has no \"{key}\": the file is damaged; {REBUILD}")
    doc_id, text = doc["id"], doc["text"]
    if not isinstance(text, str) or not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
      raise UserError(f"{path} line {number}: its id or text is not of the kind an index holds: the file is "
                      f"damaged; {REBUILD}")
    ids.append(doc_id)
    texts.append(text)
  if len(ids) != meta["count"]:
    raise UserError(f"{path} holds {len(ids)} documents where index.json records {meta['count']}: the file is "
                    f"damaged; {REBUILD}")
  check_size(path, meta)
  check_crc(path, meta, digest.hexdigest())
  return ids, texts
