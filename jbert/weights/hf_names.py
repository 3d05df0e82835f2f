"""Name and layout mapping between transformers' BERT state dicts and the jbert parameter tree.

torch Linear weights are [out, in] and become [in, out] kernels; query/key/value kernels are further split
into heads ([H, N*D] -> [H, N, D]) and the attention output kernel into [N, D, H]. The MLM decoder weight is
tied to the word embeddings and the decoder bias to `cls.predictions.bias`, so neither is a separate param.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

import flax.linen as nn
import jax
import numpy as np

from jbert.model import BertConfig, BertForPreTraining, BertModel, registry, unstack_layers

# Buffers transformers may keep in a state dict; they are not weights.
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")
_TIED_DECODER = "cls.predictions.decoder.weight"
_DECODER_BIAS = "cls.predictions.decoder.bias"
_LAYER_NAME = re.compile(r"encoder\.layer\.(\d+)\.")

# Dimension symbols of the expected shapes -> the config field that sets them.
_DIM_FIELDS = {"V": "vocab_size", "H": "hidden_size", "P": "max_position_embeddings", "S": "type_vocab_size",
               "F": "intermediate_size", "C": "num_labels"}


@dataclasses.dataclass(frozen=True)
class _Entry:
  hf: str  # Name without the `bert.` prefix.
  path: tuple[str, ...]  # Path in the jbert tree.
  kind: str  # "copy" | "linear" (transpose) | "qkv" | "qkv_bias" | "out".
  dims: tuple[str | int, ...]  # Hugging Face shape in symbols of _DIM_FIELDS.
  backbone: bool  # Under `bert.` in a head's state dict.



def _entries(config: BertConfig, model_cls: type, num_labels: int, pooler: bool) -> list[_Entry]:
  root = () if model_cls is BertModel else ("bert",)
  entries = []

  def add(hf, path, kind, dims, backbone=True):
    entries.append(_Entry(hf, (root if backbone else ()) + path, kind, dims, backbone))

  def norm(hf, path, backbone=True):
    add(f"{hf}.weight", path + ("scale",), "copy", ("H",), backbone)
    add(f"{hf}.bias", path + ("bias",), "copy", ("H",), backbone)

  def linear(hf, path, dims, backbone=True, kind="linear"):
    add(f"{hf}.weight", path + ("kernel",), kind, dims, backbone)
    add(f"{hf}.bias", path + ("bias",), "qkv_bias" if kind == "qkv" else "copy", dims[:1], backbone)

  for table, dims in (("word", ("V", "H")), ("position", ("P", "H")), ("token_type", ("S", "H"))):
    add(f"embeddings.{table}_embeddings.weight", ("embeddings", f"{table}_embeddings", "embedding"), "copy",
        dims)
  norm("embeddings.LayerNorm", ("embeddings", "norm"))
  for i in range(config.num_hidden_layers):
    hf, path = f"encoder.layer.{i}", ("encoder", f"layer_{i}")
    for proj in ("query", "key", "value"):
      linear(f"{hf}.attention.self.{proj}", path + ("attention", proj), ("H", "H"), kind="qkv")
    linear(f"{hf}.attention.output.dense", path + ("attention", "out"), ("H", "H"), kind="out")
    norm(f"{hf}.attention.output.LayerNorm", path + ("attention_norm",))
    linear(f"{hf}.intermediate.dense", path + ("mlp", "wi"), ("F", "H"))
    linear(f"{hf}.output.dense", path + ("mlp", "wo"), ("H", "F"))
    norm(f"{hf}.output.LayerNorm", path + ("output_norm",))
  if pooler:
    linear("pooler.dense", ("pooler",), ("H", "H"))

  head = registry.head(model_cls)
  if head.has_mlm:
    add("cls.predictions.bias", ("mlm", "output_bias"), "copy", ("V",), backbone=False)
    linear("cls.predictions.transform.dense", ("mlm", "transform"), ("H", "H"), backbone=False)
    norm("cls.predictions.transform.LayerNorm", ("mlm", "norm"), backbone=False)
  for weight in head.linear_weights:
    linear(weight.hf, weight.path, (weight.outputs, "H"), backbone=False)
  return entries


def _normalise(name: str) -> str:
  """Drops a `bert.` prefix and renames old-style LayerNorm gamma/beta."""
  name = name.removeprefix("bert.")
  if ".LayerNorm." in name:
    name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
  return name


def _check_model_cls(model_cls: type) -> None:
  registry.head(model_cls)


def _has_pooler(model_cls: type, add_pooling_layer: bool | None) -> bool:
  return registry.head(model_cls).pooler if add_pooling_layer is None else add_pooling_layer


def hf_to_params(state_dict: Mapping[str, Any], config: BertConfig, model_cls: type = BertForPreTraining,
                 num_labels: int | None = None, add_pooling_layer: bool | None = None,
                 ) -> tuple[dict[str, Any], list[str], list[str]]:
  """Maps a transformers BERT state dict onto `model_cls`'s unstacked params (numpy).

  Names may carry a `bert.` prefix or not, and LayerNorm `gamma/beta` or `weight/bias`. `num_labels=None`
  takes the classifier's size from the state dict (2 when absent). Returns (params, unused state-dict names,
  missing jbert paths as "a/b/c"); call `stack_layers` for a scanned config.
  """
  _check_model_cls(model_cls)
  names = {}
  for name in state_dict:
    if name.removeprefix("bert.") in _BUFFERS:
      continue
    names.setdefault(_normalise(name), name)
  if num_labels is None:
    num_labels = _infer_num_labels(state_dict, names, model_cls)
  layers = {int(m.group(1)) for m in map(_LAYER_NAME.match, names) if m}
  if layers and max(layers) >= config.num_hidden_layers:
    raise ValueError(f"The state dict has encoder layers 0..{max(layers)} but num_hidden_layers="
                     f"{config.num_hidden_layers}; set num_hidden_layers={max(layers) + 1} in the config.")
  sizes = {**{s: getattr(config, f) for s, f in _DIM_FIELDS.items() if s != "C"}, "C": num_labels}
  params: dict[str, Any] = {}
  used, missing = set(), []
  for entry in _entries(config, model_cls, num_labels, _has_pooler(model_cls, add_pooling_layer)):
    source = names.get(entry.hf)
    if source is None and entry.hf == "cls.predictions.bias":
      source = names.get(_DECODER_BIAS)
    if source is None:
      missing.append("/".join(entry.path))
      continue
    value = np.asarray(state_dict[source])
    _check_shape(source, value.shape, entry.dims, sizes)
    _set(params, entry.path, _to_jbert(value, entry.kind, config))
    used.add(entry.hf)
  if registry.head(model_cls).has_mlm:
    used.add(_DECODER_BIAS)  # Tied to cls.predictions.bias.
    decoder = names.get(_TIED_DECODER)
    word = names.get("embeddings.word_embeddings.weight")
    # A decoder that equals the word embeddings is the tied weight; an untied one cannot be represented.
    if decoder is not None and word is not None and np.array_equal(
        np.asarray(state_dict[decoder]), np.asarray(state_dict[word])):
      used.add(_TIED_DECODER)
  unused = sorted(original for norm, original in names.items() if norm not in used)
  return params, unused, missing


def params_to_hf(params: Mapping[str, Any], config: BertConfig, model_cls: type = BertForPreTraining,
                 ) -> dict[str, np.ndarray]:
  """jbert params (boxed or not, stacked or not) -> a transformers state dict of numpy arrays.

  Names are those of the matching transformers class (`bert.` prefix for heads), including the tied MLM
  decoder weight and bias, so `load_state_dict` finds every key.
  """
  _check_model_cls(model_cls)
  params = unstack_layers(jax.tree.map(np.asarray, nn.meta.unbox(params)))
  num_labels = 2
  if registry.head(model_cls).num_labels is None and "classifier" in params:
    num_labels = params["classifier"]["kernel"].shape[-1]
  pooler = "pooler" in params.get("bert", params)
  prefix = "" if model_cls is BertModel else "bert."
  out = {}
  for entry in _entries(config, model_cls, num_labels, pooler):
    name = (prefix if entry.backbone else "") + entry.hf
    out[name] = _to_hf(_get(params, entry.path), entry.kind)
  if registry.head(model_cls).has_mlm:
    out[_TIED_DECODER] = out[prefix + "embeddings.word_embeddings.weight"]
    out[_DECODER_BIAS] = out["cls.predictions.bias"]
  return out


def _infer_num_labels(state_dict, names, model_cls) -> int:
  if registry.head(model_cls).num_labels is None and "classifier.weight" in names:
    return int(np.shape(state_dict[names["classifier.weight"]])[0])
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
