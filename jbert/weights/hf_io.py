"""Hugging Face model directories: config.json + model.safetensors (sharded or not) or pytorch_model.bin."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import numpy as np

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN)


def is_hf_dir(path: str) -> bool:
  return os.path.isfile(os.path.join(path, CONFIG)) and any(
      os.path.isfile(os.path.join(path, f)) for f in WEIGHT_FILES)


def read_config(path: str) -> dict[str, Any]:
  with open(os.path.join(path, CONFIG)) as f:
    return json.load(f)


def read_state_dict(path: str) -> dict[str, np.ndarray]:
  """All tensors of an HF directory as numpy arrays; safetensors first, then the pickle-free torch path."""
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  single, index = os.path.join(path, SAFETENSORS), os.path.join(path, SAFETENSORS_INDEX)
  if os.path.isfile(single):
    return _as_float_arrays(load_file(single))
  if os.path.isfile(index):
    with open(index) as f:
      shards = sorted(set(json.load(f)["weight_map"].values()))
    state = {}
    for shard in shards:
      state.update(load_file(os.path.join(path, shard)))
    return _as_float_arrays(state)
  return _read_torch_bin(os.path.join(path, TORCH_BIN))


def _read_torch_bin(file: str) -> dict[str, np.ndarray]:
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(f"{file} is a PyTorch pickle and reading it needs torch (pip install torch), or convert it "
                      "to model.safetensors.") from e
  # weights_only=True: never execute code from a downloaded pickle.
  state = torch.load(file, map_location="cpu", weights_only=True)
  state = state.get("state_dict", state) if isinstance(state, dict) else state
  return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in state.items()}


def _as_float_arrays(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  # bf16/fp16 checkpoints are widened: jbert keeps master weights in param_dtype (fp32 by default).
  return {k: v.astype(np.float32) if v.dtype.kind == "f" or v.dtype.name == "bfloat16" else v
          for k, v in state.items()}


def write(out_dir: str, config_dict: Mapping[str, Any], state_dict: Mapping[str, np.ndarray]) -> None:
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, CONFIG), "w") as f:
    json.dump(dict(config_dict), f, indent=2, sort_keys=True)
  arrays = {k: np.ascontiguousarray(v) for k, v in state_dict.items()}
  save_file(arrays, os.path.join(out_dir, SAFETENSORS), metadata={"format": "pt"})
