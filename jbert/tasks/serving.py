"""The serving role of the task contract (`jbert.tasks.base`): host-side decoding of a split's per-row outputs,
its metrics and its output files (the prediction side of `jbert.predict` adds readers and records:
`finetuning.PredictingTask`).

  decode                host-side decoding of one split's outputs, once (SQuAD's answer search)
  evaluate (abstract)   metrics of one labelled split
  write_outputs         prediction (and submission) files of one split
"""
from __future__ import annotations

import abc
from typing import Any, Mapping

import numpy as np

from jbert.tasks.data import EvalSet


class Serving(abc.ABC):
  """What a task makes of its predictions on the host."""

  # Outputs of `predictions` with the sequence as axis 1: a bucketed evaluation pads them back to full length.
  token_outputs: tuple[str, ...] = ()

  def decode(self, eval_set: EvalSet, predictions: Mapping[str, np.ndarray]) -> Mapping[str, Any]:
    """Host-side decoding of one split's per-row outputs (SQuAD's answer search), done once per evaluation;
    `evaluate`, `records` and `write_outputs` read what it returns."""
    del eval_set
    return predictions

  @abc.abstractmethod
  def evaluate(self, eval_set: EvalSet, predictions: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Metrics of one labelled evaluation set from its predictions (one row per feature row, in order)."""

  def write_outputs(self, eval_set: EvalSet, predictions: Mapping[str, np.ndarray],
                    out_dir: str) -> list[str]:  # pylint: disable=unused-argument
    """Prediction files of one split in `out_dir`; returns their paths."""
    return []


def softmax(logits) -> np.ndarray:
  """float64 softmax over the last axis: the probabilities of prediction files and `jbert.predict`."""
  logits = np.asarray(logits, np.float64)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  return p / p.sum(-1, keepdims=True)
