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
import re
from typing import Any, Iterable, Iterator, Union

from jbert import errors

Record = Union[str, tuple[str, str]]

FORMATS = {".txt": "text", ".text": "text", ".jsonl": "jsonl", ".ndjson": "jsonl", ".csv": "csv", ".tsv": "tsv"}
DELIMITERS = {"csv": ",", "tsv": "\t"}
_BOM = b"\xef\xbb\xbf"
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
# The longest CSV/TSV field read, in characters. Python's default limit (131,072) refused well-formed files with
# long texts, saying to fix their quoting; a field this long (64 Mi characters, a shelf of books) is no single
# input of a model, and is almost always an unclosed quote that swallowed the rest of the file.
MAX_FIELD_CHARS = 1 << 26


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
  text = read_text(path)
  try:
    value = json.loads(text)
  except json.JSONDecodeError as e:
    raise ValueError(f"{os.fspath(path)} is not JSON ({e.msg} at line {e.lineno}); {shape}.") from None
  _refuse_lone_surrogates(value, text, lambda: f"{os.fspath(path)}, line {_escape_line(text)}")
  return value


# JSON's `\ud800`..`\udfff` escapes: halves of UTF-16 pairs. Decoded alone they are not text (no UTF-8 encoding),
# and the tokenizer fails on them far from the file (a TypeError after the model loaded).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def _escape_line(text: str) -> int:
  """The line of `text` holding its first lone surrogate escape (a pair's halves are skipped)."""
  for number, line in enumerate(text.split("\n"), 1):
    if _SURROGATE_ESCAPE.search(line) and _lone_surrogate(json.loads(f'"{_escapes_only(line)}"')) is not None:
      return number
  return 1


def _escapes_only(line: str) -> str:
  """The surrogate escapes of `line`, in order, as one JSON string body (pairs stay pairs)."""
  return "".join(m.group(0) for m in _SURROGATE_ESCAPE.finditer(line))


_NAME = object()  # a dict key in the walk below


def _lone_surrogate(value: Any) -> tuple[str, str] | None:
  """(where, the escape) of the first string in `value` holding a lone surrogate: `field 'name'` for a value
  (the innermost key it lies under), else `a value`."""
  stack = [(None, value)]
  while stack:
    key, item = stack.pop()
    if isinstance(item, dict):
      for k, v in reversed(list(item.items())):
        stack += [(k, v), (_NAME, k)]  # its value under it, then the name itself
    elif isinstance(item, list):
      stack.extend((key, v) for v in reversed(item))
    elif isinstance(item, str):
      try:
        item.encode("utf-8")
      except UnicodeEncodeError as e:
        where = "a value" if key is None else "a field name" if key is _NAME else f"field {_short(key)}"
        return where, f"\\u{ord(item[e.start]):04x}"
  return None


def _short(value: Any) -> str:
  text = repr(value)
  return text if len(text) <= 60 else text[:40] + "..." + text[-12:]


def _refuse_lone_surrogates(value: Any, text: str, where) -> None:
  if "\\u" not in text or not _SURROGATE_ESCAPE.search(text):  # The escape must be in the text: cheap test first.
    return
  found = _lone_surrogate(value)
  if found is not None:
    raise ValueError(f"{where()}: {found[0]} holds the escape {found[1]}, half of a UTF-16 surrogate pair without its "
                     "other half, which is no character; write the character itself, or both halves of its pair "
                     "(e.g. \\ud83d\\ude00).")


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
    _refuse_lone_surrogates(obj, line, lambda: where(path, number))
    yield number, obj


def _delimited(path: str, kind: str) -> tuple[list[str], Iterator[tuple[int, dict[str, Any]]]]:
  """The header of a CSV/TSV file and a lazy iterator of (first line, row dict) of its rows."""
  raw = open(path, "rb")  # pylint: disable=consider-using-with  (closed by the generator or on error)
  text = io.TextIOWrapper(raw, encoding="utf-8-sig", newline="")
  quoting = csv.QUOTE_NONE if kind == "tsv" else csv.QUOTE_MINIMAL
  csv.field_size_limit(MAX_FIELD_CHARS)  # Process-wide; every reader of jbert's wants the same.
  reader = csv.reader(text, delimiter=DELIMITERS[kind], quoting=quoting)

  def fail(error: Exception, start: int) -> ValueError:
    if isinstance(error, UnicodeDecodeError):
      check_utf8(path)  # Names the line.
      return ValueError(f"{path}: not UTF-8 ({error}).")
    if "field limit" in str(error):
      return ValueError(_too_long(path, kind, start))
    return ValueError(f"{path}, line {reader.line_num}: {error}; fix the quoting of that line.")

  try:
    header = next(reader, [])
  except (UnicodeDecodeError, csv.Error) as e:
    raw.close()
    raise fail(e, 1) from None

  def rows() -> Iterator[tuple[int, dict[str, Any]]]:
    start = reader.line_num + 1
    try:
      for fields in reader:
        if fields:  # A blank line is no row (as for csv.DictReader); a line `""` is one.
          if len(fields) > len(header):
            raise ValueError(f"{path}, line {start}: {len(fields)} fields under a header of {len(header)}; fix "
                             "that line (or its quoting).")
          yield start, {name: fields[i] if i < len(fields) else None for i, name in enumerate(header)}
        start = reader.line_num + 1
    except (UnicodeDecodeError, csv.Error) as e:
      raise fail(e, start) from None
    finally:
      raw.close()

  return header, rows()


def _too_long(path: str, kind: str, start: int) -> str:
  """The message for a field over MAX_FIELD_CHARS in the row that starts on line `start`: its real length, and
  whether it is an opening quote that runs to the end of the file. A second pass that keeps nothing measures it."""
  stops = re.compile(r'["\r\n,]' if kind == "csv" else r"[\t\r\n]")  # csv ends a row at \r, \n or both
  field, length, quoted, fresh, found = 1, 0, False, True, None  # fresh: at the start of a field
  with open(path, encoding="utf-8-sig", newline="") as f:
    for _ in range(start - 1):
      f.readline()
    buffer = ""
    while found is None:
      buffer = buffer or f.read(1 << 20)
      if not buffer:
        found = (field, length, quoted) if length > MAX_FIELD_CHARS else None
        break
      if quoted:  # Up to the next `"`: the closing quote, or the first of a doubled `""`.
        i = buffer.find('"')
        if i < 0:
          length, buffer = length + len(buffer), ""
          continue
        length, buffer = length + i, buffer[i + 1:] or f.read(1 << 20)
        if buffer.startswith('"'):
          length, buffer = length + 1, buffer[1:]
        else:
          quoted = False
        continue
      match = stops.search(buffer)
      end = len(buffer) if match is None else match.start()
      length, fresh = length + end, fresh and end == 0
      char, buffer = (buffer[end], buffer[end + 1:]) if match else ("", "")
      if not char:  # The field goes on in the next chunk.
        continue
      if char == '"':
        quoted, length, fresh = fresh, length + (not fresh), False
      elif length > MAX_FIELD_CHARS:
        found = (field, length, False)
      elif char in "\r\n":
        break
      else:
        field, length, fresh = field + 1, 0, True
  if found is None:
    return f"{path}, line {start}: a field is longer than the {MAX_FIELD_CHARS:,} characters a field may hold."
  field, length, unclosed = found
  if unclosed:
    return (f"{path}, line {start}: field {field} opens a quote that is never closed, so it runs to the end of the "
            f"file ({length:,} characters, more than the {MAX_FIELD_CHARS:,} a field may hold); close the quote "
            'on that line (a `"` inside a quoted field is written `""`).')
  return (f"{path}, line {start}: field {field} holds {length:,} characters, more than the {MAX_FIELD_CHARS:,} a "
          "field may hold; split that text into shorter ones.")


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
  """A MissingColumnError naming the columns of `names` that `record` (row `row`, 0-based, at `line`) lacks, the
  columns there are, and (CSV/TSV) whether the header row the columns come from looks like data."""
  missing = [name for name in names if name not in record]
  if missing:
    raise MissingColumnError(f"column(s) {errors.preview(missing)} not in row {row} of {os.fspath(path)} (line {line}); "
                             f"available columns: {errors.preview(list(record))}.{header_note(path, record)}"
                             + (f" {hint}" if hint else ""))


def header_note(path: str | os.PathLike, record: dict[str, Any]) -> str:
  """For a CSV/TSV row whose keys (its file's first line) look like data rather than column names: a sentence
  saying so, for the messages that list the columns; "" otherwise."""
  if FORMATS.get(os.path.splitext(os.fspath(path))[1].lower()) not in DELIMITERS or not looks_like_data(list(record)):
    return ""
  return (f" The first line of {os.fspath(path)} is read as its header (the column names) and looks like data: if "
          "the file has no header row, add one naming the columns.")


def looks_like_data(names: list[Any]) -> bool:
  """Whether a CSV/TSV header row reads like a row of data: a name that is a number, is empty, is a sentence (four
  words or more, or over 40 characters), or repeats; column names are short, distinct words."""
  texts = [str(n).strip() for n in names]
  return len(set(texts)) < len(texts) or any(
      not t or _NUMBER.fullmatch(t) or len(t.split()) >= 4 or len(t) > 40 for t in texts)


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
