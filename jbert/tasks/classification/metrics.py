"""Sentence(-pair) classification and regression: GLUE's metrics, the evaluation loss and a classifier's report."""
from collections.abc import Sequence
from typing import Any

import numpy as np


def classification_metrics(names: Sequence[str], predictions: np.ndarray,
                           labels: np.ndarray) -> dict[str, float]:
  """GLUE metrics by name: accuracy, f1 (positive class 1), matthews_corr, pearson, spearman.

  `predictions` are class ids (or scores for pearson/spearman) [N]; `labels` the gold values [N].
  """
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  if predictions.shape != labels.shape:
    raise ValueError(f"predictions {predictions.shape} and labels {labels.shape} differ in shape.")
  fns = {"accuracy": _accuracy, "f1": _binary_f1, "matthews_corr": _matthews_corr,
         "pearson": _pearson, "spearman": _spearman}
  unknown = [n for n in names if n not in fns]
  if unknown:
    raise ValueError(f"unknown metric(s) {unknown}; known: {sorted(fns)}.")
  return {n: float(fns[n](predictions, labels)) for n in names}


def classifier_report(predictions: np.ndarray, labels: np.ndarray, num_labels: int) -> dict[str, Any]:
  """Precision, recall and F1 as scikit-learn computes them, and the confusion matrix.

  Two classes: of the positive class (id 1), as `average="binary"`; more: unweighted means over the classes
  present in either array, as `average="macro"`; 0 where a ratio is undefined (sklearn's `zero_division`).
  `confusion_matrix[gold][predicted]` counts every class id in [0, num_labels).
  """
  predictions, labels = np.asarray(predictions, np.int64), np.asarray(labels, np.int64)
  matrix = np.zeros((num_labels, num_labels), np.int64)
  np.add.at(matrix, (labels, predictions), 1)
  classes = [1] if num_labels == 2 else np.union1d(predictions, labels)
  tp = matrix[classes, classes].astype(np.float64)
  predicted, gold = matrix.sum(0)[classes], matrix.sum(1)[classes]
  precision = np.divide(tp, predicted, out=np.zeros_like(tp), where=predicted > 0)
  recall = np.divide(tp, gold, out=np.zeros_like(tp), where=gold > 0)
  f1 = np.divide(2 * tp, predicted + gold, out=np.zeros_like(tp), where=(predicted + gold) > 0)
  return {"precision": float(precision.mean()), "recall": float(recall.mean()), "f1": float(f1.mean()),
          "confusion_matrix": matrix.tolist()}


def evaluation_loss(logits: np.ndarray, labels: np.ndarray, *, regression: bool) -> float:
  """The training loss over an evaluation set, in float64: mean cross-entropy of class logits [N, C], or mean
  squared error of a regressor's one logit [N, 1]."""
  logits, labels = np.asarray(logits, np.float64), np.asarray(labels)
  if not len(labels):
    return 0.0
  if regression:
    return float(np.mean((logits[:, 0] - labels.astype(np.float64)) ** 2))
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  return float(-np.mean(np.take_along_axis(log_probs, labels.astype(np.int64)[:, None], -1)))


def _accuracy(p: np.ndarray, y: np.ndarray) -> float:
  return float(np.mean(p == y)) if y.size else 0.0


def _binary_f1(p: np.ndarray, y: np.ndarray) -> float:
  tp = np.sum((p == 1) & (y == 1))
  denominator = np.sum(p == 1) + np.sum(y == 1)
  return 2.0 * tp / denominator if denominator else 0.0


def _matthews_corr(p: np.ndarray, y: np.ndarray) -> float:
  """Multiclass Matthews correlation (Gorodkin's R_K), as sklearn; 0 when undefined."""
  classes = np.union1d(p, y)
  c = np.zeros((len(classes), len(classes)), np.float64)
  np.add.at(c, (np.searchsorted(classes, y), np.searchsorted(classes, p)), 1)
  t_sum, p_sum, correct, s = c.sum(1), c.sum(0), np.trace(c), c.sum()
  cov_yp = correct * s - t_sum @ p_sum
  denominator = np.sqrt((s * s - p_sum @ p_sum) * (s * s - t_sum @ t_sum))
  return cov_yp / denominator if denominator else 0.0


def _pearson(p: np.ndarray, y: np.ndarray) -> float:
  p, y = p.astype(np.float64) - p.mean(), y.astype(np.float64) - y.mean()
  denominator = np.sqrt((p @ p) * (y @ y))
  return (p @ y) / denominator if denominator else 0.0


def _spearman(p: np.ndarray, y: np.ndarray) -> float:
  return _pearson(_average_ranks(p), _average_ranks(y))


def _average_ranks(x: np.ndarray) -> np.ndarray:
  """1-based ranks with ties sharing their mean rank (scipy.stats.rankdata's default)."""
  _, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
  ends = np.cumsum(counts)
  return ((ends - (counts - 1) / 2.0)[inverse.reshape(-1)]).astype(np.float64)
