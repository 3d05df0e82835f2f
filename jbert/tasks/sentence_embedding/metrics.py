"""Host-side evaluation of sentence embeddings, as sentence-transformers' evaluators compute it.

  similarity_metrics   EmbeddingSimilarityEvaluator: Pearson and Spearman of cos(u, v) against gold scores
  retrieval_metrics    InformationRetrievalEvaluator (cosine): MRR@10, nDCG@10, recall@1 and recall@10 of each query
                       against a corpus, given each query's relevant documents
  triplet_accuracy     TripletEvaluator: the share of (a, p, n) with |a - p| < |a - n| (euclidean, as TripletLoss)
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

_CHUNK = 1024  # queries scored at once: a [chunk, corpus] float32 block


def unit(x: np.ndarray) -> np.ndarray:
  x = np.asarray(x, np.float64)
  return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def similarity_metrics(u: np.ndarray, v: np.ndarray, gold: np.ndarray) -> dict[str, float]:
  """{"spearman", "pearson"} of the cosine similarities of rows u [N, D], v [N, D] against gold scores [N]."""
  from scipy import stats  # pylint: disable=g-import-not-at-top
  scores = np.sum(unit(u) * unit(v), -1)
  gold = np.asarray(gold, np.float64)
  if len(gold) < 2 or np.ptp(gold) == 0 or np.ptp(scores) == 0:
    return {"spearman": 0.0, "pearson": 0.0}  # undefined: a constant side
  return {"spearman": float(stats.spearmanr(scores, gold)[0]), "pearson": float(stats.pearsonr(scores, gold)[0])}


def retrieval_metrics(queries: np.ndarray, corpus: np.ndarray, relevant: Sequence[Sequence[int]],
                      k: int = 10) -> dict[str, float]:
  """Mean MRR@k, nDCG@k (binary relevance), recall@1 and recall@k of `queries` [Q, D] ranking `corpus` [C, D] by
  cosine similarity; `relevant[i]` holds the corpus rows relevant to query i. Ties rank in corpus order."""
  q, c = unit(queries), unit(corpus)
  top = min(k, len(c))
  mrr, ndcg, recall_1, recall_k = [], [], [], []
  for start in range(0, len(q), _CHUNK):
    scores = q[start:start + _CHUNK] @ c.T  # [chunk, C]
    ranked = np.argsort(-scores, axis=1, kind="stable")[:, :top]  # [chunk, k]
    for row, hits in enumerate(ranked):
      wanted = set(relevant[start + row])
      found = np.array([h in wanted for h in hits], np.float64)  # [k]
      first = np.flatnonzero(found)
      mrr.append(1.0 / (first[0] + 1) if len(first) else 0.0)
      discounts = 1.0 / np.log2(np.arange(2, top + 2))
      ideal = discounts[:min(len(wanted), top)].sum()
      ndcg.append(float(found @ discounts) / ideal if ideal else 0.0)
      recall_1.append(found[:1].sum() / max(len(wanted), 1))
      recall_k.append(found.sum() / max(len(wanted), 1))
  mean = lambda xs: float(np.mean(xs)) if xs else 0.0
  return {f"mrr@{k}": mean(mrr), f"ndcg@{k}": mean(ndcg), "recall@1": mean(recall_1), f"recall@{k}": mean(recall_k)}


def triplet_accuracy(anchors: np.ndarray, positives: np.ndarray, negatives: np.ndarray) -> float:
  a, p, n = (np.asarray(x, np.float64) for x in (anchors, positives, negatives))
  return float(np.mean(np.linalg.norm(a - p, axis=-1) < np.linalg.norm(a - n, axis=-1))) if len(a) else 0.0
