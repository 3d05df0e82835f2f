"""Inputs of `jbert.predict`: files or Python records -> the examples each fine-tuned head's featurisation reads.

  classification  {"text_a", ["text_b"]}  (jbert.data.finetune.glue.classification_features)
  ner             {"tokens", "tags": None}  (jbert.data.finetune.ner.ner_features)
  question_answering  SQuAD examples {"id", "question", "context", "answers"}  (jbert.data.finetune.squad)
  multiple_choice {"context", "endings"}  (jbert.data.finetune.multiple_choice)

Every example also carries `where` ("FILE, line N" or "input I") for messages. Files:

  classification  .jsonl/.csv/.tsv: the text column (`column`, else the fine-tuning run's `text_a` column where
                  the file has it, else `text`) and, for pairs, `pair_column` (else the run's `text_b`, else
                  `text_b`); .txt: one text per line (`pairs`: `A<TAB>B`).
  ner             .txt: one sentence per line, words split at whitespace; .conll: CoNLL columns (first column);
                  .jsonl/.csv/.tsv: `column` (default `tokens`, else `text`), a list of words or a text.
  question_answering  .json: a SQuAD file; .jsonl/.csv/.tsv: `question`, `context` and optionally `id` (default:
                  the input's position).
  multiple_choice .jsonl (`context`, `endings`) or SWAG's .csv (`sent1`, `sent2`, `ending0`...).

Files are read as the trainer reads its own (TSV unquoted, a SQuAD file through the trainer's reader), so the
evaluation file of a run gives the examples that run evaluated. Labels, tags and answers in an input are ignored.
"""
from __future__ import annotations

import os
from typing import Any, Iterable, Sequence

from jbert import errors, tasks
from jbert.data import files

CONLL_SUFFIXES = (".conll",)


def read_file(path: str, kind: str, *, column: str | None = None, pair_column: str | None = None,
              pairs: bool = False, recorded: tuple[str | None, str | None] = (None, None)) -> list[dict[str, Any]]:
  """Examples of the input file `path` for a head of `kind`; a ValueError names the file and line of the first
  problem (undecodable bytes, malformed records, missing fields).

  Args:
    recorded: classification: the (text_a, text_b) columns the model was fine-tuned on, when known.
  """
  if not os.path.isfile(path):
    raise FileNotFoundError(f"Input file {path} does not exist.")
  files.check_utf8(path)
  suffix = os.path.splitext(path)[1].lower()
  if kind in ("classification", "regression"):
    if files.input_format(path) == "text":
      if column or pair_column:
        raise ValueError(f"{path} is a text file (one text per line): it has no columns; drop --column / "
                         "--pair_column, or use --pairs for tab-separated pairs.")
      if recorded[1] and not pairs:
        raise ValueError(f"The model was fine-tuned on text pairs ({recorded[0]}, {recorded[1]}): write "
                         f"`A<TAB>B` lines and pass --pairs, or use a .jsonl/.csv/.tsv with both columns.")
      return [_classification(text, f"{path}, line {i + 1}") for i, text in enumerate(files.iter_records(
          path, pairs=pairs))]
    if pairs:
      raise ValueError(f"--pairs reads `A<TAB>B` lines of a .txt file; {path} has columns: name the second one "
                       "with --pair_column.")
    return _classification_rows(files.iter_rows(path), column, pair_column, recorded, path)
  _only_pairs_for_classification(pair_column, pairs)
  if kind == "ner":
    if suffix in CONLL_SUFFIXES:
      from jbert.data.finetune import ner  # pylint: disable=g-import-not-at-top
      return [{"tokens": s["tokens"], "tags": None, "where": s["where"]} for s in ner.read_ner_file(path)]
    if files.input_format(path) == "text":
      return [{"tokens": line.split(), "tags": None, "where": f"{path}, line {i + 1}"}
              for i, line in enumerate(files.iter_records(path))]
    return [_ner(row, where, column, path) for where, row in files.iter_rows(path)]
  if kind == "question_answering":
    if suffix == ".json":
      from jbert.data.finetune import squad  # pylint: disable=g-import-not-at-top
      return [{**ex, "answers": _NO_ANSWERS, "where": f"question {ex['id']!r} of {path}"}
              for ex in squad.read_squad_json(path)]
    return _unique_ids([_qa(row, where, i, path) for i, (where, row) in enumerate(files.iter_rows(path))])
  if kind == "multiple_choice":
    from jbert.data.finetune import multiple_choice  # pylint: disable=g-import-not-at-top
    if suffix not in multiple_choice.FORMATS:
      raise ValueError(f"Cannot read multiple-choice inputs from {path}: use .jsonl (context, endings) or SWAG's "
                       ".csv (sent1, sent2, ending0, ...).")
    return [_choices(ex["context"], ex["endings"], ex["where"]) for ex in
            multiple_choice.read_multiple_choice_file(path)]
  raise ValueError(f"Unknown kind {kind!r}; one of {', '.join(tasks.KINDS)}.")


def from_records(records: Iterable[Any], kind: str,
                 recorded: tuple[str | None, str | None] = (None, None)) -> list[dict[str, Any]]:
  """Examples of Python inputs: classification a text, a (text, pair) tuple or a dict with the text fields; NER a
  list of words, a text (split at whitespace) or a dict with `tokens`/`text`; QA a dict with `question`,
  `context` (and `id`) or a (question, context) tuple; multiple choice a dict with `context` and `endings` or a
  (context, endings) tuple."""
  records = list(records)
  if kind in ("classification", "regression"):
    if records and all(isinstance(r, dict) for r in records):
      return _classification_rows(((f"input {i}", r) for i, r in enumerate(records)), None, None, recorded)
    out = []
    for i, record in enumerate(records):
      if isinstance(record, str) or (isinstance(record, (tuple, list)) and len(record) == 2):
        out.append(_classification(record, f"input {i}"))
      else:
        raise TypeError(f"Input {i} is a {type(record).__name__}; pass texts, (text, pair) tuples, or dicts with "
                        "the text fields (all inputs alike).")
    return out
  out = []
  for i, record in enumerate(records):
    where = f"input {i}"
    if kind == "ner":
      out.append(_ner(record if isinstance(record, dict) else {"tokens": record}, where, None))
    elif kind == "question_answering":
      if isinstance(record, (tuple, list)) and len(record) == 2:
        record = {"question": record[0], "context": record[1]}
      out.append(_qa(_dict(record, where, "a dict with question and context"), where, i))
    elif kind == "multiple_choice":
      if isinstance(record, (tuple, list)) and len(record) == 2:
        record = {"context": record[0], "endings": record[1]}
      record = _dict(record, where, "a dict with context and endings")
      out.append(_choices(_field(record, "context", where), _endings(record, where), where))
    else:
      raise ValueError(f"Unknown kind {kind!r}; one of {', '.join(tasks.KINDS)}.")
  return _unique_ids(out) if kind == "question_answering" else out


# ----------------------------------------------------------------------------------------------------------

_NO_ANSWERS = {"text": [], "answer_start": []}


def _only_pairs_for_classification(pair_column: str | None, pairs: bool) -> None:
  if pair_column or pairs:
    raise ValueError("--pair_column / --pairs apply to sentence-pair classification only.")


def _classification(record, where: str) -> dict[str, Any]:
  if isinstance(record, str):
    return {"text_a": record, "where": where}
  a, b = record
  if not isinstance(a, str) or not isinstance(b, str):
    raise TypeError(f"{where}: a pair must be two texts, got ({type(a).__name__}, {type(b).__name__}).")
  return {"text_a": a, "text_b": b, "where": where}


def _fields(row: dict[str, Any], path: str | None) -> str:
  """`(fields: [...]).` for a message about `row` of the file `path`, saying when a CSV/TSV header looks like data."""
  return f"(fields: {errors.preview(sorted(row))}).{files.header_note(path, row) if path else ''}"


def _classification_rows(rows: Iterable[tuple[str, dict[str, Any]]], column: str | None, pair_column: str | None,
                         recorded: tuple[str | None, str | None], path: str | None = None) -> list[dict[str, Any]]:
  """The text columns are chosen on the first record: explicit ones, else the fine-tuning run's where that record
  has them, else `text` (and `text_b`, required when the run had pairs)."""
  out, names = [], None
  for where, row in rows:
    if names is None:
      names = _text_columns(row, where, column, pair_column, recorded, path)
    example = {"where": where}
    for key, name in zip(("text_a", "text_b"), names):
      if name is None:
        continue
      if name not in row:
        raise ValueError(f"{where}: no field {errors.preview(name)} {_fields(row, path)} Pass --column / "
                         "--pair_column naming the text(s).")
      example[key] = _text(row[name], where, name)
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
  raise ValueError(f"{where}: no text field {wanted} {_fields(row, path)} Pass --column (and --pair_column) "
                   "naming the text(s).")


def _ner(row: dict[str, Any], where: str, column: str | None, path: str | None = None) -> dict[str, Any]:
  name = column or ("tokens" if "tokens" in row else "text")
  if name not in row:
    raise ValueError(f"{where}: no field {errors.preview(name)} {_fields(row, path)} Give the words as `tokens` (a "
                     "list) or `text` (split at whitespace), or pass --column.")
  value = row[name]
  if isinstance(value, str):
    tokens = value.split()
  elif isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
    tokens = list(value)
  else:
    raise ValueError(f"{where}: field {name!r} must be a list of words or a text, got {type(value).__name__}.")
  return {"tokens": tokens, "tags": None, "where": where}


def _qa(row: dict[str, Any], where: str, index: int, path: str | None = None) -> dict[str, Any]:
  qid = row.get("id")
  if qid is None or qid == "":
    qid = str(index)
  elif not isinstance(qid, (str, int)) or isinstance(qid, bool):
    raise ValueError(f"{where}: field 'id' must be a text or an integer, got {type(qid).__name__}.")
  return {"id": str(qid), "question": _field(row, "question", where, path),
          "context": _field(row, "context", where, path), "answers": _NO_ANSWERS, "where": where}


def _unique_ids(examples: list[dict[str, Any]]) -> list[dict[str, Any]]:
  seen = {}
  for ex in examples:
    if ex["id"] in seen:
      raise ValueError(f"{ex['where']}: id {ex['id']!r} was already used by {seen[ex['id']]}; answers are keyed by "
                       "id, so ids must be unique.")
    seen[ex["id"]] = ex["where"]
  return examples


def _choices(context: str, endings: Sequence[str], where: str) -> dict[str, Any]:
  if not endings:
    raise ValueError(f"{where}: `endings` is empty; give the candidate endings to choose from.")
  return {"context": context, "endings": list(endings), "where": where}


def _endings(record: dict[str, Any], where: str) -> list[str]:
  endings = record.get("endings")
  if not isinstance(endings, (list, tuple)) or not all(isinstance(e, str) for e in endings):
    raise ValueError(f"{where}: needs `endings`, a list of texts.")
  return list(endings)


def _dict(record: Any, where: str, what: str) -> dict[str, Any]:
  if not isinstance(record, dict):
    raise TypeError(f"{where} is a {type(record).__name__}; pass {what}.")
  return record


def _field(row: dict[str, Any], name: str, where: str, path: str | None = None) -> str:
  if name not in row:
    raise ValueError(f"{where}: no field {name!r} {_fields(row, path)}")
  return _text(row[name], where, name)


def _text(value: Any, where: str, name: str) -> str:
  if value is None:
    return ""
  if not isinstance(value, str):
    raise ValueError(f"{where}: field {name!r} is a {type(value).__name__}, not text.")
  return value
