"""Name and layout mapping between transformers' state dicts (BERT and its relatives: the names come from the
config's family, `jbert.model.families`) and the jbert parameter tree.

torch Linear weights are [out, in] and become [in, out] kernels; query/key/value kernels are further split
into heads ([H, N*D] -> [H, N, D]) and the attention output kernel into [N, D, H]. A fused query/key/value
(ModernBERT's Wqkv [3*N*D, H]) is split into the three, a GeGLU's input and gate ([2*F, H]) become wi [H, 2, F].
The MLM decoder weight is tied to the word embeddings and the decoder bias to `cls.predictions.bias`, so neither
is a separate param.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import flax.linen as nn
import jax
import numpy as np

from jbert.model import BertConfig, BertForPreTraining, BertModel, families, registry, unstack_layers

# Buffers transformers may keep in a state dict; they are not weights.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")

# Dimension symbols of the expected shapes -> the config field that sets them.
_DIM_FIELDS = {"V": "vocab_size", "H": "hidden_size", "P": "max_position_embeddings", "S": "type_vocab_size",
               "F": "intermediate_size", "C": "num_labels", "E": "embedding_size", "Q": "hidden_size",
               "G": "intermediate_size"}
_QKV = ("query", "key", "value")


@dataclasses.dataclass(frozen=True)
class _Entry:
  hf: str  # Name without the family's backbone prefix (`bert.`, `roberta.`, ...) when `backbone`.
  path: tuple[str, ...]  # Path in the jbert tree.
  kind: str  # "copy" | "linear" (transpose) | "qkv" | "qkv_bias" | "out" | "fused_qkv[_bias]" | "gated[_bias]".
  dims: tuple[str | int, ...]  # Hugging Face shape in symbols of _DIM_FIELDS.
  backbone: bool  # Under the backbone prefix in a head's state dict.


@dataclasses.dataclass(frozen=True)
class _Tied:
  """A masked-LM head's decoder: its weight is the word embeddings, its bias the head's output bias."""
  weight: str
  bias: str  # the decoder's own bias name
  output_bias: str  # where the family keeps the output bias (DistilBERT: the decoder's bias itself)


def _head_names(config: BertConfig, model_cls: type) -> tuple[registry.Head, families.HeadNames]:
  head = registry.head(model_cls)
  return head, config.family.head_names(head.architecture)


def _entries(config: BertConfig, model_cls: type, num_labels: int, pooler: bool) -> list[_Entry]:
  family = config.family
  head, names = _head_names(config, model_cls)
  root = () if model_cls is BertModel else ("bert",)
  entries = []

  def add(hf, path, kind, dims, backbone=True, in_root=True):
    entries.append(_Entry(hf, (root if in_root else ()) + path, kind, dims, backbone))

  def norm(hf, path, dim="H", backbone=True, in_root=True):
    add(f"{hf}.weight", path + ("scale",), "copy", (dim,), backbone, in_root)
    if config.norm_bias:
      add(f"{hf}.bias", path + ("bias",), "copy", (dim,), backbone, in_root)

  def linear(hf, path, dims, backbone=True, kind="linear", in_root=True, bias=True):
    add(f"{hf}.weight", path + ("kernel",), kind, dims, backbone, in_root)
    if bias:
      bias_kind = {"qkv": "qkv_bias", "fused_qkv": "fused_qkv_bias", "gated": "gated_bias"}.get(kind, "copy")
      add(f"{hf}.bias", path + ("bias",), bias_kind, dims[:1], backbone, in_root)

  emb = family.embeddings
  tables = (("word", "V"),) + ((("position", "P"),) if config.rope_theta is None else ()) + (
      (("token_type", "S"),) if config.use_token_types else ())
  for table, dim in tables:
    add(f"{emb[f'{table}_embeddings']}.weight", ("embeddings", f"{table}_embeddings", "embedding"), "copy",
        (dim, "E"))
  norm(emb["norm"], ("embeddings", "norm"), "E")
  if config.embedding_width != config.hidden_size:
    linear(emb["embeddings_project"], ("embeddings_project",), ("H", "E"))
  parts = family.layer_parts
  attention_bias, mlp_bias = config.attention_bias, config.mlp_bias
  for i in range(config.num_hidden_layers):
    hf, path = family.layer.format(i=i), ("encoder", f"layer_{i}")
    if "qkv" in parts:  # one [3*N*D, H] projection (ModernBERT's Wqkv)
      linear(f"{hf}.{parts['qkv']}", path + ("attention",), ("Q", "H"), kind="fused_qkv", bias=attention_bias)
    else:
      for proj in _QKV:
        linear(f"{hf}.{parts[proj]}", path + ("attention", proj), ("H", "H"), kind="qkv", bias=attention_bias)
    linear(f"{hf}.{parts['out']}", path + ("attention", "out"), ("H", "H"), kind="out", bias=attention_bias)
    if not (config.pre_norm and i == 0):  # a pre-norm stack's first layer reads the embeddings' norm
      norm(f"{hf}.{parts['attention_norm']}", path + ("attention_norm",))
    if config.gated_mlp:
      linear(f"{hf}.{parts['wi']}", path + ("mlp", "wi"), ("G", "H"), kind="gated", bias=mlp_bias)
    else:
      linear(f"{hf}.{parts['wi']}", path + ("mlp", "wi"), ("F", "H"), bias=mlp_bias)
    linear(f"{hf}.{parts['wo']}", path + ("mlp", "wo"), ("H", "F"), bias=mlp_bias)
    second_norm = "mlp_norm" if config.pre_norm else "output_norm"
    norm(f"{hf}.{parts[second_norm]}", path + (second_norm,))
  if config.pre_norm:
    norm(family.final_norm, ("final_norm",))
  if pooler:
    # A pooler the family's class lacks (ELECTRA's bare encoder built with one) is read as "pooler.dense": absent
    # from the checkpoint, it is initialised; `params_to_hf` refuses to write it.
    backbone = names.pooler is None or names.pooler_in_backbone
    linear(names.pooler or "pooler.dense", ("pooler",), ("H", "H"), backbone=backbone, bias=config.head_bias)
    if config.pooler_norm:
      norm(names.pooler_norm or "pooler.norm", ("pooler_norm",), backbone=backbone)

  if head.has_mlm:
    transform, layer_norm, bias, _ = names.mlm
    if config.decoder_bias:
      add(bias, ("mlm", "output_bias"), "copy", ("V",), backbone=False, in_root=False)
    linear(transform, ("mlm", "transform"), ("E", "H"), backbone=False, in_root=False, bias=config.head_bias)
    norm(layer_norm, ("mlm", "norm"), "E", backbone=False, in_root=False)
  for weight in head.linear_weights:
    hf = names.linear.get("/".join(weight.path), weight.hf)
    linear(hf, weight.path, (weight.outputs, "H"), backbone=False, in_root=False)
  return entries


def _tied(config: BertConfig, model_cls: type) -> _Tied | None:
  head, names = _head_names(config, model_cls)
  if not head.has_mlm:
    return None
  _, _, bias, decoder = names.mlm
  return _Tied(f"{decoder}.weight", f"{decoder}.bias", bias)


def _normalise(name: str, prefix: str) -> str:
  """Drops the backbone prefix (`bert.`, `roberta.`, ...) and renames old-style LayerNorm gamma/beta."""
  name = name.removeprefix(f"{prefix}.")
  if ".LayerNorm." in name:
    name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
  return name


def _has_pooler(model_cls: type, add_pooling_layer: bool | None, config: BertConfig) -> bool:
  if add_pooling_layer is not None:
    return add_pooling_layer
  head = registry.head(model_cls)
  if model_cls is BertModel:
    return config.use_pooler
  # ModernBERT's per-token heads read every token through the pooler's transform (`BertConfig.token_head`).
  return head.pooler or (config.token_head and config.family.head_names(head.architecture).pooler is not None)


def hf_to_params(state_dict: Mapping[str, Any], config: BertConfig, model_cls: type = BertForPreTraining,
                 num_labels: int | None = None, add_pooling_layer: bool | None = None,
                 ) -> tuple[dict[str, Any], list[str], list[str]]:
  """Maps a transformers state dict of `config`'s family onto `model_cls`'s unstacked params (numpy).

  Names may carry the family's backbone prefix (`bert.`, `roberta.`, `distilbert.`, `electra.`) or not, and
  LayerNorm `gamma/beta` or `weight/bias`. `num_labels=None` takes the classifier's size from the state dict (2
  when absent). Returns (params, unused state-dict names, missing jbert paths as "a/b/c"); call `stack_layers`
  for a scanned config.
  """
  registry.head(model_cls)
  family = config.family
  names = {}
  for name in state_dict:
    if name.removeprefix(f"{family.prefix}.") in _BUFFERS:
      continue
    names.setdefault(_normalise(name, family.prefix), name)
  if num_labels is None:
    num_labels = _infer_num_labels(state_dict, names, config, model_cls)
  layer_name = re.compile(re.escape(family.layer).replace(re.escape("{i}"), r"(\d+)") + r"\.")
  layers = {int(m.group(1)) for m in map(layer_name.match, names) if m}
  if layers and max(layers) >= config.num_hidden_layers:
    raise ValueError(f"The state dict has encoder layers 0..{max(layers)} but num_hidden_layers="
                     f"{config.num_hidden_layers}; set num_hidden_layers={max(layers) + 1} in the config.")
  sizes = _sizes(config, num_labels)
  tied = _tied(config, model_cls)
  params: dict[str, Any] = {}
  used, missing = set(), []
  for entry in _entries(config, model_cls, num_labels, _has_pooler(model_cls, add_pooling_layer, config)):
    source = names.get(entry.hf)
    if source is None and tied is not None and entry.hf == tied.output_bias:
      source = names.get(tied.bias)
    if source is None:
      missing.append("/".join(entry.path))
      continue
    value = np.asarray(state_dict[source])
    _check_shape(source, value.shape, entry.dims, sizes)
    if entry.kind.startswith("fused_qkv"):  # one weight, three jbert projections: path is (..., leaf)
      for proj, part in zip(_QKV, _to_jbert(value, entry.kind, config)):
        _set(params, entry.path[:-1] + (proj, entry.path[-1]), part)
    else:
      _set(params, entry.path, _to_jbert(value, entry.kind, config))
    used.add(entry.hf)
  if tied is not None:
    used.add(tied.bias)  # Tied to the output bias.
    decoder = names.get(tied.weight)
    word = names.get(f"{family.embeddings['word_embeddings']}.weight")
    # A decoder that equals the word embeddings is the tied weight; an untied one cannot be represented.
    if decoder is not None and word is not None and np.array_equal(
        np.asarray(state_dict[decoder]), np.asarray(state_dict[word])):
      used.add(tied.weight)
  unused = sorted(original for norm, original in names.items() if norm not in used)
  return params, unused, missing


def params_to_hf(params: Mapping[str, Any], config: BertConfig, model_cls: type = BertForPreTraining,
                 ) -> dict[str, np.ndarray]:
  """jbert params (boxed or not, stacked or not) -> a transformers state dict of numpy arrays.

  Names are those of the matching transformers class of `config`'s family (its backbone prefix for heads),
  including the tied MLM decoder weight and bias, so `load_state_dict` finds every key.
  """
  head, names = _head_names(config, model_cls)
  params = unstack_layers(jax.tree.map(np.asarray, nn.meta.unbox(params)))
  num_labels = 2
  if head.num_labels is None and "classifier" in params:
    num_labels = params["classifier"]["kernel"].shape[-1]
  pooler = "pooler" in params.get("bert", params)
  if pooler and names.pooler is None:
    raise ValueError(f"transformers' {config.family.architecture(head.architecture, config.model_type)} "
                     "has no pooler, but these params hold one; build the model with add_pooling_layer=False.")
  prefix = "" if model_cls is BertModel else f"{config.family.prefix}."
  out = {}
  for entry in _entries(config, model_cls, num_labels, pooler):
    name = (prefix if entry.backbone else "") + entry.hf
    if entry.kind.startswith("fused_qkv"):
      value = [_get(params, entry.path[:-1] + (proj, entry.path[-1])) for proj in _QKV]
    else:
      value = _get(params, entry.path)
    out[name] = _to_hf(value, entry.kind)
  tied = _tied(config, model_cls)
  if tied is not None:
    out[tied.weight] = out[prefix + f"{config.family.embeddings['word_embeddings']}.weight"]
    if config.decoder_bias:
      out[tied.bias] = out[tied.output_bias]
  return out


def _sizes(config: BertConfig, num_labels: int) -> dict[str, int]:
  sizes = {s: getattr(config, f) for s, f in _DIM_FIELDS.items() if s not in ("C", "E", "Q", "G")}
  return {**sizes, "C": num_labels, "E": config.embedding_width, "Q": 3 * config.hidden_size,
          "G": 2 * config.intermediate_size}


def _infer_num_labels(state_dict, names, config, model_cls) -> int:
  head, head_names = _head_names(config, model_cls)
  classifier = f"{head_names.linear.get('classifier', 'classifier')}.weight"
  if head.num_labels is None and classifier in names:
    return int(np.shape(state_dict[names[classifier]])[0])
  return 2


def _check_shape(name: str, shape: tuple[int, ...], dims: tuple[str | int, ...], sizes: dict) -> None:
  expected = tuple(sizes[d] if isinstance(d, str) else d for d in dims)
  if tuple(shape) == expected:
    return
  if len(shape) != len(expected):
    raise ValueError(f"{name} has shape {tuple(shape)} but the config expects {expected}.")
  fields = sorted({_DIM_FIELDS[d] for d, s, x in zip(dims, shape, expected) if s != x and isinstance(d, str)})
  fix = (f"; set {' / '.join(fields)} to match the checkpoint" if fields
         else "; this head's output size is fixed, so the checkpoint is for a different head")
  raise ValueError(f"{name} has shape {tuple(shape)} but the config expects {expected}{fix}.")


def _to_jbert(w: np.ndarray, kind: str, config: BertConfig) -> np.ndarray:
  n, d = config.num_attention_heads, config.head_dim
  if kind == "copy":
    return w
  if kind == "linear":
    return w.T
  if kind == "qkv":  # [N*D, H] -> [H, N, D]
    return w.T.reshape(-1, n, d)
  if kind == "qkv_bias":  # [N*D] -> [N, D]
    return w.reshape(n, d)
  if kind == "out":  # [H, N*D] -> [N, D, H]
    return w.T.reshape(n, d, -1)
  if kind == "fused_qkv":  # [3*N*D, H] -> 3 x [H, N, D]
    return [part.T.reshape(-1, n, d) for part in np.split(w, 3)]
  if kind == "fused_qkv_bias":  # [3*N*D] -> 3 x [N, D]
    return [part.reshape(n, d) for part in np.split(w, 3)]
  if kind == "gated":  # [2*F, H] (input rows, then gate rows) -> [H, 2, F]
    return w.T.reshape(w.shape[1], 2, -1)
  if kind == "gated_bias":  # [2*F] -> [2, F]
    return w.reshape(2, -1)
  raise AssertionError(kind)


def _to_hf(w: np.ndarray, kind: str) -> np.ndarray:
  if kind == "copy":
    return w
  if kind == "linear":
    return np.ascontiguousarray(w.T)
  if kind == "qkv":  # [H, N, D] -> [N*D, H]
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)
  if kind == "qkv_bias":  # [N, D] -> [N*D]
    return w.reshape(-1)
  if kind == "out":  # [N, D, H] -> [H, N*D]
    return np.ascontiguousarray(w.reshape(-1, w.shape[-1]).T)
  if kind == "fused_qkv":  # 3 x [H, N, D] -> [3*N*D, H]
    return np.concatenate([_to_hf(part, "qkv") for part in w])
  if kind == "fused_qkv_bias":  # 3 x [N, D] -> [3*N*D]
    return np.concatenate([part.reshape(-1) for part in w])
  if kind == "gated":  # [H, 2, F] -> [2*F, H]
    return np.ascontiguousarray(w.reshape(w.shape[0], -1).T)
  if kind == "gated_bias":  # [2, F] -> [2*F]
    return w.reshape(-1)
  raise AssertionError(kind)


def _set(tree: dict, path: tuple[str, ...], value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree: Mapping, path: tuple[str, ...]):
  for key in path:
    if key not in tree:
      raise KeyError(f"params have no {'/'.join(path)}; do they belong to this model class and config?")
    tree = tree[key]
  return tree
