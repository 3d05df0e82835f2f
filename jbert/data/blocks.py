"""Records of a byte stream cut at separators, read in blocks with bounded memory: the blank-line-separated
documents of text and BERT-format files, the lines of JSONL.

A large uncompressed file is read as several byte ranges, in parallel, and every record must come out once and
whole whatever the ranges. The rule: a record starts at the start of the file or at the end of a separator run
(a `\\n` followed by blank lines, or one `\\n` in JSONL), and the range [start, stop) owns the records after
the runs that begin inside it (the file's first record goes to the range at 0). A range reads on past `stop` to
finish its last record. The records and their order are then those of one scan of the whole file.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import IO

# One or more blank lines: what separates documents. Anchored on a newline, so matching stays linear in the
# file size even on pathological whitespace-only lines.
BLANK_LINES = re.compile(rb"\n(?:[ \t\r\f\v]*\n)+")
NEWLINE = re.compile(rb"\n")
_BLANKS = b" \t\r\f\v"
BLOCK = 8 << 20


def _inside_run(read_back: Callable[[int, int], bytes], position: int) -> bool:
  """Whether the `\\n` at file offset `position` continues a blank-line run that began before it: the line it
  ends is blank and another line precedes that one."""
  end = position
  while end > 0:
    start = max(0, end - 4096)
    stripped = read_back(start, end).rstrip(_BLANKS)
    if stripped:
      return stripped.endswith(b"\n")
    end = start
  return False  # the blank line is the file's first line: nothing precedes it


def records(f: IO[bytes], separator: re.Pattern, *, start: int = 0, stop: int | None = None,
            read_back: Callable[[int, int], bytes] | None = None, max_bytes: int = 64 << 20,
            on_oversized: Callable[[int], None] = lambda n: None) -> Iterator[bytes]:
  """The records `f` holds from file offset `start` (where `f` is positioned), as bytes without separators.

  Args:
    f: a binary stream positioned at `start`.
    separator: `BLANK_LINES` (documents) or `NEWLINE` (JSONL lines).
    start, stop: the byte range whose records these are (module docstring); `stop` None reads to the end.
    read_back: `read_back(a, b)` returns bytes [a, b) of the file; needed when `start` > 0 with `BLANK_LINES`,
      to tell whether a run found at `start` began before it.
    max_bytes: a longer record is not held in memory: it is skipped and `on_oversized(its size)` called.
  """
  buf = b""
  offset = start  # file offset of buf[0]
  ours = start == 0  # whether the bytes from `cut` on belong to a record this range owns
  checked = not (separator is BLANK_LINES and start > 0)
  dropping, dropped = False, 0  # an oversized record is being skipped; its bytes so far
  while True:
    chunk = f.read(BLOCK)
    eof = not chunk
    buf += chunk
    # Separators are blank, so one that is still open can only lie in the buffer's blank tail; the ones that
    # end before it are complete.
    settled = len(buf) if eof else len(buf.rstrip(_BLANKS + b"\n"))
    cut = 0
    for m in separator.finditer(buf):
      if m.end() >= settled and not eof:
        break
      if not checked:
        checked = True
        if _inside_run(read_back, offset + m.start()):
          cut = m.end()
          continue
      if ours:
        if dropping:
          on_oversized(dropped + m.start() - cut)
        else:
          yield buf[cut:m.start()]
      dropping, dropped = False, 0
      if stop is not None and offset + m.start() >= stop:
        return
      ours, cut = True, m.end()
    if eof:
      if ours:
        if dropping:
          on_oversized(dropped + len(buf) - cut)
        else:
          yield buf[cut:]
      return
    if ours and len(buf) - cut > max_bytes:
      dropping = True
    if ours and not dropping:
      keep = cut  # the record's bytes so far
    else:
      keep = max(cut, settled)  # only the blank tail can still matter
      dropped += keep - cut if dropping else 0
    offset += keep
    buf = buf[keep:]
