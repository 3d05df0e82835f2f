"""Cross-encoders (re-rankers): sentence-pair classification with one logit, trained and exported as
sentence-transformers' `CrossEncoder` trains and saves them (`configs/finetune.py:cross_encoder`).

The model is `BertForSequenceClassification` with `num_labels=1` on `[CLS] a [SEP] b [SEP]`; what differs from
the regression task is the loss, the score and the exported folder:

  task.loss=bce   mean `BCEWithLogits(logit, label)` on labels in [0, 1] (0/1, or soft): sentence-transformers'
                  `BinaryCrossEntropyLoss` (its default `activation_fn=Identity`), i.e. `torch.nn.BCEWithLogitsLoss`
  task.loss=mse   mean `(sigmoid(logit) - label)^2` on scores in [0, 1]: sentence-transformers'
                  `MSELoss(activation_fn=torch.nn.Sigmoid())`

Either way the score of a pair is `sigmoid(logit)`, what `CrossEncoder.predict` returns for a one-label model.
Evaluation reports what a re-ranker's user reads: for 0/1 labels accuracy, precision, recall and F1 at score 0.5
and average precision (scikit-learn's); for other scores Pearson and Spearman; and the loss.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import finetune
from jbert.tasks.base import Weighted

LOSSES = ("bce", "mse")


def config_section() -> dict:
  """The cross-encoder's own `task` key (beside text_a, text_b and label)."""
  return {
      "loss": "bce",                          # bce: BCE with logits on labels in [0, 1] (sentence-transformers'
                                              # BinaryCrossEntropyLoss); mse: MSE of sigmoid(logit) on scores in
                                              # [0, 1] (its MSELoss with activation_fn=Sigmoid)
  }


def check_loss(loss: str) -> None:
  if loss not in LOSSES:
    raise ValueError(f"task.loss={loss!r}; a cross-encoder trains with one of {', '.join(LOSSES)} (bce: 0/1 or "
                     "soft labels; mse: scores in [0, 1]).")


def check_labels(labels: np.ndarray, path: str) -> None:
  """Labels must be probabilities: a BCE or sigmoid target outside [0, 1] cannot be reached."""
  bad = np.flatnonzero(~((labels >= 0) & (labels <= 1)))
  if len(bad):
    raise ValueError(f"task cross_encoder: row {int(bad[0])} of {path} has label {float(labels[bad[0]])}, outside "
                     "[0, 1]; a cross-encoder's labels are 0/1 or scores in [0, 1]: rescale the column (STS-B's "
                     "0-5 scores divided by 5).")


# -- losses (traced) --


def loss(kind: str, logits: jax.Array, labels: jax.Array, rows: jax.Array) -> dict[str, Weighted]:
  """The loss of one-logit outputs [B, 1] and (bce) the predictions on the label's side of 0.5, per pair."""
  import optax  # pylint: disable=g-import-not-at-top
  x, y = logits[:, 0].astype(jnp.float32), labels.astype(jnp.float32)  # [B]
  if kind == "mse":
    error = jax.nn.sigmoid(x) - y
    return {"loss": Weighted(jnp.sum(error * error), rows)}
  correct = ((x > 0) == (y > 0.5)).astype(jnp.float32)
  return {"loss": Weighted(jnp.sum(optax.sigmoid_binary_cross_entropy(x, y)), rows),
          "accuracy": Weighted(jnp.sum(correct), rows)}


# -- scores and evaluation (host) --


def scores(logits, activation: str) -> np.ndarray:
  """float64 scores [N] of one-logit outputs [N, 1] through the recorded activation."""
  x = np.asarray(logits, np.float64)[:, 0]
  return 1.0 / (1.0 + np.exp(-x)) if activation == "sigmoid" else x


def evaluate(loss: str, logits, gold) -> dict[str, float]:
  """Metrics of one labelled split (see the module docstring)."""
  x, y = np.asarray(logits, np.float64)[:, 0], np.asarray(gold, np.float64)
  p = scores(logits, "sigmoid")
  if loss == "mse":
    value = np.mean((p - y) ** 2)
  else:  # BCE with logits, stably: max(x, 0) - x*y + log(1 + exp(-|x|)).
    value = np.mean(np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x))))
  if np.all((y == 0) | (y == 1)):
    predicted, labels = (p > 0.5).astype(np.int64), y.astype(np.int64)
    report = finetune.classifier_report(predicted, labels, 2)
    metrics = {"accuracy": float(np.mean(predicted == labels)), "f1": report["f1"],
               "precision": report["precision"], "recall": report["recall"],
               "average_precision": average_precision(p, labels)}
  else:
    metrics = finetune.classification_metrics(("pearson", "spearman"), p, y)
  return {**metrics, "loss": float(value) if len(y) else 0.0}


def average_precision(scores_: np.ndarray, labels: np.ndarray) -> float:
  """scikit-learn's `average_precision_score`: sum over score thresholds of (R_n - R_{n-1}) * P_n, tied scores
  forming one threshold; 0 without positives."""
  scores_, labels = np.asarray(scores_, np.float64), np.asarray(labels) == 1
  positives = labels.sum()
  if not positives:
    return 0.0
  order = np.argsort(-scores_, kind="stable")
  s, hits = scores_[order], labels[order]
  last = np.r_[np.flatnonzero(np.diff(s)), len(s) - 1]  # The last row of each group of tied scores.
  tp = np.cumsum(hits)[last]
  precision, recall = tp / (last + 1), tp / positives
  return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))
