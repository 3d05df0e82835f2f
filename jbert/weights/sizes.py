"""How big a model a config asks for, against what its weight files can hold, checked before anything is built.

A config.json is a few numbers that anyone can edit; the weights beside it are what the model really is. A folder
whose config.json asked for `num_hidden_layers: 1000000` used to take 54 s and 7.2 GB before its error, which then
listed 16 million missing weight names. So every size the config sets (vocabulary, width, layers, feed-forward,
positions, labels) is bounded first by what the weight files can hold: the stored values where the format lists
its tensors without reading them (safetensors headers, a jbert directory's Orbax metadata, a state dict already
read), else the bytes on disk at two bytes a value (float16, the narrowest float BERT checkpoints store).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Mapping

from jbert import errors
from jbert.model import BertConfig

# The narrowest float a BERT checkpoint stores (float16/bfloat16): bytes on disk bound the values at this rate.
MIN_BYTES_PER_VALUE = 2


@dataclasses.dataclass(frozen=True)
class Stored:
  """What the weight files of a checkpoint hold, as far as can be told without reading the weights.

  Attributes:
    where: the weight file (or files, or folder), for messages.
    nbytes: their size on disk.
    shapes: tensor name -> shape, where the format lists them (safetensors header, Orbax metadata, a state dict
      read); None where only the bytes are known (pytorch_model.bin, TF1 data files).
  """
  where: str
  nbytes: int
  shapes: Mapping[str, tuple[int, ...]] | None = None

  @property
  def capacity(self) -> int:
    """The most values the files can hold."""
    if self.shapes is not None:
      return sum(math.prod(shape) for shape in self.shapes.values())
    return self.nbytes // MIN_BYTES_PER_VALUE

  def describe(self) -> str:
    if self.shapes is not None:
      return f"{self.where} holds {self.capacity:,} values"
    return f"{self.where} holds {self.nbytes:,} bytes (at most {self.capacity:,} values)"

  def rows(self, name: str) -> int | None:
    """The first dimension of tensor `name` (with or without transformers' `bert.` prefix), where listed."""
    for key in (name, f"bert.{name}"):
      if self.shapes is not None and key in self.shapes and self.shapes[key]:
        return int(self.shapes[key][0])
    return None


def backbone_values(config: BertConfig) -> int:
  """The values of the BertModel a config describes, without its pooler: the embeddings (words, positions unless
  rotary, token types, LayerNorm) and per layer the attention (Q, K, V, output), the feed-forward block (a GeGLU's
  input and gate) and two LayerNorms (a pre-norm stack: one on its first layer and a final one), biases where the
  config has them."""
  h, f, e = config.hidden_size, config.intermediate_size, config.embedding_width
  types = config.type_vocab_size if config.use_token_types else 0
  positions = config.max_position_embeddings if config.rope_theta is None else 0
  norm = 2 if config.norm_bias else 1  # values per width of a LayerNorm
  embeddings = (config.vocab_size + positions + types + norm) * e
  if e != h:  # ELECTRA's embeddings_project
    embeddings += e * h + h
  wi = 2 * f if config.gated_mlp else f
  layer = 4 * h * h + (4 * h if config.attention_bias else 0) + 2 * norm * h + wi * h + f * h + (
      wi + h if config.mlp_bias else 0)
  return embeddings + config.num_hidden_layers * layer


def check(config: BertConfig, stored: Stored, config_file: str, num_labels: int | None = None) -> None:
  """A ValueError when `config` (read from `config_file`) describes a model larger than `stored` can hold: the
  config does not belong to these weights, and building what it asks for could exhaust the machine."""
  need = backbone_values(config)
  # config.json, an original checkpoint's bert_config.json, or a training workdir's recorded config
  config_name = os.path.basename(config_file) if config_file.endswith(".json") else "config"
  if need > stored.capacity:
    sizes = ", ".join(f"{name}={getattr(config, name):,}" for name in (
        "vocab_size", "hidden_size", "num_hidden_layers", "intermediate_size", "max_position_embeddings",
        "type_vocab_size"))
    raise ValueError(f"{config_file} describes a BERT of {need:,} values ({sizes}) but {stored.describe()}: the "
                     "config does not belong to these weights, or they are incomplete; use the "
                     f"{config_name} written with them.")
  if num_labels is not None and num_labels * (config.hidden_size + 1) > stored.capacity:
    raise ValueError(f"{config_file} asks for num_labels={errors.preview(num_labels)}: a classifier of "
                     f"{num_labels * (config.hidden_size + 1):,} values, more than the whole checkpoint "
                     f"({stored.describe()}); use the {config_name} written with the weights.")
