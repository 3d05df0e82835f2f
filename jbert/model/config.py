"""BertConfig: the fields of BERT's `config.json` plus jbert's runtime choices.

Pure Python (no JAX) so that tools reading configs stay cheap.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

from jbert import errors, untrusted
from jbert.model import families

ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
POOLER_ACTIVATIONS = ("tanh", "gelu", "relu")
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "splash", "einsum")
DTYPES = ("float32", "bfloat16", "float16")

# BERT's config.json fields, in the order jbert writes them (a family writes its own, `families`).
HF_FIELDS = families.family.BERT_WRITTEN
# What sets a family apart (`jbert.model.families`): implied by config.json's model_type, BERT's values by default.
FAMILY_FIELDS = ("model_type", "embedding_size", "position_offset", "use_token_types", "use_pooler", "pooler_act",
                 "pooler_dropout", "lm_head_act", "token_dropout")
# ModernBERT's architecture (`jbert.model.families.modernbert`), as data the layers read; BERT's values by default.
ARCHITECTURE_FIELDS = ("pre_norm", "rope_theta", "local_rope_theta", "local_attention", "layer_types", "gated_mlp",
                       "attention_bias", "mlp_bias", "norm_bias", "head_bias", "decoder_bias", "pooler_norm",
                       "pooling", "token_head", "initializer_cutoff_factor", "scaled_init")
LAYER_TYPES = ("full_attention", "sliding_attention")
POOLINGS = ("cls", "mean")
RUNTIME_FIELDS = ("dtype", "param_dtype", "scan_layers", "remat_policy", "attention_impl")


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """BERT hyper-parameters (names as in `config.json`) and runtime options.

  Runtime fields: `dtype` is the compute dtype, `param_dtype` the storage dtype of parameters,
  `scan_layers` stacks the encoder layers under `nn.scan`, `remat_policy` picks what the backward pass
  recomputes, `attention_impl` picks the attention kernel (`jbert.model.attention`: "auto" = the platform's
  fastest exact kernel, "xla"/"cudnn" = `jax.nn.dot_product_attention`, "splash" = Pallas splash attention on
  TPU, "einsum" = explicit softmax; training with attention dropout always takes einsum).
  """
  vocab_size: int = 30522
  hidden_size: int = 768
  num_hidden_layers: int = 12
  num_attention_heads: int = 12
  intermediate_size: int = 3072
  hidden_act: str = "gelu"
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  initializer_range: float = 0.02
  pad_token_id: int = 0
  classifier_dropout: float | None = None
  qa_dropout: float | None = None  # dropout before qa_outputs (DistilBERT's qa_dropout); None: none (BERT's)
  # Family fields, set from config.json by the model_type's family (`jbert.model.families`):
  model_type: str = "bert"  # transformers' model_type, written back to config.json; picks the weight names
  embedding_size: int | None = None  # width of the embeddings (ELECTRA), projected to hidden_size; None: the same
  position_offset: int = 0  # > 0: fairseq's positions, from it over the non-padding tokens (RoBERTa: pad + 1)
  use_token_types: bool = True  # False: no token type embeddings, token_type_ids ignored (DistilBERT)
  use_pooler: bool = True  # whether the bare encoder (BertModel) has the [CLS] pooler
  pooler_act: str = "tanh"  # the pooler's activation: BERT's tanh, ELECTRA's gelu, DistilBERT's pre_classifier relu
  pooler_dropout: bool = False  # sequence classification drops out [CLS] before the pooler (RoBERTa, ELECTRA)
  lm_head_act: str | None = None  # the MLM head's activation; None: hidden_act (RoBERTa and ELECTRA: gelu)
  token_dropout: str = "classifier"  # the token classifier's dropout: "classifier" (classifier_dropout, else
                                     # hidden_dropout_prob) or "hidden" (hidden_dropout_prob: DistilBERT's)
  # Architecture fields (ModernBERT's values from its family), each read in one place:
  pre_norm: bool = False  # layers.BertLayer: LayerNorm before attention and MLP, a final_norm after the last layer
  rope_theta: float | None = None  # rotary positions (rotary.py) with this base, no position table; None: a table
  local_rope_theta: float | None = None  # the rotary base of sliding-window layers; None: rope_theta
  local_attention: int | None = None  # sliding-window layers attend within local_attention // 2 tokens each side
  layer_types: tuple[str, ...] | None = None  # per layer "full_attention" or "sliding_attention"; None: all full
  gated_mlp: bool = False  # GeGLU: wi gives an input and a gate [.., 2, F]; hidden_act(input) * gate
  attention_bias: bool = True  # biases of query, key, value and out
  mlp_bias: bool = True  # biases of wi and wo
  norm_bias: bool = True  # every LayerNorm's bias
  head_bias: bool = True  # the bias of the pooler's dense and the MLM transform
  decoder_bias: bool = True  # the MLM head's output bias
  pooler_norm: bool = False  # a LayerNorm after the pooler's activation (ModernBERT's prediction head)
  pooling: str = "cls"  # what the pooler reads: "cls" (a sequence's first token) or "mean" (its tokens' mean)
  token_head: bool = False  # token classification and QA read every token through the pooler (ModernBERT's head)
  initializer_cutoff_factor: float | None = None  # new weights' normal cut at this many std devs; None: not cut
  scaled_init: bool = False  # new out-projections at initializer_range / sqrt(2L), classifiers at H^-0.5
  # Runtime fields: not part of a Hugging Face config.json.
  dtype: str = "float32"
  param_dtype: str = "float32"
  scan_layers: bool = False
  remat_policy: str = "none"
  attention_impl: str = "auto"

  def __post_init__(self):
    if isinstance(self.layer_types, list):  # read from JSON; a frozen config is hashed (jit's static arguments)
      object.__setattr__(self, "layer_types", tuple(self.layer_types))
    _check_choice("hidden_act", self.hidden_act, ACTIVATIONS)
    _check_choice("remat_policy", self.remat_policy, REMAT_POLICIES)
    _check_choice("attention_impl", self.attention_impl, ATTENTION_IMPLS)
    _check_choice("dtype", self.dtype, DTYPES)
    _check_choice("param_dtype", self.param_dtype, DTYPES)
    _check_choice("model_type", self.model_type, families.model_types())
    _check_choice("pooler_act", self.pooler_act, POOLER_ACTIVATIONS)
    _check_choice("token_dropout", self.token_dropout, ("classifier", "hidden"))
    if self.lm_head_act is not None:
      _check_choice("lm_head_act", self.lm_head_act, ACTIVATIONS)
    wrong = {k: v for k, v in self.family.implied(dataclasses.asdict(self)).items() if getattr(self, k) != v}
    if wrong:
      raise ValueError(
          f"BertConfig(model_type={self.model_type!r}) needs " + ", ".join(f"{k}={v!r}" for k, v in wrong.items())
          + f"; build it with BertConfig.from_dict({{'model_type': {self.model_type!r}, ...}}), which sets them.")
    if self.embedding_size is not None and (isinstance(self.embedding_size, bool) or not isinstance(
        self.embedding_size, int) or self.embedding_size <= 0):
      raise ValueError(f"BertConfig.embedding_size must be a positive int or None, got "
                       f"{errors.preview(self.embedding_size)}.")
    if isinstance(self.position_offset, bool) or not isinstance(self.position_offset, int) or not (
        0 <= self.position_offset < self.max_position_embeddings):
      raise ValueError(f"BertConfig.position_offset={errors.preview(self.position_offset)} must be an int in [0, "
                       f"max_position_embeddings={self.max_position_embeddings}); RoBERTa's is pad_token_id + 1.")
    self._check_architecture()
    if self.attention_impl == "cudnn" and self.dtype == "float32":
      raise ValueError("BertConfig.attention_impl='cudnn' computes in bfloat16 or float16 (cuDNN's flash attention "
                       "has no float32 kernel); set dtype='bfloat16', or attention_impl='auto' or 'xla'.")
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings", "type_vocab_size"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"BertConfig.{name} must be a positive int, got {errors.preview(value)}.")
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(
          f"BertConfig.hidden_size={self.hidden_size} is not a multiple of num_attention_heads="
          f"{self.num_attention_heads}; pick a head count that divides the hidden size.")
    for name in ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout", "qa_dropout"):
      value = getattr(self, name)
      if value is not None and (not _is_number(value) or not 0.0 <= value < 1.0):
        raise ValueError(f"BertConfig.{name} must lie in [0, 1), got {errors.preview(value)}.")
    if not all(_is_number(v) and v > 0 for v in (self.layer_norm_eps, self.initializer_range)):
      raise ValueError(
          f"BertConfig.layer_norm_eps ({errors.preview(self.layer_norm_eps)}) and initializer_range "
          f"({errors.preview(self.initializer_range)}) must be positive numbers.")

  def _check_architecture(self) -> None:
    _check_choice("pooling", self.pooling, POOLINGS)
    if self.layer_types is not None:
      if len(self.layer_types) != self.num_hidden_layers or any(t not in LAYER_TYPES for t in self.layer_types):
        raise ValueError(f"BertConfig.layer_types={errors.preview(self.layer_types)} must name each of the "
                         f"num_hidden_layers={self.num_hidden_layers} layers {' or '.join(LAYER_TYPES)}.")
      if "sliding_attention" in self.layer_types and (
          isinstance(self.local_attention, bool) or not isinstance(self.local_attention, int)
          or self.local_attention < 2):
        raise ValueError(f"BertConfig.local_attention={errors.preview(self.local_attention)} must be an int >= 2 "
                         "(the window of the sliding_attention layers, local_attention // 2 tokens each side).")
    for name in ("rope_theta", "local_rope_theta", "initializer_cutoff_factor"):
      value = getattr(self, name)
      if value is not None and (not _is_number(value) or value <= 0):
        raise ValueError(f"BertConfig.{name} must be a positive number or None, got {errors.preview(value)}.")
    if self.local_rope_theta is not None and self.rope_theta is None:
      raise ValueError("BertConfig.local_rope_theta needs rope_theta (rotary positions on the global layers).")
    if self.scan_layers and not self.scannable:
      raise ValueError(f"BertConfig.scan_layers=True is not supported for {self.model_type} (its layers differ: "
                       "the first has no attention norm, local and global layers alternate); set "
                       "scan_layers=False.")

  @property
  def scannable(self) -> bool:
    """Whether every layer is one program, which `nn.scan` stacks: not ModernBERT's, whose layer 0 has no attention
    norm and whose windows and rotary bases alternate (each would be another program)."""
    return not self.pre_norm and len(set(self.layer_types or ())) <= 1

  def layer_window(self, index: int) -> int | None:
    """How many tokens on either side layer `index` attends to: local_attention // 2 on a sliding_attention
    layer, None (every key) on a full_attention one."""
    if self.layer_types is None or self.layer_types[index] != "sliding_attention":
      return None
    return self.local_attention // 2

  def layer_rope_theta(self, index: int) -> float | None:
    """The rotary base of layer `index` (local_rope_theta on sliding-window layers), or None: no rotary."""
    if self.layer_window(index) is not None and self.local_rope_theta is not None:
      return self.local_rope_theta
    return self.rope_theta

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads

  @property
  def embedding_width(self) -> int:
    """The width of the embedding tables: `embedding_size`, else hidden_size."""
    return self.embedding_size or self.hidden_size

  @property
  def max_length(self) -> int:
    """The longest sequence the position table holds: RoBERTa's first position_offset rows serve padding."""
    return self.max_position_embeddings - self.position_offset

  @property
  def reads_token_types(self) -> bool:
    """Whether token_type_ids select rows of the token type table. A model with one token type (RoBERTa, XLM-R:
    type_vocab_size 1) reads every token as type 0 whatever the ids say, so a pair's second segment is type 0 as
    transformers' tokenizers give it for these families, whichever tokenizer or data pipeline made the ids."""
    return self.use_token_types and self.type_vocab_size > 1

  @property
  def family(self) -> families.Family:
    return families.of(self.model_type)

  def replace(self, **changes) -> BertConfig:
    return dataclasses.replace(self, **changes)

  @classmethod
  def from_preset(cls, name: str, **overrides) -> BertConfig:
    """A named size (see `PRESETS`), with any field overridden."""
    if name not in PRESETS:
      raise ValueError(f"Unknown BERT preset {name!r}; choose one of {', '.join(PRESETS)}.")
    return dataclasses.replace(PRESETS[name], **overrides)

  @classmethod
  def from_dict(cls, d: Mapping[str, Any], **overrides) -> BertConfig:
    """Known fields from `d`, read as its `model_type`'s family reads them (`jbert.model.families`: DistilBERT's
    `dim` is hidden_size, RoBERTa's positions start at pad_token_id + 1); no model_type is BERT (an original
    bert_config.json). Other Hugging Face extras (architectures, ...) are ignored; a model_type jbert does not
    compute is a ValueError naming the supported ones.

    Runtime fields are read only from a full jbert dict (one with `param_dtype`): in a Hugging Face
    config.json the key `dtype` names the stored torch dtype and must not change the compute dtype.
    """
    model_type = d.get("model_type", "bert")
    family = families.of(model_type)
    if d.get("position_embedding_type", "absolute") != "absolute":
      raise ValueError(
          f"position_embedding_type={errors.preview(d['position_embedding_type'])} is not supported; jbert implements "
          "BERT's absolute position embeddings only.")
    known = (HF_FIELDS + ("embedding_size", "qa_dropout") + ARCHITECTURE_FIELDS
             + (RUNTIME_FIELDS if "param_dtype" in d else ()))
    kwargs = {**family.fields(d, known), "model_type": model_type}
    kwargs.update(overrides)
    return cls(**kwargs)

  @classmethod
  def from_json_file(cls, path: str | os.PathLike, **overrides) -> BertConfig:
    """Reads `config.json` / `bert_config.json`; a directory is searched for either, in that order."""
    path = os.fspath(path)
    if os.path.isdir(path):
      candidates = [os.path.join(path, n) for n in ("config.json", "bert_config.json")]
      found = [p for p in candidates if os.path.isfile(p)]
      if not found:
        raise FileNotFoundError(f"No config.json or bert_config.json in {path}.")
      path = found[0]
    return cls.from_dict(read_json_file(path), **overrides)

  def to_dict(self, full: bool = False) -> dict[str, Any]:
    """Hugging Face config fields of the family (its names), with `model_type`; `full=True` adds the runtime
    fields."""
    d = self.family.config_json({**dataclasses.asdict(self), "embedding_size": self.embedding_width},
                                self.model_type)
    if full:
      d.update({k: getattr(self, k) for k in RUNTIME_FIELDS})
    return d

  def save(self, path: str | os.PathLike, full: bool = False) -> None:
    """Writes `to_dict(full)` as JSON to the file `path`."""
    with open(path, "w", encoding="utf-8") as f:
      json.dump(self.to_dict(full=full), f, indent=2, sort_keys=True)
      f.write("\n")


def read_json_file(path: str | os.PathLike) -> dict[str, Any]:
  """The JSON object in `path`; a ValueError naming the file and what is wrong with it otherwise."""
  path = os.fspath(path)
  try:
    value = json.loads(untrusted.read_bytes(path))  # A regular file, read up to its size.
  except json.JSONDecodeError as e:
    what = "is empty" if not e.doc.strip() else f"is not valid JSON ({e.msg} at line {e.lineno} column {e.colno})"
    raise ValueError(f"{path} {what}: the file is truncated or corrupt; download or write it again.") from None
  except UnicodeDecodeError as e:
    raise ValueError(f"{path} is not a UTF-8 text file ({e.reason} at byte {e.start}): the file is corrupt or "
                     "not a JSON config; download or write it again.") from None
  if not isinstance(value, dict):
    raise ValueError(f"{path} holds a JSON {type(value).__name__}, not an object of config fields; use the "
                     "config.json written with the weights.")
  return value


def _is_number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_choice(field: str, value: Any, accepted: tuple[str, ...]) -> None:
  if not isinstance(value, str) or value not in accepted:
    raise ValueError(f"BertConfig.{field}={errors.preview(value)} is not supported; use one of "
                     f"{', '.join(accepted)}.")


def _preset(layers: int, hidden: int, heads: int) -> BertConfig:
  return BertConfig(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                    intermediate_size=4 * hidden)


# Sizes of Google's BERT release (Turc et al. 2019 for the small ones).
PRESETS: dict[str, BertConfig] = {
    "tiny": _preset(2, 128, 2),
    "mini": _preset(4, 256, 4),
    "small": _preset(4, 512, 8),
    "medium": _preset(8, 512, 8),
    "base": _preset(12, 768, 12),
    "large": _preset(24, 1024, 16),
}
