"""Hugging Face model directories: config.json + model.safetensors (sharded or not) or pytorch_model.bin."""
from __future__ import annotations

import json
import math
import os
import pickle
from typing import Any, Mapping

import numpy as np

from jbert import errors, untrusted
from jbert.model.config import read_json_file
from jbert.weights import sizes

CONFIG = "config.json"
SAFETENSORS = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
TORCH_BIN = "pytorch_model.bin"
TORCH_BIN_INDEX = "pytorch_model.bin.index.json"
WEIGHT_FILES = (SAFETENSORS, SAFETENSORS_INDEX, TORCH_BIN, TORCH_BIN_INDEX)


def is_hf_dir(path: str) -> bool:
  return os.path.isfile(os.path.join(path, CONFIG)) and any(
      os.path.isfile(os.path.join(path, f)) for f in WEIGHT_FILES)


def read_config(path: str) -> dict[str, Any]:
  return read_json_file(os.path.join(path, CONFIG))


def read_state_dict(path: str) -> dict[str, np.ndarray]:
  """All tensors of an HF directory as numpy arrays (floats widened to float32).

  safetensors (single file, then sharded) is preferred; pytorch_model.bin (single or sharded) is read with
  `torch.load(weights_only=True)` so that a downloaded pickle never runs code.
  """
  refuse_special_files(path)
  for single, index, read in ((SAFETENSORS, SAFETENSORS_INDEX, _read_safetensors),
                              (TORCH_BIN, TORCH_BIN_INDEX, _read_torch_bin)):
    if os.path.isfile(os.path.join(path, single)):
      return _as_float_arrays(read(os.path.join(path, single)))
    if os.path.isfile(os.path.join(path, index)):
      state = {}
      for shard in _shards(os.path.join(path, index)):
        state.update(read(shard))
      return _as_float_arrays(state)
  raise FileNotFoundError(f"{path} has none of {', '.join(WEIGHT_FILES)}.")


def refuse_special_files(path: str, names=(CONFIG, *WEIGHT_FILES)) -> None:
  """A config or weight file of the folder that is there but no regular file (a FIFO, a link to /dev/zero) is
  named: the `isfile` tests of the readers would take it for absent, or a reader would block or never end."""
  for name in names:
    if os.path.lexists(os.path.join(path, name)):
      untrusted.check_regular(os.path.join(path, name))


def stored(path: str) -> sizes.Stored:
  """What the weight files of an HF directory hold, without reading the weights: the tensor shapes of safetensors
  headers (single or sharded), else the bytes of pytorch_model.bin (or its shards)."""
  for single, index, shapes in ((SAFETENSORS, SAFETENSORS_INDEX, safetensors_shapes),
                                (TORCH_BIN, TORCH_BIN_INDEX, None)):
    if os.path.isfile(os.path.join(path, single)):
      found = [os.path.join(path, single)]
    elif os.path.isfile(os.path.join(path, index)):
      found = _shards(os.path.join(path, index))
    else:
      continue
    where = found[0] if len(found) == 1 else f"{path} ({len(found)} {single} shards)"
    nbytes = sum(os.path.getsize(f) for f in found)
    if shapes is None:
      return sizes.Stored(where, nbytes)
    merged = {}
    for file in found:
      merged.update(shapes(file))
    return sizes.Stored(where, nbytes, merged)
  raise FileNotFoundError(f"{path} has none of {', '.join(WEIGHT_FILES)}.")


# Bytes per value of each safetensors dtype.
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
             "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
# The safetensors library refuses headers over 100 MB; so does this reader, before reading one.
_MAX_HEADER = 100_000_000


def safetensors_shapes(file: str) -> dict[str, tuple[int, ...]]:
  """Tensor name -> shape from a safetensors file's header (its first bytes), checked against the file's size so
  that a header cannot claim tensors the file does not hold."""
  damaged = f"{file} is not a readable safetensors file (its header "
  fix = "): it is truncated or corrupt; download or convert it again."  # as _read_safetensors says it
  size = os.path.getsize(file)
  with open(file, "rb") as f:
    length = int.from_bytes(f.read(8), "little")
    if size < 8 or length > min(size - 8, _MAX_HEADER):
      raise ValueError(f"{damaged}claims {length:,} bytes in a file of {size:,}{fix}")
    try:
      header = json.loads(f.read(length))
    except (ValueError, UnicodeDecodeError):
      raise ValueError(f"{damaged}is not JSON{fix}") from None
  if not isinstance(header, dict):
    raise ValueError(f"{damaged}is not a JSON object{fix}")
  data, shapes = size - 8 - length, {}
  for name, entry in header.items():
    if name == "__metadata__":
      continue
    try:
      shape, (begin, end) = tuple(entry["shape"]), entry["data_offsets"]
      ok = all(type(d) is int and d >= 0 for d in (*shape, begin, end)) and begin <= end <= data and (
          end - begin == math.prod(shape) * _ITEMSIZE.get(entry["dtype"], end - begin))
    except (TypeError, KeyError, ValueError):
      ok = False
    if not ok:
      raise ValueError(f"{damaged}entry {errors.preview(name)} does not describe a tensor within the file{fix}")
    shapes[name] = shape
  return shapes


def weights_file(path: str, name: str | None = None) -> str:
  """The file of an HF directory that holds tensor `name` (the shard, for sharded weights), as `read_state_dict`
  chooses it; the index file where `name` is not given or not listed."""
  for single, index in ((SAFETENSORS, SAFETENSORS_INDEX), (TORCH_BIN, TORCH_BIN_INDEX)):
    if os.path.isfile(os.path.join(path, single)):
      return os.path.join(path, single)
    if os.path.isfile(os.path.join(path, index)):
      shard = (read_json_file(os.path.join(path, index)).get("weight_map") or {}).get(name) if name else None
      return os.path.join(path, shard or index)
  return path


def _shards(index_file: str) -> list[str]:
  """Paths of the shard files an index names; every one must exist."""
  weight_map = read_json_file(index_file).get("weight_map")
  if not isinstance(weight_map, dict) or not weight_map:
    raise ValueError(f"{index_file} has no \"weight_map\" of tensor names to shard files; use the index written "
                     "with the shards.")
  shards = [os.path.join(os.path.dirname(index_file), f) for f in sorted(set(weight_map.values()))]
  missing = [os.path.basename(f) for f in shards if not os.path.isfile(f)]
  if missing:
    raise FileNotFoundError(f"{index_file} names shard files that are missing: {', '.join(missing)}; download "
                            "every shard.")
  return shards


def _read_safetensors(file: str) -> dict[str, np.ndarray]:
  from safetensors import SafetensorError  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  try:
    return load_file(file)
  except (SafetensorError, OSError) as e:
    raise ValueError(f"{file} is not a readable safetensors file ({e}): it is truncated or corrupt; download or "
                     "convert it again.") from None


def _read_torch_bin(file: str) -> dict[str, np.ndarray]:
  try:
    import torch  # pylint: disable=g-import-not-at-top  (torch is optional)
  except ImportError as e:
    raise ImportError(f"{file} is a PyTorch pickle and reading it needs torch (pip install torch); or save the "
                      "model as model.safetensors.") from e
  try:
    state = torch.load(file, map_location="cpu", weights_only=True)
  except pickle.UnpicklingError as e:
    if "weights only" not in str(e).lower():
      raise ValueError(f"{file} is not a readable PyTorch checkpoint ({str(e).splitlines()[0]}): it is truncated "
                       "or corrupt; download it again.") from None
    raise ValueError(f"{file} holds Python objects besides tensors, and unpickling them could run arbitrary "
                     "code, so jbert refuses it; convert it to model.safetensors where you trust it, or get a "
                     "safetensors copy.") from None
  except (RuntimeError, EOFError, OSError) as e:
    raise ValueError(f"{file} is not a readable PyTorch checkpoint ({str(e).splitlines()[0]}): it is truncated or "
                     "corrupt; download it again.") from None
  if not isinstance(state, dict):
    raise ValueError(f"{file} holds a {type(state).__name__}, not a state dict of tensors.")
  state = state.get("state_dict", state)
  # numpy has no bfloat16 bridge in torch: widen floats on the torch side.
  return {k: (v.float() if v.is_floating_point() else v).numpy() for k, v in state.items()}


def _as_float_arrays(state: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
  # bf16/fp16 checkpoints are widened: jbert keeps master weights in param_dtype (fp32 by default).
  return {k: v.astype(np.float32) if v.dtype.kind == "f" or v.dtype.name == "bfloat16" else v
          for k, v in state.items()}


def write(out_dir: str, config_dict: Mapping[str, Any], state_dict: Mapping[str, np.ndarray]) -> None:
  """config.json + model.safetensors (torch layout; `format: pt` metadata as transformers writes it)."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, CONFIG), "w") as f:
    json.dump(dict(config_dict), f, indent=2, sort_keys=True)
  arrays = {k: np.ascontiguousarray(v) for k, v in state_dict.items()}
  file = os.path.join(out_dir, SAFETENSORS)
  save_file(arrays, file, metadata={"format": "pt"})
  os.chmod(file, 0o666 & ~_umask())  # safetensors creates it 0600; other files of the directory follow the umask


def _umask() -> int:
  # Read without os.umask(), which sets it too (racy in a threaded program).
  try:
    with open("/proc/self/status", encoding="ascii") as f:
      return next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
  except (OSError, StopIteration, ValueError):
    return 0o022
