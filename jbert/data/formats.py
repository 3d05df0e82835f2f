"""The corpus formats `python -m jbert.data prepare` reads, cut into units a worker reads whole, and read into
sentence-split documents with every bad record counted.

| format | a document is | units |
| --- | --- | --- |
| parquet | one row's `text_column` (Hugging Face dumps: `id, url, title, text`) | row groups |
| jsonl | one line's `text_key` (plain, .gz, .zst, ...) | byte ranges of an uncompressed file, else the file |
| text | the text between blank lines, its lines joined | byte ranges of an uncompressed file, else the file |
| bert | google-research/bert's format: the lines between blank lines, a sentence each | as text |
| tfds | one example's `text_key` of `tfds:NAME[:SPLIT]` (random access, `tfds.data_source`) | ranges of examples |

The suffix (less .gz/.zst/.bz2/.xz) picks the format: .parquet, .jsonl/.ndjson/.json, anything else text;
`--format` overrides it (BERT format cannot be told from text by its name). A file whose bytes contradict its
name (a `.parquet` that is JSON, a `.gz` that is not gzip, a `.jsonl` whose first line is not a JSON object, a
binary file) is refused in one line naming it, when the inputs are planned; records that are bad further in are
counted in `Counts` (BAD) and skipped or repaired, never fatal.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
from collections.abc import Iterator

from jbert.data import blocks
from jbert.data import paths
from jbert.data import sources

FORMATS = ("parquet", "jsonl", "text", "bert", "tfds")
TFDS_PREFIX = "tfds:"
TFDS_UNIT = 8192  # examples per unit of a TFDS split
_SURROGATES = re.compile("[\ud800-\udfff]")
# Bytes of each file read when planning, to check it is what its name says (every host plans: keep it small).
_HEAD_BYTES = 256 << 10
# Bad records, each counted per input: what happens to them.
BAD = {
    "empty": "no text (dropped)",
    "undecodable": "bytes that are not UTF-8 (kept, those bytes replaced by U+FFFD)",
    "not_json": "lines that are not a JSON object (dropped)",
    "missing_text": "records without a text field, or a null or non-string one (dropped)",
    "oversized": "records over --max_record_mb (dropped unread)",
    "truncated_lines": "lines over --max_line_chars (cut)",
}


@dataclasses.dataclass(frozen=True)
class Settings:
  """How inputs are read; recorded in the manifest, and a rerun must use the same."""
  format: str = "auto"
  text_column: str = "text"
  text_key: str = "text"
  language: str = "en"
  max_line_chars: int = 20_000
  max_record_bytes: int = 64 << 20
  tfds_data_dir: str | None = None


@dataclasses.dataclass(frozen=True)
class Unit:
  """A piece of one input that one worker reads whole: a byte range, a row group or a range of examples
  ([start, stop); stop -1: to the end of the file). `size`: its input bytes, for shards and progress."""
  path: str
  format: str
  start: int
  stop: int
  size: int


def format_of(path: str, forced: str = "auto") -> str:
  if path.startswith(TFDS_PREFIX):
    return "tfds"
  if forced != "auto":
    return forced
  suffix = os.path.splitext(paths.without_compression(path))[1].lower()
  return {".parquet": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}.get(suffix, "text")


def _looks_like(head: bytes) -> str:
  if head.startswith(b"PAR1"):
    return "a Parquet file"
  if head.lstrip().startswith((b"{", b"[")):
    return "JSON"
  return "text" if head[:512].decode("utf-8", "replace").isprintable() or b"\n" in head[:512] else "binary data"


def _check_parquet(path: str):
  """The file's ParquetFile; a file that is not Parquet, or lacks a text column, is a ValueError naming it."""
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top  (only Parquet inputs need it)
  with paths.open_raw(path) as f:
    head = f.read(8)
  if not head.startswith(b"PAR1"):
    raise ValueError(f"{path} is not a Parquet file (it does not start with PAR1; it looks like "
                     f"{_looks_like(head)}): rename it to its real suffix, or pass --format.")
  try:
    return pq.ParquetFile(paths.open_raw(path))
  except Exception as e:  # pylint: disable=broad-except  (pyarrow's own words for a damaged file)
    raise ValueError(f"{path} is not a readable Parquet file ({e}); re-download or remove it.") from e


def _check_column(path: str, parquet, column: str) -> None:
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  schema = parquet.schema_arrow
  if column not in schema.names:
    raise ValueError(f"{path} has no column {column!r} (its columns: {', '.join(schema.names)}); pass "
                     "--text_column=NAME.")
  kind = schema.field(column).type
  if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
          or pa.types.is_large_binary(kind)):
    raise ValueError(f"{path}: column {column!r} holds {kind}, not text; pass --text_column=NAME of a text column.")


def _check_stream(path: str, kind: str, settings: Settings) -> None:
  """The first bytes of a JSONL/text/BERT file must be what its name says."""
  with paths.open_data(path) as f:
    head = f.read(_HEAD_BYTES)
  if head.startswith(b"PAR1"):
    raise ValueError(f"{path} is a Parquet file, not {kind}: name it .parquet or pass --format=parquet.")
  if kind != "jsonl":
    sources.check_text(head, path)
    return
  if not head.strip():
    return  # an empty file: no records
  first = next((line for line in head.split(b"\n") if line.strip()), b"")
  try:
    record = json.loads(first)
  except ValueError:
    record = None
  if len(first) >= len(head) and len(head) == _HEAD_BYTES:
    return  # a first line longer than the head: judged when read
  if not isinstance(record, dict):
    shown = first[:60].decode("utf-8", "replace")
    raise ValueError(f"{path} is not JSON Lines: its first line is not a JSON object ({shown!r}, {_looks_like(first)}"
                     "); name it by its format (.txt for plain text) or pass --format.")
  if settings.text_key not in record:
    raise ValueError(f"{path}: its records have no field {settings.text_key!r} (the first has "
                     f"{', '.join(sorted(record)) or 'none'}); pass --text_key=NAME.")


def tfds_name_split(spec: str) -> tuple[str, str]:
  """`tfds:NAME[:SPLIT]` -> (NAME, SPLIT); the split defaults to train."""
  name, _, split = spec[len(TFDS_PREFIX):].partition(":")
  if not name:
    raise ValueError(f"--input={spec}: name the dataset, e.g. tfds:wikipedia/20230601.en:train.")
  return name, split or "train"


def units_of(path: str, settings: Settings, chunk_bytes: int) -> list[Unit]:
  """The units of one input, after checking that it is what its name says."""
  kind = format_of(path, settings.format)
  if kind == "tfds":
    name, split = tfds_name_split(path)
    n = len(sources.tfds_data_source(name, split, settings.tfds_data_dir, name_key="--input"))
    return [Unit(path, kind, a, min(a + TFDS_UNIT, n), 0) for a in range(0, n, TFDS_UNIT)]
  if kind == "parquet":
    if paths.compression(path):
      raise ValueError(f"{path}: a compressed Parquet file cannot be read by row group; decompress it (Parquet "
                       "compresses its pages itself).")
    parquet = _check_parquet(path)
    _check_column(path, parquet, settings.text_column)
    meta = parquet.metadata
    return [Unit(path, kind, g, g + 1, sum(meta.row_group(g).column(c).total_compressed_size
                                           for c in range(meta.row_group(g).num_columns)))
            for g in range(meta.num_row_groups)]
  _check_stream(path, kind, settings)
  size = paths.size(path)
  if paths.compression(path) or size <= chunk_bytes:
    return [Unit(path, kind, 0, -1, size)]
  return [Unit(path, kind, a, min(a + chunk_bytes, size), min(chunk_bytes, size - a))
          for a in range(0, size, chunk_bytes)]


class Reader:
  """Reads units into documents (lists of sentences); `counts[input path]` holds the bad records seen."""

  def __init__(self, settings: Settings):
    self.settings = settings
    self.counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

  def documents(self, unit: Unit) -> Iterator[list[str]]:
    counts = self.counts[unit.path]
    for text in getattr(self, f"_{unit.format}")(unit, counts):
      if not text.isascii() and _SURROGATES.search(text):  # JSON's "\ud800" escapes: not encodable as UTF-8
        counts["undecodable"] += 1
        text = _SURROGATES.sub("\ufffd", text)
      if unit.format == "bert":
        sentences = self._cut([line.strip() for line in text.split("\n") if line.strip()], counts)
      elif unit.format == "text":
        sentences = sources.split_sentences(" ".join(self._cut(text.split("\n"), counts)), self.settings.language)
      else:
        sentences = sources.split_sentences("\n".join(self._cut(text.split("\n"), counts)), self.settings.language)
      if sentences:
        yield sentences
      elif unit.format not in ("text", "bert"):  # a blank block between documents is layout, not a record
        counts["empty"] += 1

  def _cut(self, lines: list[str], counts) -> list[str]:
    limit = self.settings.max_line_chars
    long = sum(len(line) > limit for line in lines)
    if long:
      counts["truncated_lines"] += long
      lines = [line[:limit] for line in lines]
    return lines

  @staticmethod
  def _decode(data: bytes, counts) -> str:
    try:
      return data.decode("utf-8")
    except UnicodeDecodeError:
      counts["undecodable"] += 1
      return data.decode("utf-8", errors="replace")

  def _blocks(self, unit: Unit, separator, counts) -> Iterator[bytes]:
    def oversized(n: int) -> None:
      del n
      counts["oversized"] += 1
    with paths.open_data(unit.path) as f:
      if unit.start:
        f.seek(unit.start)
      yield from blocks.records(
          f, separator, start=unit.start, stop=None if unit.stop < 0 else unit.stop,
          read_back=lambda a, b: paths.read_range(unit.path, a, b), max_bytes=self.settings.max_record_bytes,
          on_oversized=oversized)

  def _text(self, unit: Unit, counts) -> Iterator[str]:
    for block in self._blocks(unit, blocks.BLANK_LINES, counts):
      if block.strip():
        yield self._decode(block.removeprefix(b"\xef\xbb\xbf"), counts)

  _bert = _text

  def _jsonl(self, unit: Unit, counts) -> Iterator[str]:
    key = self.settings.text_key
    for line in self._blocks(unit, blocks.NEWLINE, counts):
      if not line.strip():
        continue
      try:
        record = json.loads(self._decode(line.removeprefix(b"\xef\xbb\xbf"), counts))
      except ValueError:
        counts["not_json"] += 1
        continue
      if not isinstance(record, dict):
        counts["not_json"] += 1
      elif not isinstance(record.get(key), str):
        counts["missing_text"] += 1
      else:
        yield record[key]

  def _texts(self, values, counts) -> Iterator[str]:
    for value in values:
      if value is None:
        counts["missing_text"] += 1
      elif len(value) > self.settings.max_record_bytes:
        counts["oversized"] += 1
      else:
        yield self._decode(value, counts) if isinstance(value, bytes) else value

  def _parquet(self, unit: Unit, counts) -> Iterator[str]:
    import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
    with paths.open_raw(unit.path) as f:
      table = pq.ParquetFile(f).read_row_group(unit.start, columns=[self.settings.text_column])
    yield from self._texts(table.column(0).to_pylist(), counts)

  def _tfds(self, unit: Unit, counts) -> Iterator[str]:
    name, split = tfds_name_split(unit.path)
    source = sources.tfds_data_source(name, split, self.settings.tfds_data_dir, name_key="--input")
    key = self.settings.text_key
    for index in range(unit.start, unit.stop):
      example = source[index]
      if key not in example:
        raise ValueError(f"{unit.path} has no feature {key!r} (its features: {', '.join(sorted(example))}); pass "
                         "--text_key=NAME.")
      yield from self._texts([example[key]], counts)
