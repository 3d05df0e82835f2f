"""What every task's reader needs of a raw example, wherever it came from (TFDS, mocks, local files)."""
from collections.abc import Mapping, Sequence
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
