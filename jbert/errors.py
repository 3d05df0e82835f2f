"""Which failures are the user's to fix, and how the commands report them.

A user's mistake (a config value out of range, a data file that is not there or not text, a busy workdir, a full
disk) is reported by the commands as one line on stderr with exit status 2; anything else is a bug in jbert and
keeps its traceback. `JBERT_TRACEBACK=1` shows the traceback of a user's mistake too, for bug reports.

`UserError` subclasses ValueError so that code catching ValueError around config and data checks keeps working.
The checks that predate it raise ValueError or FileNotFoundError (and the storage errors OSError); those count as
the user's too.
"""
from __future__ import annotations

import contextlib
import os
import reprlib
import sys
from typing import Iterator, NoReturn, Sequence

EXIT_STATUS = 2
INTERRUPTED_STATUS = 130  # a shell's status for a command ended by SIGINT
TRACEBACK_ENV = "JBERT_TRACEBACK"


class UserError(ValueError):
  """The run cannot go on because of something the user controls; the message names it and the fix."""


def is_user_error(error: BaseException) -> bool:
  """True for the user's mistakes: UserError, the ValueError of a config or data check, a missing or unwritable
  file (OSError: not found, permission, read-only or full storage)."""
  return isinstance(error, (UserError, ValueError, OSError))


# The longest line a command prints for an error. Messages quote what the user gave (values, names, lists), and a
# hostile file can make those any size: a config.json asking for a million layers once gave a 646 MB "line".
MAX_LINE = 2000
_REPR = reprlib.Repr()  # Python 3.11's Repr takes no arguments: the limits are attributes.
_REPR.maxlevel, _REPR.maxlong, _REPR.maxstring, _REPR.maxother = 3, 40, 80, 80
_REPR.maxdict = _REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdeque = 6


def preview(value: object) -> str:
  """`repr(value)`, shortened: long strings and numbers cut in the middle, containers to their first items. The
  cost is bounded too (a list of a million names is not turned into text first), so a message may quote anything a
  user or a model folder supplied."""
  return _REPR.repr(value)


def shorten(text: str, limit: int = 120) -> str:
  """`text` itself when short, else its start and end around `...`: for names and words quoted without quotes."""
  return text if len(text) <= limit else f"{text[:limit * 2 // 3]}...{text[-(limit // 3 - 3):]}"


def listing(items: Sequence[object], shown: int = 8) -> str:
  """`a, b, c` for a message, the first `shown` items (each as `str`, cut at 120 characters), and how many more."""
  head = [shorten(str(item)) for item in items[:shown]]
  more = len(items) - len(head)
  return ", ".join(head) + (f" and {more:,} more" if more > 0 else "")


def one_line(error: BaseException) -> str:
  """The message of `error` on one line (a message that spans lines is joined; an empty one is its type), at most
  MAX_LINE characters: a longer one keeps its start and its end, where the fix is.

  An OSError raised by the system carries (errno, strerror, filename) rather than a sentence of ours: it becomes
  the path, the reason and where to look."""
  if isinstance(error, OSError) and error.strerror and error.filename:
    text = f"{error.filename}: {error.strerror}; check the path and its permissions."
  else:
    text = " ".join(str(error).split()) or type(error).__name__
  if len(text) > MAX_LINE:
    cut = len(text) - MAX_LINE + 40
    text = f"{text[:MAX_LINE * 2 // 3]} [... {cut:,} characters cut ...] {text[MAX_LINE * 2 // 3 + cut:]}"
  return text


def show_traceback() -> bool:
  return os.environ.get(TRACEBACK_ENV, "").strip() not in ("", "0")


def exit_with(program: str, error: BaseException) -> NoReturn:
  """Prints `program: message` on stderr and exits with status 2."""
  print(f"{program}: {one_line(error)}", file=sys.stderr, flush=True)
  sys.exit(EXIT_STATUS)


@contextlib.contextmanager
def reported(program: str) -> Iterator[None]:
  """The body of a command: a user's mistake ends it with `program: message` and exit status 2; a bug, or any
  error under JBERT_TRACEBACK=1, keeps its traceback. Ctrl-C that reaches it (before training, or a second one
  during it) is one line too, exit status 130."""
  try:
    yield
  except KeyboardInterrupt:
    if show_traceback():
      raise
    print(f"{program}: interrupted; rerun the same command to go on from the last checkpoint it saved.",
          file=sys.stderr, flush=True)
    sys.exit(INTERRUPTED_STATUS)
  except Exception as e:  # pylint: disable=broad-except  (only the user's mistakes: bugs are re-raised)
    if not is_user_error(e) or show_traceback():
      raise
    exit_with(program, e)
