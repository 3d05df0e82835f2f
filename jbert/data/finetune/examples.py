"""What every task's reader needs of a raw example, wherever it came from (TFDS, mocks, local files)."""
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np


def as_text(value: Any) -> str:
  """Text from TFDS: `str` from mocks, `bytes` from real record files."""
  if isinstance(value, np.ndarray):
    value = value.item()
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def require_keys(example: Mapping[str, Any], keys: Sequence[str]) -> None:
  """Raises a KeyError naming the missing fields and the available ones."""
  missing = [k for k in keys if k not in example]
  if missing:
    raise KeyError(f"examples lack field(s) {missing}; available: {sorted(example)}.")


def jsonl_objects(lines: Iterable[str], path: str, shape: str) -> Iterator[tuple[str, dict[str, Any]]]:
  """(`line N of PATH`, object) for each non-blank line; a line that is not a JSON object is a ValueError
  naming it and the `shape` each line must have."""
  for number, line in enumerate(lines, start=1):
    if not line.strip():
      continue
    where = f"line {number} of {path}"
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise ValueError(f"{where} is not JSON ({e.msg}); each line must be {shape}.") from e
    if not isinstance(row, dict):
      raise ValueError(f"{where} is not a JSON object; each line must be {shape}.")
    yield where, row
