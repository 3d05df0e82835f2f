"""Classification or regression examples from local CSV, TSV or JSON-lines files.

A column mapping names which file columns hold `text_a`, optionally `text_b`, and `label`, e.g.
`{"text_a": "sentence1", "text_b": "sentence2", "label": "gold"}`. Examples come out with those canonical keys
plus `idx` (row number), ready for `glue.classification_features(..., text_keys=("text_a", "text_b"))`.
Files are read by `jbert.data.files`, as `jbert.predict` and `jbert.embed` read them.
"""
from collections.abc import Mapping, Sequence
import math
import os
import pathlib
import re
from typing import Any

from jbert.data import files

FORMATS = {".csv": "csv", ".tsv": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}
CANONICAL_KEYS = ("text_a", "text_b", "text_c", "label")  # text_c: a bi-encoder's negative
_INTEGER = re.compile(r"[+-]?\d+")


def read_examples(path: str | os.PathLike, column_map: Mapping[str, str],
                  label_list: Sequence[str] | None = None, *,
                  file_format: str | None = None) -> list[dict[str, Any]]:
  """Reads `path` into examples with keys `text_a`, [`text_b`], [`label`] and `idx`.

  Args:
    path: a .csv, .tsv or .jsonl file (CSV and TSV with a header row; TSV unquoted, as GLUE's files).
    column_map: canonical key -> column name; `text_a` is required.
    label_list: class names in label-id order; labels become their index in it. None reads float labels
      (regression).
    file_format: "csv", "tsv" or "jsonl"; by default taken from the file's suffix.

  Returns:
    One dict per row.
  """
  path = pathlib.Path(path)
  unknown = sorted(set(column_map) - set(CANONICAL_KEYS))
  if unknown or "text_a" not in column_map:
    raise ValueError(f"column_map keys must be text_a (required), text_b, text_c, label; got {sorted(column_map)}.")
  file_format = file_format or FORMATS.get(path.suffix.lower())
  if file_format not in FORMATS.values():
    raise ValueError(f"cannot tell the format of {path}; pass file_format as one of csv, tsv, jsonl.")
  labels = {name: index for index, name in enumerate(label_list)} if label_list is not None else None
  examples = []
  for row_number, (line, row) in enumerate(files.rows(path, file_format)):
    files.require_columns(row, column_map.values(), path, row_number, line, _settings_hint(row, column_map))
    example = {key: row[column] for key, column in column_map.items()}
    if "label" in example:
      example["label"] = _label(example["label"], labels, path, row_number, line, column_map["label"])
    example["idx"] = row_number
    examples.append(example)
  return examples


def _settings_hint(row: dict[str, Any], column_map: Mapping[str, str]) -> str:
  """The run's settings that name the missing columns (`column_map` is what the task's config keys give)."""
  keys = [key for key, column in column_map.items() if column not in row]
  settings = " and ".join(f"--config.task.{key}" for key in keys)
  return f"Set {settings} to {'a column' if len(keys) == 1 else 'columns'} of the file."


def _label(value: Any, labels: Mapping[str, int] | None, path: pathlib.Path, row_number: int, line: int,
           column: str) -> int | float:
  """A label's class id: its position in the names; an integer label given names that are not integers is the
  class id itself (labels 0/1 named negative,positive). Without names, a finite float (regression): nan or inf
  would make the training loss, or an evaluation's correlations, NaN."""
  if labels is None:
    try:
      number = float(value)
    except (TypeError, ValueError):
      raise ValueError(f"row {row_number} of {path} has label {value!r}, which is not a number: a regressor needs "
                       "numeric labels; name the classes with --config.task.label_names.") from None
    if not math.isfinite(number):
      raise ValueError(f"{files.where(path, line)}: label {value!r} (column {column}) is not a finite number; fix "
                       "or remove that row (a non-finite score can be neither trained on nor scored).")
    return number
  text = str(value)
  if text in labels:
    return labels[text]
  ids = _INTEGER.fullmatch(text) and not any(_INTEGER.fullmatch(name) for name in labels)
  if ids and 0 <= int(text) < len(labels):
    return int(text)
  also = f" nor a class id 0..{len(labels) - 1}" if ids else ""
  raise ValueError(f"row {row_number} of {path} has label {value!r}, which is not in task.label_names "
                   f"{list(labels)}{also}; add it to --config.task.label_names (class names in id order).")


def label_names_from_values(path: str | os.PathLike, column: str, *,
                            file_format: str | None = None) -> list[str] | None:
  """Class names for a file whose labels have no names: its integer labels sorted numerically ("0", "1", ...);
  None when every label is a number and some are not integers (a regression target). Labels that are not numbers
  are a ValueError listing them, since their order (the class ids) cannot be guessed."""
  path = pathlib.Path(path)
  file_format = file_format or FORMATS.get(path.suffix.lower())
  values = set()
  for row_number, (line, row) in enumerate(files.rows(path, file_format)):
    files.require_columns(row, [column], path, row_number, line, "Set --config.task.label to its label column.")
    values.add(str(row[column]))
  words = sorted(v for v in values if not _is_number(v))
  if words:
    shown = ",".join(words[:10]) + (",..." if len(words) > 10 else "")
    raise ValueError(f"the labels of {path} (column {column!r}) are not numbers ({len(words)} distinct, e.g. "
                     f"{words[:3]}); name the classes in id order with --config.task.label_names={shown}.")
  if all(_INTEGER.fullmatch(v) for v in values):
    return sorted(values, key=int)
  return None


def _is_number(text: str) -> bool:
  try:
    float(text)
    return True
  except ValueError:
    return False
