"""Sentence(-pair) classification and regression: GLUE-style features and metrics.

Features follow google-research/bert `run_classifier.py`: `[CLS] a [SEP] b [SEP]`, the pair truncated one
token at a time from the longer side (the second on ties; `Tokenizer.build_inputs`), then padded to
`max_seq_length`.
"""
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from jbert.data.finetune.examples import as_text, require_keys


def classification_features(examples: Iterable[Mapping[str, Any]], tokenizer, max_seq_length: int, *,
                            text_keys: Sequence[str], label_key: str | None = "label",
                            regression: bool = False, id_key: str | None = "idx") -> dict[str, np.ndarray]:
  """Tokenised, packed, padded features of (sentence or sentence pair, label) examples.

  Args:
    examples: dicts with `text_keys` (one or two) and, when `label_key` is set, a label (int class index, or
      float for regression; GLUE test sets carry -1).
    tokenizer: a `jbert.tokenizer.Tokenizer`.
    max_seq_length: padded length T, including [CLS] and [SEP]s.
    text_keys: one key (single sentence) or two keys (pair).
    label_key: the label key, or None for unlabelled data (labels then are -1).
    regression: float32 labels instead of int32.
    id_key: key of an integer example id (TFDS GLUE `idx`); missing ids become the running index.

  Returns:
    int32 `input_ids, token_type_ids, attention_mask` [N, T], `label` [N] (int32, float32 if regression) and
    int32 `example_id` [N].
  """
  if len(text_keys) not in (1, 2):
    raise ValueError(f"text_keys must name one or two text fields, got {list(text_keys)}.")
  examples = list(examples)
  if examples:
    require_keys(examples[0], [*text_keys, *([label_key] if label_key else [])])
  texts = [[as_text(ex[k]) for ex in examples] for k in text_keys]
  pieces = [tokenizer.batch_ids(t) for t in texts]
  n = len(examples)
  input_ids = np.full((n, max_seq_length), tokenizer.pad_id, np.int32)
  token_type_ids = np.zeros((n, max_seq_length), np.int32)
  attention_mask = np.zeros((n, max_seq_length), np.int32)
  for i in range(n):
    packed = tokenizer.build_inputs(pieces[0][i], pieces[1][i] if len(pieces) == 2 else None, max_seq_length)
    length = len(packed["input_ids"])
    input_ids[i, :length] = packed["input_ids"]
    token_type_ids[i, :length] = packed["token_type_ids"]
    attention_mask[i, :length] = 1
  label_dtype = np.float32 if regression else np.int32
  labels = [ex[label_key] if label_key else -1 for ex in examples]
  ids = [int(ex[id_key]) if id_key and id_key in ex else i for i, ex in enumerate(examples)]
  return {
      "input_ids": input_ids,
      "token_type_ids": token_type_ids,
      "attention_mask": attention_mask,
      "label": np.asarray(labels, label_dtype).reshape(n),
      "example_id": np.asarray(ids, np.int32).reshape(n),
  }


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
