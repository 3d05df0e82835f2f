"""Records of a byte stream: any byte ranges of a file give, together, exactly the records of one scan of it."""
import io
import random

import pytest

from jbert.data import blocks


def whole_file(data: bytes, separator) -> list[bytes]:
  if separator is blocks.NEWLINE:
    return data.split(b"\n")
  bounds = [0, *(i for m in blocks.BLANK_LINES.finditer(data) for i in m.span()), len(data)]
  return [data[a:b] for a, b in zip(bounds[::2], bounds[1::2])]


def read(data: bytes, separator, start: int, stop: int | None) -> list[bytes]:
  f = io.BytesIO(data)
  f.seek(start)
  return list(blocks.records(f, separator, start=start, stop=stop, read_back=lambda a, b: data[a:b]))


@pytest.mark.parametrize("separator", [blocks.BLANK_LINES, blocks.NEWLINE], ids=["documents", "lines"])
def test_byte_ranges_partition_the_records_of_a_whole_scan(monkeypatch, separator):
  rng = random.Random(0)
  pieces = [b"\n", b"\n\n", b"  \n", b"\n \n\n", b"word", b"A sentence. ", b"\r\n", b" ", b"\t\n", b"x" * 40]
  for _ in range(400):
    data = b"".join(rng.choice(pieces) for _ in range(rng.randint(0, 60)))
    monkeypatch.setattr(blocks, "BLOCK", rng.choice([1, 2, 3, 7, 64]))  # records and runs straddle blocks
    cuts = sorted({0, len(data), *(rng.randint(0, len(data)) for _ in range(rng.randint(1, 6)))})
    got = [r for a, b in zip(cuts, cuts[1:]) for r in read(data, separator, a, b if b < len(data) else None)]
    if len(cuts) == 1:
      got = read(data, separator, 0, None)
    assert [r for r in got if r.strip()] == [r for r in whole_file(data, separator) if r.strip()], (data, cuts)


def test_an_oversized_record_is_skipped_unread_and_reported(monkeypatch):
  monkeypatch.setattr(blocks, "BLOCK", 5)
  data = b"a\n" + b"b" * 57 + b"\nc\n\n  \n" + b"d" * 15
  sizes = []
  lines = list(blocks.records(io.BytesIO(data), blocks.NEWLINE, max_bytes=10, on_oversized=sizes.append))
  assert (lines, sizes) == ([b"a", b"c", b"", b"  "], [57, 15])
  sizes = []
  assert list(blocks.records(io.BytesIO(data), blocks.BLANK_LINES, max_bytes=10, on_oversized=sizes.append)) == []
  assert sizes == [61, 15]
