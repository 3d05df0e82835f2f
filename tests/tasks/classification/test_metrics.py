"""GLUE's metrics (`jbert/tasks/classification/metrics.py`) on hand-computed values."""
import numpy as np
import pytest

from jbert.tasks.classification.metrics import classification_metrics


def test_classification_metrics_known_values():
  m = classification_metrics(("accuracy", "f1", "matthews_corr"), [1, 1, 0, 0, 1], [1, 0, 0, 1, 1])
  # tp=2 tn=1 fp=1 fn=1: F1 = 2*2/(3+3); MCC = (2*1 - 1*1) / sqrt(3*3*2*2).
  np.testing.assert_allclose([m["accuracy"], m["f1"], m["matthews_corr"]], [0.6, 4 / 6, 1 / 6])
  # sklearn's documented example.
  mcc = classification_metrics(("matthews_corr",), [1, 0, 1, 1], [1, 1, 1, 0])["matthews_corr"]
  np.testing.assert_allclose(mcc, -1 / 3)
  assert classification_metrics(("matthews_corr",), [1, 1, 1], [1, 1, 1])["matthews_corr"] == 0.0
  r = classification_metrics(("pearson", "spearman"), np.array([1.0, 2, 3, 4]), np.array([1.0, 3, 2, 4]))
  np.testing.assert_allclose([r["pearson"], r["spearman"]], [0.8, 0.8])
  # Tied predictions share the mean rank: ranks [1, 2.5, 2.5, 4] against [1, 2, 3, 4].
  tied = classification_metrics(("spearman",), [1, 2, 2, 3], [10, 20, 30, 40])["spearman"]
  np.testing.assert_allclose(tied, 4.5 / np.sqrt(4.5 * 5))
  with pytest.raises(ValueError, match=r"unknown metric\(s\) \['auc'\]"):
    classification_metrics(("auc",), [1], [1])
