"""What a family of BERT's relatives is, as data: `Family` (config.json translation and the fields it implies) and
`HeadNames` (a head's transformers class and weight names).

Pure Python, no JAX and no jbert imports: `jbert.model.config` reads it, and every module that differs by family
reads the BertConfig fields a family sets, never its `model_type`.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping


@dataclasses.dataclass(frozen=True)
class HeadNames:
  """Where one jbert head's weights live in a family's transformers state dict.

  Attributes:
    architecture: transformers' class, `{}` standing for the model type's class prefix ("{}ForMaskedLM").
    pooler: the module holding jbert's `bert/pooler` dense (BERT's "pooler.dense", RoBERTa's classification head
      "classifier.dense", DistilBERT's "pre_classifier"), or None when the head has no pooler.
    pooler_in_backbone: whether `pooler` sits under the backbone prefix (`roberta.pooler.dense`) or in the head.
    pooler_norm: the module of the LayerNorm after the pooler's activation (`BertConfig.pooler_norm`: ModernBERT's
      "head.norm"), or None.
    mlm: (transform dense, LayerNorm, output bias, tied decoder) modules of a masked-LM head, or None.
    linear: jbert head layer (first path element) -> transformers module, where it differs from BERT's name.
  """
  architecture: str
  pooler: str | None = None
  pooler_in_backbone: bool = False
  pooler_norm: str | None = None
  mlm: tuple[str, str, str, str] | None = None
  linear: Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Family:
  """One family of transformers' `model_type`s that jbert's BertModel computes.

  Attributes:
    model_types: the config.json `model_type`s it answers to (aliases share every weight name).
    class_prefixes: model_type -> the prefix of its transformers classes ("XLMRoberta").
    prefix: the backbone's state-dict prefix in a head's checkpoint ("roberta" -> `roberta.encoder...`).
    renames: config.json key -> BertConfig field, where they differ (DistilBERT's `dim` -> hidden_size).
    defaults: BertConfig fields a config.json that omits them implies (RoBERTa's layer_norm_eps 1e-5).
    fixed: BertConfig fields the family sets whatever config.json says (no pooler, the pooler's activation).
    derived: fields computed from the translated fields (RoBERTa's position_offset from pad_token_id).
    read: fields computed from config.json itself, for keys that are no one field (ModernBERT's rope_parameters,
      global_attn_every_n_layers); write: the config.json keys of such fields, from the BertConfig fields.
    written: BertConfig fields written to config.json (under their renamed keys), in order.
    extra: constant config.json keys transformers needs from this family (DistilBERT's sinusoidal_pos_embds).
    embeddings: jbert embedding module -> transformers module (the `embeddings_project` too).
    layer: a layer's transformers prefix, `{i}` its index; layer_parts: jbert layer module -> transformers module
      (ModernBERT's fused "qkv" instead of query, key and value; "mlp_norm" for a pre-norm layer's second norm).
    final_norm: the module of the LayerNorm after the last layer (`BertConfig.pre_norm`), or None.
    heads: jbert head class name (`jbert.model.registry`'s `Head.architecture`, BERT's transformers name) -> its
      HeadNames; heads the family lacks are absent.
  """
  model_types: tuple[str, ...]
  class_prefixes: Mapping[str, str]
  prefix: str
  written: tuple[str, ...]
  embeddings: Mapping[str, str]
  layer: str
  layer_parts: Mapping[str, str]
  heads: Mapping[str, HeadNames]
  renames: Mapping[str, str] = dataclasses.field(default_factory=dict)
  defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  derived: Callable[[dict[str, Any]], dict[str, Any]] | None = None
  read: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
  write: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
  extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  final_norm: str | None = None

  def fields(self, config_json: Mapping[str, Any], known: tuple[str, ...]) -> dict[str, Any]:
    """BertConfig keyword arguments from a config.json of this family: renamed keys, then the jbert names of
    `known` fields (so `BertConfig.from_dict` also takes jbert's own names), defaults, fixed and derived ones."""
    out = dict(self.defaults)
    out.update({k: config_json[k] for k in known if k in config_json and k not in self.fixed})
    out.update({field: config_json[key] for key, field in self.renames.items() if key in config_json})
    if self.read is not None:
      out.update(self.read(config_json))
    out.update(self.implied(out))
    return out

  def implied(self, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields the family sets whatever config.json says: fixed ones and those derived from `fields`."""
    out = dict(self.fixed)
    if self.derived is not None:
      out.update(self.derived({**fields, **out}))
    return out

  def config_json(self, fields: Mapping[str, Any], model_type: str) -> dict[str, Any]:
    """config.json keys of `fields` (BertConfig's, by name): the written ones renamed, the extras, model_type."""
    back = {field: key for key, field in self.renames.items()}
    out = {back.get(f, f): fields[f] for f in self.written}
    out.update(self.extra)
    if self.write is not None:
      out.update(self.write(fields))
    out["model_type"] = model_type
    return out

  def head_names(self, head: str) -> HeadNames:
    """The names of jbert's head class `head`; a ValueError naming the heads this family has when it lacks it."""
    if head not in self.heads:
      raise ValueError(f"{self.model_types[0]} models have no {head} head in transformers; this family's "
                       f"heads: {', '.join(self.heads)}.")
    return self.heads[head]

  def architecture(self, head: str, model_type: str) -> str:
    """transformers' class name of jbert's head class `head` for `model_type`. A head of jbert's own that no
    family has in transformers (SentenceEncoder: its folders record their modules instead) keeps its name."""
    if head not in self.heads and not any(head in f.heads for f in _FAMILIES.values()):
      return head
    return self.head_names(head).architecture.format(self.class_prefixes[model_type])


_FAMILIES: dict[str, Family] = {}  # by model_type


def register(family: Family) -> Family:
  """A family module's own entry; each model_type belongs to one family."""
  for model_type in family.model_types:
    if model_type in _FAMILIES and _FAMILIES[model_type] is not family:
      raise ValueError(f"model_type {model_type!r} is registered twice.")
    _FAMILIES[model_type] = family
  return family


def model_types() -> tuple[str, ...]:
  """Every supported `model_type`, in registration order."""
  return tuple(_FAMILIES)


def of(model_type: str) -> Family:
  """The family of `model_type`; a ValueError naming the supported ones otherwise (a folder of a family jbert does
  not compute is refused before anything is read or built)."""
  if not isinstance(model_type, str) or model_type not in _FAMILIES:
    raise ValueError(f"model_type {model_type!r} is not supported: jbert computes the model types "
                     f"{', '.join(model_types())}.")
  return _FAMILIES[model_type]


def architectures() -> dict[str, str]:
  """transformers class name -> jbert head class name, over every family and model type."""
  out = {}
  for model_type, family in _FAMILIES.items():
    for head, names in family.heads.items():
      out[names.architecture.format(family.class_prefixes[model_type])] = head
  return out



# BERT's module names, which RoBERTa and ELECTRA keep.
BERT_EMBEDDINGS = {"word_embeddings": "embeddings.word_embeddings",
                   "position_embeddings": "embeddings.position_embeddings",
                   "token_type_embeddings": "embeddings.token_type_embeddings", "norm": "embeddings.LayerNorm",
                   "embeddings_project": "embeddings_project"}
BERT_LAYER = "encoder.layer.{i}"
BERT_LAYER_PARTS = {"query": "attention.self.query", "key": "attention.self.key", "value": "attention.self.value",
                    "out": "attention.output.dense", "attention_norm": "attention.output.LayerNorm",
                    "wi": "intermediate.dense", "wo": "output.dense", "output_norm": "output.LayerNorm"}
# The fields of BERT's config.json, in the order jbert writes them.
BERT_WRITTEN = (
    "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
    "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
    "type_vocab_size", "layer_norm_eps", "initializer_range", "pad_token_id", "classifier_dropout",
)
