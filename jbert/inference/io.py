"""Input files of the inference commands, and output files that never exist half-written.

Inputs: a text file (one text per line; with `pairs`, `A<TAB>B` per line), JSONL (one object per line, the text
under `column`, default "text") or CSV/TSV with a header row (`column` names the text; default "text", or the
only column). `pair_column` adds a second text per record. Records are read lazily, so files larger than memory
stream; `scan` validates a whole file first (UTF-8, JSON, columns) and counts its records, naming the file and
line of the first problem. An empty line of a text file is an empty text; blank lines of a JSONL file are
skipped. `iter_rows` gives whole records (dicts) of JSONL/CSV/TSV files, for inputs with several fields.

Outputs are written to a temporary name in the destination's folder and renamed over it only when complete
(`os.replace`), so an interrupted run leaves any earlier file of that name as it was and no partial one.
"""
from __future__ import annotations

import csv
import io
import json
import os
import struct
from typing import Any, BinaryIO, Iterator, Union

import numpy as np

Record = Union[str, tuple[str, str]]

TEXT_SUFFIXES = (".txt", ".text")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
DELIMITED = {".csv": ",", ".tsv": "\t"}


def input_format(path: str) -> str:
  suffix = os.path.splitext(path)[1].lower()
  if suffix in TEXT_SUFFIXES:
    return "text"
  if suffix in JSONL_SUFFIXES:
    return "jsonl"
  if suffix in DELIMITED:
    return suffix[1:]
  raise ValueError(f"Cannot tell the format of {path} from its suffix {suffix!r}: use .txt (one text per line), "
                   ".jsonl, .csv or .tsv.")


def scan(path: str, column: str | None = None, pair_column: str | None = None, pairs: bool = False) -> int:
  """Reads the whole input once without keeping it: the number of records, or a ValueError naming the file and
  line of the first undecodable byte, malformed record or missing column."""
  input_format(path)
  check_utf8(path)
  return sum(1 for _ in iter_records(path, column, pair_column, pairs))


def iter_records(path: str, column: str | None = None, pair_column: str | None = None,
                 pairs: bool = False) -> Iterator[Record]:
  """Texts (or `(text, pair)` tuples) of `path`, in file order."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Input file {path} does not exist.")
  kind = input_format(path)
  if kind == "text":
    if column or pair_column:
      raise ValueError(f"{path} is a text file (one text per line): it has no columns; drop --column / "
                       "--pair_column, or use --pairs for tab-separated pairs.")
    yield from _text_records(path, pairs)
  elif kind == "jsonl":
    yield from _jsonl_records(path, column or "text", pair_column)
  else:
    yield from _delimited_records(path, DELIMITED["." + kind], column, pair_column)


def _lines(path: str) -> Iterator[tuple[int, str]]:
  """(1-based line number, line without its end) of a UTF-8 file; a leading byte-order mark is dropped."""
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
      yield number, _decode(raw.rstrip(b"\n").removesuffix(b"\r"), path, number)


def _decode(raw: bytes, path: str, number: int) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}, line {number}: byte {e.start + 1} ({raw[e.start:e.start + 1]!r}) is not UTF-8; "
                     "convert the file to UTF-8 first (e.g. `iconv -f latin1 -t utf-8`).") from None


def check_utf8(path: str) -> None:
  """A ValueError naming the line and byte of the first byte sequence of `path` that is not UTF-8."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Input file {path} does not exist.")
  for _ in _lines(path):
    pass


def _text_records(path: str, pairs: bool) -> Iterator[Record]:
  for number, line in _lines(path):
    if not pairs:
      yield line
      continue
    if "\t" not in line:
      raise ValueError(f"{path}, line {number}: --pairs needs `text<TAB>pair` on every line; this line has no "
                       "tab.")
    a, b = line.split("\t", 1)
    yield a, b


def _jsonl_records(path: str, column: str, pair_column: str | None) -> Iterator[Record]:
  for number, line in _lines(path):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}, line {number}: not valid JSON ({e.msg}); each line must be one JSON object.") \
          from None
    if not isinstance(obj, dict):
      raise ValueError(f"{path}, line {number}: a JSON {type(obj).__name__}, not an object; each line must be "
                       "one JSON object.")
    yield _pick(obj, column, pair_column, f"{path}, line {number}")


def _delimited_records(path: str, delimiter: str, column: str | None, pair_column: str | None) -> Iterator[Record]:
  with open(path, "rb") as raw:
    text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
    reader = csv.DictReader(text, delimiter=delimiter)
    try:
      header = reader.fieldnames
      if not header:
        return
      if column is None:
        if "text" in header or len(header) != 1:
          column = "text"
        else:
          column = header[0]
      for name in (column, pair_column):
        if name is not None and name not in header:
          raise ValueError(f"{path} has no column {name!r}; its columns are {header}: pass --column (and "
                           "--pair_column) with one of them.")
      for row in reader:
        yield _pick(row, column, pair_column, f"{path}, line {reader.line_num}")
    except UnicodeDecodeError:
      check_utf8(path)  # Names the line.
      raise
    except csv.Error as e:
      raise ValueError(f"{path}, line {reader.line_num}: {e}; fix the quoting of that line.") from None


def _pick(record: dict[str, Any], column: str, pair_column: str | None, where: str) -> Record:
  values = []
  for name in (column, pair_column) if pair_column else (column,):
    if name not in record:
      raise ValueError(f"{where}: no field {name!r} (fields: {sorted(record)}); pass --column / --pair_column "
                       "naming the text.")
    value = record[name]
    if value is None:
      value = ""
    if not isinstance(value, str):
      raise ValueError(f"{where}: field {name!r} is a {type(value).__name__}, not text.")
    values.append(value)
  return values[0] if len(values) == 1 else (values[0], values[1])


def iter_rows(path: str) -> Iterator[tuple[str, dict[str, Any]]]:
  """(`"FILE, line N"`, record) for every record of a JSONL, CSV or TSV file (by suffix), in file order.

  Records are read as the fine-tuning trainer reads its local files (`jbert.data.finetune.local`): JSONL
  objects, CSV rows with a header, TSV rows with a header and no quoting (GLUE's files hold literal quotes).
  Blank JSONL lines are skipped. Check the file with `check_utf8` first for a message naming a bad byte.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Input file {path} does not exist.")
  kind = input_format(path)
  if kind == "text":
    raise ValueError(f"{path} is a text file; this input needs records with named fields (.jsonl, .csv, .tsv).")
  if kind == "jsonl":
    for number, line in _lines(path):
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}, line {number}: not valid JSON ({e.msg}); each line must be one JSON "
                         "object.") from None
      if not isinstance(obj, dict):
        raise ValueError(f"{path}, line {number}: a JSON {type(obj).__name__}, not an object; each line must be "
                         "one JSON object.")
      yield f"{path}, line {number}", obj
    return
  with open(path, "rb") as raw:
    text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
    quoting = csv.QUOTE_NONE if kind == "tsv" else csv.QUOTE_MINIMAL
    reader = csv.DictReader(text, delimiter=DELIMITED["." + kind], quoting=quoting)
    try:
      for row in reader:
        if None in row:  # More fields than the header names.
          raise ValueError(f"{path}, line {reader.line_num}: {len(reader.fieldnames) + len(row[None])} fields "
                           f"under a header of {len(reader.fieldnames)}; fix that line (or its quoting).")
        yield f"{path}, line {reader.line_num}", row
    except csv.Error as e:
      raise ValueError(f"{path}, line {reader.line_num}: {e}; fix the quoting of that line.") from None


# ----------------------------------------------------------------------------------------------------------
# Outputs.
# ----------------------------------------------------------------------------------------------------------


class AtomicFile:
  """A binary file written under a temporary name beside `path` and renamed to `path` on a clean close.

  Used as a context manager: an exception (KeyboardInterrupt included) removes the temporary file, and `path`
  keeps whatever it held before.
  """

  def __init__(self, path: str):
    self.path = os.path.abspath(path)
    folder = os.path.dirname(self.path)
    if not os.path.isdir(folder):
      raise FileNotFoundError(f"Output folder {folder} does not exist; create it first.")
    self.tmp_path = os.path.join(folder, f".{os.path.basename(self.path)}.{os.getpid()}.tmp")
    self.file: BinaryIO = open(self.tmp_path, "wb")

  def commit(self) -> None:
    self.file.close()
    os.replace(self.tmp_path, self.path)

  def abort(self) -> None:
    self.file.close()
    if os.path.exists(self.tmp_path):
      os.remove(self.tmp_path)

  def __enter__(self):
    return self

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
    self.file.write(self._header(0, 0))

  def write(self, block: np.ndarray) -> None:
    block = np.ascontiguousarray(block, dtype="<f4")
    if block.ndim != 2 or (self.dim is not None and block.shape[1] != self.dim):
      raise ValueError(f"NpyWriter: rows of shape {block.shape[1:]} after rows of width {self.dim}.")
    self.dim = block.shape[1]
    self.file.write(block.tobytes())
    self.rows += block.shape[0]

  def close(self) -> None:
    self.file.seek(0)
    self.file.write(self._header(self.rows, self.dim or 0))
    self.commit()

  @staticmethod
  def _header(rows: int, dim: int) -> bytes:
    body = repr({"descr": "<f4", "fortran_order": False, "shape": (rows, dim)})
    body = body.ljust(_NPY_HEADER_BYTES - len(_NPY_MAGIC) - 2 - 1) + "\n"
    return _NPY_MAGIC + struct.pack("<H", len(body)) + body.encode("latin1")


class JsonlWriter(AtomicFile):
  """One JSON object per line."""

  def write(self, obj: Any) -> None:
    self.file.write(json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n")
