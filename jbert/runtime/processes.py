"""Whether a process runs: the test behind every "left by a dead writer?" decision (the prepared corpus's
temporary shards, a search index's partial build and its locks)."""
from __future__ import annotations

import os


def alive(pid: int) -> bool:
  """Whether process `pid` runs on this host. A zombie, which a container's init may never reap, does not; a
  process of another user (kill answers EPERM) does."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  try:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except (OSError, IndexError):
    return True  # no /proc (macOS): kill's answer stands
