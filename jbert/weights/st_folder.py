"""The sentence-transformers folder format: read (a bi-encoder's modules), written (a trained bi-encoder's export,
a converted folder's modules) and a CrossEncoder's files.

A sentence-transformers folder (`modules.json`) is a transformer plus the modules that turn its token vectors into
one embedding: the transformer module's weights and tokenizer (the folder root or `0_Transformer/`),
`1_Pooling/config.json` (the legacy `pooling_mode_*` booleans or the newer `pooling_mode`), an optional Dense
projection (`2_Dense/config.json` and its `linear.weight`/`linear.bias`), an optional Normalize module, and the
maximum length (`sentence_bert_config.json`'s `max_seq_length`, else the tokenizer's `model_max_length`).

Converting only the transformer would leave a folder that embeds differently, or not at all without --pooling;
`copy_modules` writes the rest beside the converted weights, with the Transformer module at the folder root, so
jbert and sentence-transformers both read the result as they read the original. A CrossEncoder folder is a
sequence classifier with the files that tell sentence-transformers (and jbert) its score activation.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from typing import Any

import numpy as np

from jbert import errors, untrusted
from jbert.version import __version__
from jbert.model import pooling as pooling_lib
from jbert.model.sentence import Projection
from jbert.weights import hf_io

log = logging.getLogger("jbert")

MODULES = "modules.json"
ST_CONFIG = "sentence_bert_config.json"
# Written by sentence-transformers beside modules.json (versions, prompts, similarity function).
_ROOT_FILES = ("config_sentence_transformers.json",)
ST_POOLING_MODES = pooling_lib.ST_MODES  # sentence-transformers' Pooling modes
# The Dense activations jbert runs, as sentence-transformers names them (`activation_function`, a torch class).
TORCH_ACTIVATIONS = {"tanh": "torch.nn.modules.activation.Tanh", "identity": "torch.nn.modules.linear.Identity",
                     "relu": "torch.nn.modules.activation.ReLU", "gelu": "torch.nn.modules.activation.GELU",
                     "sigmoid": "torch.nn.modules.activation.Sigmoid"}
DENSE_ACTIVATIONS = {path.rsplit(".", 1)[-1]: name for name, path in TORCH_ACTIVATIONS.items()}  # by class name
# The modules jbert runs, in the order they must come.
ST_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# A tokenizer_config.json `model_max_length` this large means "no limit" (transformers' VERY_LARGE_INTEGER).
_NO_LIMIT = 10 ** 9

# sentence-transformers records the activation `CrossEncoder.predict` applies by its class path.
_CE_ACTIVATIONS = {"torch.nn.modules.activation.Sigmoid": "sigmoid", "torch.nn.modules.linear.Identity": "identity"}
_SIGMOID = "torch.nn.modules.activation.Sigmoid"
# The files sentence-transformers 6 writes for a CrossEncoder whose only module is the transformer.
_MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"}]
_TRANSFORMER_CONFIG = {"transformer_task": "sequence-classification",
                       "modality_config": {"text": {"method": "forward", "method_output_name": "logits"}},
                       "module_output_name": "scores"}


@dataclasses.dataclass(frozen=True)
class SentenceTransformerSettings:
  """What a sentence-transformers folder fixes: pooling modes (concatenated in this order; None without a Pooling
  module), normalisation, maximum length in tokens (special tokens included), whether texts are lower-cased
  first, and its Dense projection (`dense_dir`: the module's folder, holding its weights)."""
  pooling: tuple[str, ...] | None
  normalize: bool
  max_length: int | None
  lowercase: bool = False
  dense: Projection | None = None
  dense_dir: str | None = None


# -- reading --


def is_sentence_transformer(path: str | os.PathLike) -> bool:
  # lexists: a modules.json that is no regular file (a FIFO, a link to a device) is refused by name, not ignored.
  return os.path.lexists(os.path.join(os.fspath(path), "modules.json"))


def read_sentence_transformer(path: str) -> tuple[SentenceTransformerSettings, str]:
  """(settings, folder of the transformer module's weights) of a sentence-transformers folder."""
  modules = untrusted.read_json(os.path.join(path, "modules.json"))
  if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
    raise ValueError(f"{path}/modules.json is not a list of modules ({{\"type\": ..., \"path\": ...}}); the folder "
                     "is damaged or not a sentence-transformers model.")
  kinds = {}
  for module in modules:
    kind = str(module.get("type", "")).rsplit(".", 1)[-1]
    if kind not in ST_MODULES:
      raise ValueError(f"{path}/modules.json has a {errors.shorten(str(module.get('type')))} module "
                       f"({errors.preview(module.get('path'))}); jbert "
                       f"reads {', '.join(ST_MODULES[:-1])} and {ST_MODULES[-1]} modules only.")
    if kind in kinds:
      raise ValueError(f"{path}/modules.json has two {kind} modules; jbert reads one of each.")
    if any(ST_MODULES.index(k) > ST_MODULES.index(kind) for k in kinds):
      raise ValueError(f"{path}/modules.json puts its {kind} module after {', '.join(kinds)}; jbert runs them in "
                       f"the order {' -> '.join(ST_MODULES)}.")
    kinds[kind] = os.path.normpath(os.path.join(path, module.get("path", "")))
  if "Transformer" not in kinds:
    raise ValueError(f"{path}/modules.json has no Transformer module; it is not a BERT sentence encoder.")
  transformer_dir = kinds["Transformer"]
  pooling = None  # Without a Pooling module the folder gives token vectors: the caller must choose a pooling.
  if "Pooling" in kinds:
    pooling = _pooling_modes(untrusted.read_json(os.path.join(kinds["Pooling"], "config.json")), kinds["Pooling"])
  st_config = {}
  for folder in dict.fromkeys((transformer_dir, os.path.normpath(path))):
    candidate = os.path.join(folder, "sentence_bert_config.json")
    if os.path.lexists(candidate):
      st_config = untrusted.read_json(candidate)
      break
  max_length = st_config.get("max_seq_length")
  if max_length is None:
    tok_config = os.path.join(transformer_dir, "tokenizer_config.json")
    limit = untrusted.read_json(tok_config).get("model_max_length") if os.path.lexists(tok_config) else None
    max_length = int(limit) if limit is not None and limit < _NO_LIMIT else None
  dense = None
  if "Dense" in kinds:
    if pooling is None:
      raise ValueError(f"{path}/modules.json has a Dense module but no Pooling module before it; jbert projects "
                       "pooled sentence vectors only.")
    dense = _dense(untrusted.read_json(os.path.join(kinds["Dense"], "config.json")), kinds["Dense"])
  settings = SentenceTransformerSettings(pooling=pooling, normalize="Normalize" in kinds,
                                         max_length=None if max_length is None else int(max_length),
                                         lowercase=bool(st_config.get("do_lower_case", False)), dense=dense,
                                         dense_dir=kinds.get("Dense"))
  return settings, transformer_dir


def _dense(config: dict[str, Any], folder: str) -> Projection:
  """A Dense module's config.json as a `Projection`; what jbert cannot run is refused by name."""
  if config.get("use_residual"):
    raise ValueError(f"{folder}/config.json asks for use_residual=true; jbert runs Dense modules without a "
                     "residual connection only.")
  name = config.get("activation_function", TORCH_ACTIVATIONS["tanh"]) or TORCH_ACTIVATIONS["identity"]
  activation = DENSE_ACTIVATIONS.get(str(name).rsplit(".", 1)[-1])
  if activation is None:
    raise ValueError(f"{folder}/config.json has activation_function {errors.preview(name)}; jbert runs "
                     f"{', '.join(DENSE_ACTIVATIONS)}.")
  try:
    return Projection(int(config["in_features"]), int(config["out_features"]), bool(config.get("bias", True)),
                      activation)
  except KeyError as e:
    raise ValueError(f"{folder}/config.json lacks {errors.preview(e.args[0])}; it is not a sentence-transformers Dense "
                     "module's config.") from None


def read_dense(projection: Projection, folder: str) -> dict[str, Any]:
  """A Dense module's weights (`linear.weight` [out, in], `linear.bias`) as {"kernel": [in, out], "bias"}."""
  state = hf_io.read_state_dict(folder)
  want = {"linear.weight": (projection.out_features, projection.in_features)}
  if projection.bias:
    want["linear.bias"] = (projection.out_features,)
  for name, shape in want.items():
    if name not in state or tuple(state[name].shape) != shape:
      got = "missing" if name not in state else f"of shape {tuple(state[name].shape)}"
      raise ValueError(f"{folder}: the Dense weight {name} is {got}; its config.json asks for {shape}.")
  params = {"kernel": state["linear.weight"].T.copy()}
  if projection.bias:
    params["bias"] = state["linear.bias"]
  return params


def _pooling_modes(config: dict[str, Any], folder: str) -> tuple[str, ...]:
  if "pooling_mode" in config:
    mode = config["pooling_mode"]
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
  else:
    modes = tuple(name for key, name in _LEGACY_POOLING_KEYS.items() if config.get(key))
  unknown = [m for m in modes if m not in ST_POOLING_MODES]
  if unknown or not modes:
    raise ValueError(f"{folder}/config.json asks for pooling {errors.preview(list(modes))}; jbert knows "
                     f"{', '.join(ST_POOLING_MODES)}.")
  if config.get("include_prompt") is False:
    log.warning("%s: include_prompt=false has no effect here: jbert adds no prompts to the texts.", folder)
  return modes


# -- writing --


def transformer_folder(src: str) -> str:
  """The folder of `src`'s Transformer module (its weights and tokenizer); refuses modules jbert does not run."""
  _, transformer_dir = read_sentence_transformer(src)
  return transformer_dir


def copy_modules(src: str, dst: str) -> list[str]:
  """Writes `src`'s modules.json (its Transformer module now at the root of `dst`), its other modules' folders,
  and the maximum length and lower-casing it embeds with into `dst`. Returns the names written."""
  settings, transformer_dir = read_sentence_transformer(src)
  modules = untrusted.read_json(os.path.join(src, MODULES))
  written = []
  for module in modules:
    if str(module.get("type", "")).rsplit(".", 1)[-1] == "Transformer":
      module["path"] = ""
      continue
    source = os.path.normpath(os.path.join(src, module.get("path", "")))
    if module.get("path") and os.path.isdir(source):
      shutil.copytree(source, os.path.join(dst, module["path"]), dirs_exist_ok=True, copy_function=_copy_regular)
      written.append(module["path"])
  _write_json(os.path.join(dst, MODULES), modules)
  written.append(MODULES)
  st_config = {}
  for folder in dict.fromkeys((transformer_dir, os.path.normpath(src))):
    if os.path.isfile(os.path.join(folder, ST_CONFIG)):
      st_config = untrusted.read_json(os.path.join(folder, ST_CONFIG))
      break
  # The length `src` embeds at, even where it came from its tokenizer_config.json, which dst's does not copy.
  if settings.max_length is not None:
    st_config["max_seq_length"] = settings.max_length
  st_config.setdefault("do_lower_case", settings.lowercase)
  _write_json(os.path.join(dst, ST_CONFIG), st_config)
  written.append(ST_CONFIG)
  for name in _ROOT_FILES:
    if os.path.isfile(os.path.join(src, name)):
      _copy_regular(os.path.join(src, name), os.path.join(dst, name))
      written.append(name)
  return written


def _copy_regular(source: str, target: str) -> str:
  """shutil's copy of a regular file; a link to a device or a FIFO in a module folder is refused by name (copying
  /dev/zero would never end)."""
  untrusted.check_regular(source)
  return shutil.copy2(source, target)


def _write_json(path: str, value) -> None:
  with open(path, "w", encoding="utf-8") as f:
    json.dump(value, f, indent=2)
    f.write("\n")


def write_modules(dst: str, *, embedding_dimension: int, pooling, normalize: bool, max_length: int,
                  projection=None, dense_params=None) -> list[str]:
  """Writes the sentence-transformers modules of an encoder beside its transformer (already in `dst`): modules.json,
  `1_Pooling/`, `2_Dense/` (config.json + model.safetensors with `linear.weight` [out, in] and `linear.bias`, as
  sentence-transformers' Dense saves them), a Normalize module and sentence_bert_config.json. Module types are
  the `sentence_transformers.models.*` names every sentence-transformers version reads. Returns the names."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  modules = [("", "Transformer"), ("1_Pooling", "Pooling")]
  os.makedirs(os.path.join(dst, "1_Pooling"), exist_ok=True)
  _write_json(os.path.join(dst, "1_Pooling", "config.json"), {
      "embedding_dimension": int(embedding_dimension),
      "pooling_mode": pooling[0] if len(pooling) == 1 else list(pooling), "include_prompt": True})
  if projection is not None:
    folder = os.path.join(dst, f"{len(modules)}_Dense")
    os.makedirs(folder, exist_ok=True)
    _write_json(os.path.join(folder, "config.json"), {
        "in_features": projection.in_features, "out_features": projection.out_features, "bias": projection.bias,
        "activation_function": TORCH_ACTIVATIONS[projection.activation]})
    tensors = {"linear.weight": np.ascontiguousarray(np.asarray(dense_params["kernel"], np.float32).T)}
    if projection.bias:
      tensors["linear.bias"] = np.asarray(dense_params["bias"], np.float32)
    save_file(tensors, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    modules.append((os.path.basename(folder), "Dense"))
  if normalize:
    folder = os.path.join(dst, f"{len(modules)}_Normalize")
    os.makedirs(folder, exist_ok=True)
    _write_json(os.path.join(folder, "config.json"), {})
    modules.append((os.path.basename(folder), "Normalize"))
  _write_json(os.path.join(dst, MODULES), [
      {"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
      for i, (path, kind) in enumerate(modules)])
  _write_json(os.path.join(dst, ST_CONFIG), {"max_seq_length": int(max_length), "do_lower_case": False})
  return [MODULES, ST_CONFIG, *(path for path, _ in modules if path)]


# -- CrossEncoder folders --


def write_cross_encoder_files(folder: str, max_seq_length: int) -> list[str]:
  """What sentence-transformers writes beside a CrossEncoder's transformer, so `CrossEncoder(folder)` loads it as
  one (sigmoid activation, the training length) and jbert finds the activation too; returns the names."""
  files = {
      "modules.json": _MODULES,
      "sentence_bert_config.json": {**_TRANSFORMER_CONFIG, "max_seq_length": int(max_seq_length)},
      "config_sentence_transformers.json": {"model_type": "CrossEncoder", "activation_fn": _SIGMOID, "prompts": {},
                                            "default_prompt_name": None, "__version__": {"jbert": __version__}},
  }
  for name, value in files.items():
    _write_json(os.path.join(folder, name), value)
  return sorted(files)


def cross_encoder_activation(path: str) -> str | None:
  """"sigmoid" or "identity": the activation `CrossEncoder.predict` applies to the folder at `path` as
  sentence-transformers recorded it (config_sentence_transformers.json since version 5; config.json's
  `sentence_transformers.activation_fn` or `sbert_ce_default_activation_function` before; sigmoid for a
  CrossEncoder folder that names none); None for a folder sentence-transformers did not mark as a CrossEncoder."""
  name, marked = None, False
  st_config = _read(os.path.join(path, "config_sentence_transformers.json"))
  if st_config.get("model_type") == "CrossEncoder":
    name, marked = st_config.get("activation_fn"), True
  config = _read(os.path.join(path, "config.json"))
  if name is None and isinstance(config.get("sentence_transformers"), dict):
    name = config["sentence_transformers"].get("activation_fn")
    marked = marked or name is not None
  if name is None and config.get("sbert_ce_default_activation_function"):
    name, marked = config["sbert_ce_default_activation_function"], True
  if not marked:
    return None
  if name is None:
    return "sigmoid"
  if name not in _CE_ACTIVATIONS:
    raise ValueError(f"{path} is a CrossEncoder with activation {name}; jbert applies "
                     f"{' or '.join(_CE_ACTIVATIONS)} only.")
  return _CE_ACTIVATIONS[name]


def _read(path: str) -> dict:
  if not os.path.isfile(path):
    return {}
  value = untrusted.read_json(path)  # A model folder's file: regular, read up to its size.
  return value if isinstance(value, dict) else {}
