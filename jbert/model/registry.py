"""The one list of BERT heads: each head's class, pooler, Hugging Face names, dummy input and outputs.

Each head module registers its classes where it defines them (`@registry.register(...)`); everything that must
know every head (lazy exports, weight mapping, `load_pretrained`, `convert`, the trainer's tasks) reads the
registry, so adding a head is its module and one import in `jbert.model`.
"""
from __future__ import annotations

import dataclasses

from jbert.model import families


@dataclasses.dataclass(frozen=True)
class HeadWeight:
  """One linear head weight: transformers' module name, jbert's param path, its output size (an int, or
  "C" for `num_labels`)."""
  hf: str
  path: tuple[str, ...]
  outputs: int | str

  def size(self, config, num_labels: int | None) -> int | None:
    """The output size: "C" is `num_labels`, "H" the config's hidden size."""
    return num_labels if self.outputs == "C" else config.hidden_size if self.outputs == "H" else self.outputs


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
    return "mlm_logits" in self.outputs

  def model_kwargs(self, num_labels: int | None) -> dict[str, int]:
    """Constructor keyword arguments beyond the config: `num_labels` where the head takes a chosen one."""
    if not self.labelled or num_labels is None:
      return {}
    return {"num_labels": int(num_labels)}


_HEADS: dict[type, Head] = {}  # by class, in registration order


def register(key: str, *, pooler: bool, num_labels: int | None = None,
             linear_weights: tuple[HeadWeight, ...] = (), dummy_shape: tuple[int, ...] = (1, 8),
             outputs: tuple[str, ...] = ()):
  """Class decorator: the head module's own entry (see `Head` for the fields). A head registers itself where it
  is defined; `jbert.model` imports every head module, so the registry is complete once it is imported."""
  def add(cls: type) -> type:
    head_ = Head(cls, key, pooler, num_labels, tuple(linear_weights), tuple(dummy_shape), tuple(outputs))
    for other in _HEADS.values():
      if other.cls is not cls and (other.key == key or other.architecture == head_.architecture):
        raise ValueError(f"head {cls.__name__} ({key}): {other.cls.__module__}.{other.cls.__name__} is registered "
                         "with the same key or class name.")
    _HEADS[cls] = head_
    return cls
  return add


def heads() -> tuple[Head, ...]:
  """Every registered head, in registration order."""
  return tuple(_HEADS.values())


def head(model_cls: type) -> Head:
  """The registry entry of `model_cls`; a clear error for anything else."""
  if model_cls not in _HEADS:
    raise ValueError(f"{model_cls!r} is not a jbert BERT class; use one of "
                     f"{', '.join(h.architecture for h in heads())}.")
  return _HEADS[model_cls]


def by_key(key: str) -> Head:
  """The head of a command-line key (`python -m jbert.convert --model=KEY`)."""
  found = next((h for h in heads() if h.key == key), None)
  if found is None:
    raise ValueError(f"unknown head {key!r}; one of {', '.join(keys())}.")
  return found


def keys() -> tuple[str, ...]:
  return tuple(h.key for h in heads())


def by_architecture(names) -> Head | None:
  """The first head named in a config.json `architectures` list (transformers' class names of any family:
  `RobertaForSequenceClassification` is BertForSequenceClassification), or None."""
  found = {h.architecture: h for h in heads()}
  found.update({name: found[head] for name, head in families.architectures().items() if head in found})
  return next((found[n] for n in names or () if isinstance(n, str) and n in found), None)
