"""Re-ranking search hits with a cross-encoder: each (query, document text) pair scored by a one-label
`BertForSequenceClassification` (`configs/finetune.py:cross_encoder`'s export, a sentence-transformers CrossEncoder
folder, or any one-label pair regressor) through `jbert.predict`'s Predictor: the fine-tuning run's length and
text handling, length-bucketed batches, the scores `CrossEncoder.predict` gives (sigmoid where the folder records
it; raw logits for a plain regressor, which order the same).
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jbert.errors import UserError
from jbert.inference import runner
from jbert.inference.prediction import Predictor
from jbert.search.index import Hit


class CrossEncoderScorer:
  """Scores (query, text) pairs with a cross-encoder folder; refuses a model that is not one."""

  def __init__(self, model: str, *, batch_size: int = runner.DEFAULT_BATCH_SIZE, max_length: int | None = None,
               dtype: str | None = None):
    self.predictor = Predictor(model, batch_size=batch_size, max_length=max_length, dtype=dtype)
    if not self.predictor.task.scores_pairs:  # a one-label pair scorer: a cross-encoder, or any regressor
      info = self.predictor.info
      raise UserError(f"--rerank={model} is a {info.head.architecture} with {info.num_labels} labels, not a "
                      "cross-encoder (a one-label BertForSequenceClassification that scores (query, text) pairs); "
                      "train one with configs/finetune.py:cross_encoder.")

  def __call__(self, pairs: Sequence[tuple[str, str]]) -> np.ndarray:
    """float64 scores [N], higher is more relevant."""
    if not pairs:
      return np.zeros(0)
    records = self.predictor(self.predictor.examples(list(pairs)))
    return np.array([r["score"] if "score" in r else r["value"] for r in records], np.float64)


def rerank(queries: Sequence[str], hits: Sequence[Sequence[Hit]], cross_encoder: CrossEncoderScorer | str,
           top_k: int | None = None) -> list[list[Hit]]:
  """Each query's hits ordered by the cross-encoder's score of (query, hit text), best first (ties keep the
  retrieval order), the first `top_k` kept; a hit's `score` becomes the cross-encoder's and its embedding score
  `retrieval_score`. Every pair of every query goes through one Predictor call, so batches fill across queries."""
  if len(queries) != len(hits):
    raise ValueError(f"{len(queries)} queries with {len(hits)} lists of hits; give one list per query.")
  scorer = cross_encoder if isinstance(cross_encoder, CrossEncoderScorer) else CrossEncoderScorer(cross_encoder)
  pairs = [(q, h.text) for q, row in zip(queries, hits) for h in row]
  scores = iter(scorer(pairs).tolist())
  out = []
  for row in hits:
    scored = [dataclasses.replace(h, score=next(scores), retrieval_score=h.score) for h in row]
    order = sorted(range(len(scored)), key=lambda i: -scored[i].score)  # sorted() is stable
    out.append([scored[i] for i in order][:top_k])
  return out
