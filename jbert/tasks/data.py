"""The data role of the task contract (`jbert.tasks.base`): the training stream, the evaluation sets and the
layout of their batches (length buckets, packed rows), which the trainer feeds to the objective's steps.

  train_stream (abstract)  this process's training batches for its data shards (`jbert.data.streams.Stream`)
  eval_sets (abstract)     featurised evaluation and test splits (`EvalSet`; labelled ones are scored)
  num_train_examples       examples in an epoch (None: an endless corpus)
  buckets, packed_slots,   the layout of the batches: bucket lengths known up front, slots of a packed row (a
  eval_slots               fine-tuning task takes them from the run's data config, `finetuning.Batching`)
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any

import numpy as np

from jbert.data.streams import Stream


@dataclasses.dataclass
class EvalSet:
  """One evaluation (or test) split, featurised once.

  Attributes:
    name: the split's name (`validation`, `validation_matched`, `test`, ...).
    features: arrays with a shared leading dimension N, one row per model input row, in example order; may hold
      host-only arrays (offsets, ids, texts) that the task's `evaluate` reads.
    labelled: whether gold labels exist (GLUE test splits and unlabelled files have none: predictions only).
    examples: the raw examples, where the task's outputs need them (words, contexts; for classification the
      (text_a[, text_b]) texts of each row, for its prediction files); else None.
  """
  name: str
  features: dict[str, np.ndarray]
  labelled: bool
  examples: Any = None

  @property
  def num_rows(self) -> int:
    return len(next(iter(self.features.values()))) if self.features else 0


class TaskData(abc.ABC):
  """Where a task's batches come from and how they are laid out."""

  def packed_slots(self) -> int | None:
    """S, the sequences a packed fine-tuning row holds at most; None when its batches are not packed that way."""
    return None

  def eval_slots(self) -> int | None:
    """S of packed evaluation batches; None: evaluation batches are not packed."""
    return self.packed_slots()

  @abc.abstractmethod
  def train_stream(self, shards) -> Stream:
    """This process's training batches for the data shards of `shards` (`jbert.data.streams.DataShards`)."""

  def num_train_examples(self) -> int | None:
    """Examples in one epoch, where epochs mean something (fine-tuning); None for an endless corpus."""
    return None

  def buckets(self) -> tuple[int, ...] | None:
    """The sequence lengths of length-bucketed training and evaluation batches (`jbert.data.streams`), known
    up front; None: every batch has `max_seq_length`."""
    return None

  @abc.abstractmethod
  def eval_sets(self, shards) -> list[EvalSet]:
    """Featurised evaluation and test splits (labelled ones are scored during training); pretraining lays its
    held-out rows out by the data shards of `shards`."""
