"""Prediction inputs: what the task modules' readers (`read_inputs`, `inputs_from`) share.

Files are read as the trainer reads its own (`jbert.data.files`: TSV unquoted, JSONL, CSV, one text per line), so
the evaluation file of a run gives the examples that run evaluated. Every example carries `where` ("FILE, line N"
or "input I") for messages; labels, tags and answers in an input are ignored.
"""
from __future__ import annotations

import os
from typing import Any, Iterable

from jbert import errors
from jbert.data import files


def open_input(path: str) -> str:
  """`path` checked to be a UTF-8 file; returns its lower-case suffix."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Input file {path} does not exist.")
  files.check_utf8(path)
  return os.path.splitext(path)[1].lower()


def only_pairs_for_classification(pair_column: str | None, pairs: bool) -> None:
  """Refuses the pair flags for inputs that are not text pairs."""
  if pair_column or pairs:
    raise ValueError("--pair_column / --pairs apply to sentence-pair classification only.")


def text_example(record, where: str) -> dict[str, Any]:
  """{"text_a"[, "text_b"]} of a text or a (text, pair) tuple."""
  if isinstance(record, str):
    return {"text_a": record, "where": where}
  a, b = record
  if not isinstance(a, str) or not isinstance(b, str):
    raise TypeError(f"{where}: a pair must be two texts, got ({type(a).__name__}, {type(b).__name__}).")
  return {"text_a": a, "text_b": b, "where": where}


def fields_note(row: dict[str, Any], path: str | None) -> str:
  """`(fields: [...]).` for a message about `row` of the file `path`, saying when a CSV/TSV header looks like data."""
  return f"(fields: {errors.preview(sorted(row))}).{files.header_note(path, row) if path else ''}"


def text_rows(rows: Iterable[tuple[str, dict[str, Any]]], column: str | None, pair_column: str | None,
              recorded: tuple[str | None, str | None], path: str | None = None) -> list[dict[str, Any]]:
  """{"text_a"[, "text_b"]} of (where, record) rows. The text columns are chosen on the first record: explicit
  ones, else the fine-tuning run's where that record has them, else `text` (and `text_b`, required when the run
  had pairs)."""
  out, names = [], None
  for where, row in rows:
    if names is None:
      names = _text_columns(row, where, column, pair_column, recorded, path)
    example = {"where": where}
    for key, name in zip(("text_a", "text_b"), names):
      if name is None:
        continue
      if name not in row:
        raise ValueError(f"{where}: no field {errors.preview(name)} {fields_note(row, path)} Pass --column / "
                         "--pair_column naming the text(s).")
      example[key] = text(row[name], where, name)
    out.append(example)
  return out


def _text_columns(row: dict[str, Any], where: str, column: str | None, pair_column: str | None,
                  recorded: tuple[str | None, str | None], path: str | None) -> tuple[str, str | None]:
  if column is not None:
    return column, pair_column
  run_a, run_b = recorded
  if run_a is not None and run_a in row:
    return run_a, pair_column or run_b
  if "text" in row:
    return "text", pair_column or ("text_b" if run_b is not None or "text_b" in row else None)
  wanted = " or ".join(repr(n) for n in dict.fromkeys(n for n in (run_a, "text") if n))
  raise ValueError(f"{where}: no text field {wanted} {fields_note(row, path)} Pass --column (and --pair_column) "
                   "naming the text(s).")


def unique_ids(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
  """`examples`, refused where two share an `id` (answers are keyed by it)."""
  seen = {}
  for ex in examples:
    if ex["id"] in seen:
      raise ValueError(f"{ex['where']}: id {ex['id']!r} was already used by {seen[ex['id']]}; answers are keyed by "
                       "id, so ids must be unique.")
    seen[ex["id"]] = ex["where"]
  return examples


def as_dict(record: Any, where: str, what: str) -> dict[str, Any]:
  if not isinstance(record, dict):
    raise TypeError(f"{where} is a {type(record).__name__}; pass {what}.")
  return record


def field(row: dict[str, Any], name: str, where: str, path: str | None = None) -> str:
  if name not in row:
    raise ValueError(f"{where}: no field {name!r} {fields_note(row, path)}")
  return text(row[name], where, name)


def text(value: Any, where: str, name: str) -> str:
  if value is None:
    return ""
  if not isinstance(value, str):
    raise ValueError(f"{where}: field {name!r} is a {type(value).__name__}, not text.")
  return value
