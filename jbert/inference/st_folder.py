"""The sentence-transformers modules of a folder: carried into its conversion (`python -m jbert.convert`), or
written for a trained bi-encoder (`write_modules`, the export of `jbert.tasks.sentence_embedding`).

A sentence-transformers folder is a transformer plus the modules that turn its token vectors into one embedding
(Pooling, Normalize) and the maximum length it was trained at (`sentence_bert_config.json`). Converting only the
transformer would leave a folder that embeds differently, or not at all without --pooling; `copy_modules` writes
the rest beside the converted weights, with the Transformer module at the folder root, so jbert and
sentence-transformers both read the result as they read the original.
"""
from __future__ import annotations

import json
import os
import shutil

from jbert import untrusted
from jbert.inference import loading

MODULES = "modules.json"
ST_CONFIG = "sentence_bert_config.json"
# Written by sentence-transformers beside modules.json (versions, prompts, similarity function).
_ROOT_FILES = ("config_sentence_transformers.json",)


def transformer_folder(src: str) -> str:
  """The folder of `src`'s Transformer module (its weights and tokenizer); refuses modules jbert does not run."""
  _, transformer_dir = loading.read_sentence_transformer(src)
  return transformer_dir


def copy_modules(src: str, dst: str) -> list[str]:
  """Writes `src`'s modules.json (its Transformer module now at the root of `dst`), its other modules' folders,
  and the maximum length and lower-casing it embeds with into `dst`. Returns the names written."""
  settings, transformer_dir = loading.read_sentence_transformer(src)
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
  import numpy as np  # pylint: disable=g-import-not-at-top
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
        "activation_function": loading.TORCH_ACTIVATIONS[projection.activation]})
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
