"""Multiple choice (SWAG, HellaSwag, your own files): a context, N endings, the index of the right one.

Every (context, ending) pair is packed as `[CLS] context [SEP] ending [SEP]` with BERT's longest-first
truncation: the BERT paper's SWAG input (sentence A the given sentence, sentence B a possible continuation) and
Hugging Face's `run_swag.py`. The model scores each pair and a softmax over the N scores picks the ending.

Local files: JSON lines `{"context": ..., "endings": [...], "label": i}` (`label` absent or -1: a file to
predict), or SWAG's own CSV (`sent1`, `sent2`, `ending0`..`ending3`, `label`), whose sentence B is
`sent2 + " " + ending`, the start of the second sentence followed by each candidate end.
"""
from collections.abc import Iterable, Mapping, Sequence
import os
import re
from typing import Any

import numpy as np

from jbert.data import files
from jbert.tasks.sources import as_text, require_keys

JSONL_SUFFIXES = (".jsonl", ".json")
FORMATS = (*JSONL_SUFFIXES, ".csv")


def multiple_choice_features(examples: Iterable[Mapping[str, Any]], tokenizer, max_seq_length: int, *,
                             num_choices: int | None = None) -> dict[str, np.ndarray]:
  """Features of examples with `context`, `endings` (a list) and optionally `label` (-1 or absent: unknown).

  Args:
    num_choices: the number of endings every example must have; None takes the first example's.

  Returns:
    int32 `input_ids, token_type_ids, attention_mask` [N, C, T]; int32 `label` [N] (-1 when unknown) and
    `example_id` [N] (index into `examples`).
  """
  examples = list(examples)
  n = len(examples)
  for example in examples:
    require_keys(example, ("context", "endings"))
  if num_choices is None and n:
    num_choices = len(examples[0]["endings"])
    if num_choices < 2:
      raise ValueError(f"{examples[0].get('where', 'example 0')} has {num_choices} ending(s); multiple choice "
                       "needs at least 2.")
  num_choices = num_choices or 2
  labels, endings = np.full(n, -1, np.int32), []
  for i, example in enumerate(examples):
    where = example.get("where", f"example {i}")
    texts = [as_text(e) for e in example["endings"]]
    if len(texts) != num_choices:
      raise ValueError(f"{where} has {len(texts)} endings but the others have {num_choices}; every example "
                       "needs the same number of endings (fix or drop it).")
    label = example.get("label")
    labels[i] = -1 if label is None else int(np.asarray(label))
    if not -1 <= labels[i] < num_choices:
      raise ValueError(f"{where} has label {labels[i]}, not the index of one of its {num_choices} endings (or -1 "
                       "for unknown).")
    endings += texts
  contexts = tokenizer.batch_ids([as_text(ex["context"]) for ex in examples])
  ending_ids = tokenizer.batch_ids(endings)
  input_ids = np.full((n, num_choices, max_seq_length), tokenizer.pad_id, np.int32)
  token_type_ids = np.zeros((n, num_choices, max_seq_length), np.int32)
  attention_mask = np.zeros((n, num_choices, max_seq_length), np.int32)
  for i in range(n):
    for choice in range(num_choices):
      packed = tokenizer.build_inputs(contexts[i], ending_ids[i * num_choices + choice], max_seq_length)
      length = len(packed["input_ids"])
      input_ids[i, choice, :length] = packed["input_ids"]
      token_type_ids[i, choice, :length] = packed["token_type_ids"]
      attention_mask[i, choice, :length] = 1
  return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask,
          "label": labels, "example_id": np.arange(n, dtype=np.int32)}


def read_multiple_choice_file(path: str | os.PathLike) -> list[dict[str, Any]]:
  """Examples of a JSON-lines file or of SWAG's CSV (by suffix): dicts with `context`, `endings`, `label`
  (None when the file has none) and `where` (the example's line, for messages)."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"multiple-choice file {path} does not exist.")
  if not path.lower().endswith(FORMATS):
    raise ValueError(f"cannot tell the format of {path} from its suffix; name it .jsonl (context, endings, label) "
                     "or .csv (SWAG's columns).")
  return _read_jsonl(path) if path.lower().endswith(JSONL_SUFFIXES) else _read_swag_csv(path)


def _read_jsonl(path: str) -> list[dict[str, Any]]:
  examples = []
  for number, row in files.jsonl_objects(path, "an object with context, endings, label"):
    where = f"line {number} of {path}"
    if "context" not in row or not isinstance(row.get("endings"), list):
      raise ValueError(f"{where} needs a `context` text and an `endings` list, e.g. "
                       "{\"context\": \"...\", \"endings\": [\"...\", \"...\"], \"label\": 0}.")
    examples.append({"context": str(row["context"]), "endings": [str(e) for e in row["endings"]],
                     "label": _label(row.get("label"), where), "where": where})
  return examples


def _read_swag_csv(path: str) -> list[dict[str, Any]]:
  columns = files.columns(path, "csv")
  endings = sorted((c for c in columns if re.fullmatch(r"ending\d+", c)), key=lambda c: int(c[6:]))
  missing = [c for c in ("sent1", "sent2") if c not in columns]
  if missing or not endings:
    raise ValueError(f"{path} lacks SWAG's column(s) {missing or ['ending0', 'ending1', '...']}; a CSV needs sent1, "
                     f"sent2, ending0, ending1, ... (and label); it has {columns}.")
  examples = []
  for number, row in files.rows(path, "csv"):
    where = f"line {number} of {path}"
    examples.append({"context": row["sent1"], "endings": [f"{row['sent2']} {row[c]}" for c in endings],
                     "label": _label(row.get("label"), where), "where": where})
  return examples


def _label(value: Any, where: str) -> int | None:
  if value is None or value == "":
    return None
  try:
    return int(value)
  except (TypeError, ValueError) as e:
    raise ValueError(f"{where} has label {value!r}; a label is the index of the right ending.") from e
