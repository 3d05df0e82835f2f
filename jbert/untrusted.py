"""Reading the small files a model folder brings (config.json, vocab.txt, tokenizer.json, tokenizer_config.json,
sentence-transformers' modules.json and module configs, a SentencePiece .model, results.json) without trusting
them.

A folder is often downloaded, and its files can be anything: `vocab.txt` as a symlink to /dev/zero used to read
until memory ran out, and a FIFO blocks a reader for ever. So each file must be a regular file (anything else is
refused by name, before it is opened for reading), it is read up to the size it had when opened (a file that grows
meanwhile is not followed), and a file larger than any such file can be is refused by its size.
"""
from __future__ import annotations

import json
import os
import stat
from typing import Any

from jbert.errors import UserError

# The largest metadata file read. Configs are kilobytes; the largest vocabularies (250k pieces) make a
# tokenizer.json of about 20 MB and a SentencePiece model of about 5 MB.
MAX_BYTES = 64 << 20

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"))


def not_regular(path: str | os.PathLike, mode: int) -> UserError:
  """The error for `path`, whose (followed) mode says it is no regular file."""
  path = os.fspath(path)
  kind = next((name for test, name in _KINDS if test(mode)), "not a file")
  target = os.path.realpath(path)
  via = f" (a link to {target})" if target != os.path.abspath(path) else ""
  return UserError(f"{path} is {kind}{via}, not a regular file; a model folder's files must be plain files: "
                   "replace it with the real file.")


def check_regular(path: str | os.PathLike) -> int:
  """The size of `path`, which must be a regular file (a link to one is fine); FileNotFoundError if missing."""
  mode = os.stat(path)
  if not stat.S_ISREG(mode.st_mode):
    raise not_regular(path, mode.st_mode)
  return mode.st_size


def read_bytes(path: str | os.PathLike, limit: int = MAX_BYTES) -> bytes:
  """The bytes of the regular file `path`, at most `limit` of them (a larger file is refused by its size)."""
  path = os.fspath(path)
  # O_NONBLOCK: opening a FIFO would otherwise wait for a writer before its kind could be checked.
  fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
  info = os.fstat(fd)  # The file opened, whatever the name points to by now.
  if not stat.S_ISREG(info.st_mode):
    os.close(fd)
    raise not_regular(path, info.st_mode)
  with os.fdopen(fd, "rb") as f:
    if info.st_size > limit:
      raise UserError(f"{path} is {info.st_size:,} bytes, more than the {limit:,} any such file of a model folder "
                      "holds; the file is not what its name says, or is damaged: replace it.")
    return f.read(info.st_size)


def read_text(path: str | os.PathLike, limit: int = MAX_BYTES, encoding: str = "utf-8") -> str:
  """`read_bytes` decoded as `encoding` ("utf-8-sig" drops a leading byte-order mark); undecodable bytes are
  named."""
  data = read_bytes(path, limit)
  try:
    return data.decode(encoding)
  except UnicodeDecodeError as e:
    raise UserError(f"{os.fspath(path)} is not UTF-8 text ({e.reason} at byte {e.start}): the file is damaged or "
                    "not what its name says; replace it.") from None


def read_json(path: str | os.PathLike, limit: int = MAX_BYTES) -> Any:
  """The JSON value of a model folder's file; a damaged file is named with where its JSON breaks."""
  text = read_text(path, limit, "utf-8-sig")
  try:
    return json.loads(text)
  except json.JSONDecodeError as e:
    what = "is empty" if not text.strip() else f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    raise UserError(f"{os.fspath(path)} {what}: the file is truncated or corrupt; download or write it "
                    "again.") from None
