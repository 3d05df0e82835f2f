"""Generated data and a tiny sentence-transformers model for the bi-encoder tests.

Paraphrases: 30 concepts, each with two synonyms (two-letter words of the tasks' vocabulary). An anchor names 3-5
concepts by their first synonyms; its positive names the same concepts by their second synonyms in another order,
so the two share no token: a bag of random word vectors cannot pair them, an encoder that learnt the synonyms can.
"""
import csv
import json
import random

import numpy as np

from tasks.conftest import WORDS

CONCEPTS = [(WORDS[2 * i], WORDS[2 * i + 1]) for i in range(len(WORDS) // 2)]


def paraphrases(n: int, seed: int, negatives: bool = False) -> list[dict]:
  rng = random.Random(seed)
  rows = []
  for _ in range(n):
    picked = rng.sample(range(len(CONCEPTS)), rng.randint(3, 5))
    order = rng.sample(picked, len(picked))
    row = {"anchor": " ".join(CONCEPTS[c][0] for c in picked), "positive": " ".join(CONCEPTS[c][1] for c in order)}
    if negatives:
      row["negative"] = " ".join(CONCEPTS[c][1] for c in rng.sample(range(len(CONCEPTS)), len(picked)))
    rows.append(row)
  return rows


def scored_pairs(n: int, seed: int) -> list[dict]:
  """STS-style rows: paraphrases scored 4-5, unrelated pairs 0-2 (on a 0..5 scale)."""
  rng = random.Random(seed)
  rows = paraphrases(n, seed)
  return [{"s1": r["anchor"], "s2": r["positive"] if i % 2 else rows[i - 1]["positive"],
           "score": round(rng.uniform(4, 5) if i % 2 else rng.uniform(0, 2), 2)} for i, r in enumerate(rows)]


def write_jsonl(path, rows) -> str:
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  return str(path)


def write_csv(path, rows) -> str:
  with open(path, "w", newline="", encoding="utf-8") as f:
    writer = csv.DictWriter(f, list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
  return str(path)


def random_batch(seed: int, rows: int, texts: int, length: int, vocab: int) -> dict[str, np.ndarray]:
  """[rows, texts, length] inputs: [CLS] random ids [SEP] of random lengths, padded."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, length + 1, (rows, texts, 1))
  positions = np.arange(length)
  ids = rng.integers(10, vocab, (rows, texts, length))
  ids = np.where(positions == 0, 2, np.where(positions == lengths - 1, 3, ids))
  mask = (positions < lengths).astype(np.int32)
  return {"input_ids": (ids * mask).astype(np.int32), "token_type_ids": np.zeros_like(mask), "attention_mask": mask}
