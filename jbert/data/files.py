"""The one reader of text, JSONL, CSV and TSV files, for training, evaluation, `embed`, `predict` and `fill_mask`.

Every path that reads a user's file comes here, so a file gives the same rows whichever command reads it. Two
readers that drifted apart once made `jbert.embed` read a TSV whose sentence opened with `"` as one quoted field
swallowing the rows after it (1 embedding for 4 rows), while `jbert.predict` and the trainer read 4.

The rules, the same for every caller:
  - UTF-8; a leading byte-order mark is dropped; a byte that is not UTF-8 is a ValueError naming the file, line
    and byte.
  - Line ends `\\n` or `\\r\\n`.
  - `.txt`/`.text`: one record per line; an empty line is an empty text.
  - `.jsonl`/`.ndjson`: one JSON object per line; blank lines are skipped.
  - `.csv`: a header row, then rows with standard CSV quoting (`"a, b"`, `""` for a quote, newlines inside quotes).
  - `.tsv`: a header row, then tab-separated rows with NO quoting, as GLUE's files are: a `"` is a character.
    A row with more fields than the header is an error (a stray tab); a missing trailing field reads as None.
  - A missing column is a `MissingColumnError` naming the file, the row, its line and the available columns.

Records are read lazily, so a file larger than memory streams (`jbert.embed`); `scan` reads a whole file once,
keeping nothing, to surface the first problem before a model loads.
"""
from __future__ import annotations

import csv
import io
import json
import os
from typing import Any, Iterable, Iterator, Union

Record = Union[str, tuple[str, str]]

FORMATS = {".txt": "text", ".text": "text", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}
DELIMITERS = {"csv": ",", "tsv": "\t"}
_BOM = b"\xef\xbb\xbf"


class MissingColumnError(KeyError, ValueError):
  """A record lacks a column. Both a KeyError and a ValueError, so callers catching either see it; its text is
  the message itself (a plain KeyError would print its repr)."""

  def __str__(self) -> str:
    return str(self.args[0])


def input_format(path: str | os.PathLike, file_format: str | None = None) -> str:
  """"text", "jsonl", "csv" or "tsv": `file_format` when given, else from the suffix of `path`."""
  if file_format is not None:
    if file_format not in DELIMITERS and file_format not in ("text", "jsonl"):
      raise ValueError(f"Unknown file format {file_format!r}; one of text, jsonl, csv, tsv.")
    return file_format
  suffix = os.path.splitext(os.fspath(path))[1].lower()
  if suffix not in FORMATS:
    raise ValueError(f"Cannot tell the format of {os.fspath(path)} from its suffix {suffix!r}: use .txt (one text "
                     "per line), .jsonl, .csv or .tsv.")
  return FORMATS[suffix]


def where(path: str | os.PathLike, line: int) -> str:
  return f"{os.fspath(path)}, line {line}"


def _require_file(path: str) -> None:
  if os.path.isdir(path):
    raise IsADirectoryError(f"Input file {path} is a directory; name a file in it.")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Input file {path} does not exist.")


def _decode(raw: bytes, path: str, number: int) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}, line {number}: byte {e.start + 1} ({raw[e.start:e.start + 1]!r}) is not UTF-8; "
                     "convert the file to UTF-8 first (e.g. `iconv -f latin1 -t utf-8`).") from None


def lines(path: str | os.PathLike) -> Iterator[tuple[int, str]]:
  """(1-based line number, line without its `\\n` / `\\r\\n`) of a UTF-8 file, lazily; a leading BOM is dropped.

  Lines split at `\\n` only (not at the other breaks `str.splitlines` knows, such as U+2028 inside a text)."""
  path = os.fspath(path)
  _require_file(path)
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      if number == 1 and raw.startswith(_BOM):
        raw = raw[len(_BOM):]
      yield number, _decode(raw.rstrip(b"\n").removesuffix(b"\r"), path, number)


def check_utf8(path: str | os.PathLike) -> None:
  """A ValueError naming the line and byte of the first byte sequence of `path` that is not UTF-8."""
  for _ in lines(path):
    pass


def read_text(path: str | os.PathLike) -> str:
  """The whole file as text (BOM dropped, `\\r\\n` read as `\\n`), for formats read whole (SQuAD's JSON)."""
  return "\n".join(line for _, line in lines(path))


def read_json(path: str | os.PathLike, shape: str) -> Any:
  """One JSON document; a ValueError names the file, the line of the error and the `shape` it must have."""
  try:
    return json.loads(read_text(path))
  except json.JSONDecodeError as e:
    raise ValueError(f"{os.fspath(path)} is not JSON ({e.msg} at line {e.lineno}); {shape}.") from None


def jsonl_objects(path: str | os.PathLike, shape: str = "one JSON object") -> Iterator[tuple[int, dict[str, Any]]]:
  """(line number, object) for each non-blank line of a JSON-lines file; a line that is not a JSON object is a
  ValueError naming the file, the line and the `shape` each line must have."""
  path = os.fspath(path)
  for number, line in lines(path):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{path}, line {number}: not valid JSON ({e.msg}); each line must be {shape}.") from None
    if not isinstance(obj, dict):
      raise ValueError(f"{path}, line {number}: a JSON {type(obj).__name__}, not an object; each line must be "
                       f"{shape}.")
    yield number, obj


def _delimited(path: str, kind: str) -> tuple[list[str], Iterator[tuple[int, dict[str, Any]]]]:
  """The header of a CSV/TSV file and a lazy iterator of (first line, row dict) of its rows."""
  raw = open(path, "rb")  # pylint: disable=consider-using-with  (closed by the generator or on error)
  text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
  quoting = csv.QUOTE_NONE if kind == "tsv" else csv.QUOTE_MINIMAL
  reader = csv.reader(text, delimiter=DELIMITERS[kind], quoting=quoting)

  def fail(error: Exception) -> ValueError:
    if isinstance(error, UnicodeDecodeError):
      check_utf8(path)  # Names the line.
      return ValueError(f"{path}: not UTF-8 ({error}).")
    return ValueError(f"{path}, line {reader.line_num}: {error}; fix the quoting of that line.")

  try:
    header = next(reader, [])
  except (UnicodeDecodeError, csv.Error) as e:
    raw.close()
    raise fail(e) from None

  def rows() -> Iterator[tuple[int, dict[str, Any]]]:
    try:
      start = reader.line_num + 1
      for fields in reader:
        if fields:  # A blank line is no row (as for csv.DictReader); a line `""` is one.
          if len(fields) > len(header):
            raise ValueError(f"{path}, line {start}: {len(fields)} fields under a header of {len(header)}; fix "
                             "that line (or its quoting).")
          yield start, {name: fields[i] if i < len(fields) else None for i, name in enumerate(header)}
        start = reader.line_num + 1
    except (UnicodeDecodeError, csv.Error) as e:
      raise fail(e) from None
    finally:
      raw.close()

  return header, rows()


def columns(path: str | os.PathLike, file_format: str | None = None) -> list[str]:
  """The header of a CSV/TSV file."""
  path = os.fspath(path)
  _require_file(path)
  header, records = _delimited(path, input_format(path, file_format))
  records.close()
  return header


def rows(path: str | os.PathLike, file_format: str | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
  """(line number, record) for every record of a JSONL, CSV or TSV file, in file order: JSON objects, or rows of
  a CSV/TSV file keyed by its header (the line is the row's first)."""
  path = os.fspath(path)
  _require_file(path)
  kind = input_format(path, file_format)
  if kind == "text":
    raise ValueError(f"{path} is a text file; this input needs records with named fields (.jsonl, .csv, .tsv).")
  if kind == "jsonl":
    yield from jsonl_objects(path)
  else:
    yield from _delimited(path, kind)[1]


def iter_rows(path: str | os.PathLike, file_format: str | None = None) -> Iterator[tuple[str, dict[str, Any]]]:
  """(`"FILE, line N"`, record) for every record, as `rows`: for messages that name the record."""
  for line, record in rows(path, file_format):
    yield where(path, line), record


def require_columns(record: dict[str, Any], names: Iterable[str], path: str | os.PathLike, row: int, line: int,
                    hint: str = "") -> None:
  """A MissingColumnError naming the columns of `names` that `record` (row `row`, 0-based, at `line`) lacks."""
  missing = [name for name in names if name not in record]
  if missing:
    raise MissingColumnError(f"column(s) {missing} not in row {row} of {os.fspath(path)} (line {line}); available "
                             f"columns: {list(record)}." + (f" {hint}" if hint else ""))


def iter_records(path: str | os.PathLike, column: str | None = None, pair_column: str | None = None,
                 pairs: bool = False) -> Iterator[Record]:
  """Texts (or `(text, pair)` tuples) of `path`, in file order, lazily.

  A text file gives one text per line (`pairs`: `A<TAB>B` per line). Other files give the field `column`
  (default "text", or the only column of a one-column CSV/TSV) and `pair_column`; a null JSON value or a missing
  trailing TSV/CSV field is an empty text.
  """
  path = os.fspath(path)
  _require_file(path)
  kind = input_format(path)
  if kind == "text":
    if column or pair_column:
      raise ValueError(f"{path} is a text file (one text per line): it has no columns; drop --column / "
                       "--pair_column, or use --pairs for tab-separated pairs.")
    for number, line in lines(path):
      if not pairs:
        yield line
      elif "\t" not in line:
        raise ValueError(f"{path}, line {number}: --pairs needs `text<TAB>pair` on every line; this line has no "
                         "tab.")
      else:
        a, b = line.split("\t", 1)
        yield a, b
    return
  if pairs:
    raise ValueError(f"--pairs reads `A<TAB>B` lines of a .txt file; {path} has columns: name the second one with "
                     "--pair_column.")
  if column is None and kind in DELIMITERS:
    header = columns(path)
    column = header[0] if len(header) == 1 and "text" not in header else "text"
  names = (column or "text", pair_column) if pair_column else (column or "text",)
  for row, (line, record) in enumerate(rows(path)):
    require_columns(record, names, path, row, line, "Pass --column (and --pair_column) naming the text.")
    values = []
    for name in names:
      value = "" if record[name] is None else record[name]
      if not isinstance(value, str):
        raise ValueError(f"{path}, line {line}: field {name!r} is a {type(value).__name__}, not text.")
      values.append(value)
    yield values[0] if len(values) == 1 else (values[0], values[1])


def scan(path: str | os.PathLike, column: str | None = None, pair_column: str | None = None,
         pairs: bool = False) -> int:
  """Reads the whole input once without keeping it: the number of records, or the error of the first undecodable
  byte, malformed record or missing column (naming the file and line)."""
  input_format(path)
  check_utf8(path)
  return sum(1 for _ in iter_records(path, column, pair_column, pairs))
