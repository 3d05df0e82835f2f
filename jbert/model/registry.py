"""The one list of BERT heads: each head's class, pooler, Hugging Face names, dummy input and outputs.

Everything that must know every head (lazy exports, weight mapping, `load_pretrained`, `convert`, the trainer's
tasks) reads this table, so adding a head is one entry here plus its module.
"""
from __future__ import annotations

import dataclasses

from jbert.model.encoder import BertModel
from jbert.model.heads import (BertForMaskedLM, BertForMultipleChoice, BertForPreTraining,
                               BertForQuestionAnswering, BertForSequenceClassification,
                               BertForTokenClassification)
from jbert.model.sentence import SentenceEncoder


@dataclasses.dataclass(frozen=True)
class HeadWeight:
  """One linear head weight: transformers' module name, jbert's param path, its output size (an int, or
  "C" for `num_labels`)."""
  hf: str
  path: tuple[str, ...]
  outputs: int | str


@dataclasses.dataclass(frozen=True)
class Head:
  """A BERT head.

  Attributes:
    cls: the Flax module; its `__name__` is also transformers' class name (the `architectures` entry).
    key: the short name used on command lines (`python -m jbert.convert --model=KEY`).
    pooler: whether transformers builds this head with the [CLS] pooler (HF checkpoints map with no missing or
      unexpected weights only if this matches).
    num_labels: None when the user chooses the number of outputs; else the fixed value the class takes.
    linear_weights: the head's own linear layers (the MLM head's LayerNorm/transform/bias are mapped apart).
    dummy_shape: input_ids shape for `init` ([B, T], or [B, C, T] for multiple choice).
    outputs: the array fields of the head's output besides `last_hidden_state`/`pooled_output`.
  """
  cls: type
  key: str
  pooler: bool
  num_labels: int | None
  linear_weights: tuple[HeadWeight, ...]
  dummy_shape: tuple[int, ...]
  outputs: tuple[str, ...]

  @property
  def architecture(self) -> str:
    return self.cls.__name__

  @property
  def labelled(self) -> bool:
    """Whether the user chooses the number of outputs (and may name them)."""
    return any(w.outputs == "C" for w in self.linear_weights)

  @property
  def has_mlm(self) -> bool:
    return self.cls in (BertForPreTraining, BertForMaskedLM)

  def model_kwargs(self, num_labels: int | None) -> dict[str, int]:
    """Constructor keyword arguments beyond the config: `num_labels` where the head takes a chosen one."""
    if not self.labelled or num_labels is None:
      return {}
    return {"num_labels": int(num_labels)}


_CLASSIFIER = (HeadWeight("classifier", ("classifier",), "C"),)
HEADS: tuple[Head, ...] = (
    Head(BertModel, "base", True, None, (), (1, 8), ()),
    Head(BertForPreTraining, "pretraining", True, None, (HeadWeight("cls.seq_relationship", ("nsp",), 2),),
         (1, 8), ("mlm_logits", "nsp_logits")),
    Head(BertForMaskedLM, "masked_lm", False, None, (), (1, 8), ("mlm_logits",)),
    Head(BertForSequenceClassification, "sequence_classification", True, None, _CLASSIFIER, (1, 8),
         ("logits",)),
    Head(BertForTokenClassification, "token_classification", False, None, _CLASSIFIER, (1, 8), ("logits",)),
    Head(BertForQuestionAnswering, "question_answering", False, 2,
         (HeadWeight("qa_outputs", ("qa_outputs",), 2),), (1, 8), ("start_logits", "end_logits")),
    Head(BertForMultipleChoice, "multiple_choice", True, 1, (HeadWeight("classifier", ("classifier",), 1),),
         (1, 2, 8), ("logits",)),
    # Bi-encoders (`jbert.tasks.sentence_embedding`): the BertModel part maps as `bert`; the projection and the
    # SoftmaxLoss classifier are no transformers weights (an export writes sentence-transformers' modules).
    Head(SentenceEncoder, "sentence_encoder", False, None, (), (1, 2, 8), ("embeddings",)),
)
BY_CLASS = {h.cls: h for h in HEADS}
BY_KEY = {h.key: h for h in HEADS}
BY_ARCHITECTURE = {h.architecture: h for h in HEADS}
MODEL_CLASSES = tuple(h.cls for h in HEADS)


def head(model_cls: type) -> Head:
  """The registry entry of `model_cls`; a clear error for anything else."""
  if model_cls not in BY_CLASS:
    raise ValueError(f"{model_cls!r} is not a jbert BERT class; use one of "
                     f"{', '.join(h.architecture for h in HEADS)}.")
  return BY_CLASS[model_cls]


def by_architecture(names) -> Head | None:
  """The first head named in a config.json `architectures` list (transformers' class names), or None."""
  return next((BY_ARCHITECTURE[n] for n in names or () if n in BY_ARCHITECTURE), None)
