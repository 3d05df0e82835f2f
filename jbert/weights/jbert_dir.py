"""jbert model directories: config.json (the full BertConfig plus the class) and params/ (an Orbax PyTree)."""
from __future__ import annotations

import json
import os
from typing import Any, Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from jbert import errors
from jbert.model.config import read_json_file
from jbert.weights import sizes

CONFIG = "config.json"
PARAMS = "params"


def is_jbert_dir(path: str) -> bool:
  return os.path.isfile(os.path.join(path, CONFIG)) and os.path.isdir(os.path.join(path, PARAMS))


def write(out_dir: str, config_dict: Mapping[str, Any], params: Any) -> None:
  out_dir = os.path.abspath(out_dir)  # Orbax needs absolute paths.
  os.makedirs(out_dir, exist_ok=True)
  with open(os.path.join(out_dir, CONFIG), "w") as f:
    json.dump(dict(config_dict), f, indent=2, sort_keys=True)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(os.path.join(out_dir, PARAMS), jax.tree.map(np.asarray, params), force=True)


def read_config(path: str) -> dict[str, Any]:
  return read_json_file(os.path.join(path, CONFIG))


def stored(path: str) -> sizes.Stored:
  """The parameter shapes of a jbert model directory from its Orbax metadata, without reading the arrays."""
  params_dir = os.path.join(os.path.abspath(path), PARAMS)
  try:
    with ocp.PyTreeCheckpointer() as ckptr:
      meta = ckptr.metadata(params_dir)
    tree = getattr(meta, "item_metadata", meta)
    tree = getattr(tree, "tree", tree)
    leaves = jax.tree_util.tree_leaves_with_path(tree)
    shapes = {jax.tree_util.keystr(p): tuple(int(d) for d in leaf.shape) for p, leaf in leaves}
    if not shapes:
      raise ValueError("its metadata lists no arrays")
  except Exception as e:  # pylint: disable=broad-except  (Orbax and TensorStore raise many types)
    raise ValueError(f"{params_dir} cannot be read ({errors.preview(str(e))}). The directory is incomplete or "
                     "corrupt; write it again (python -m jbert.convert).") from None
  nbytes = sum(os.path.getsize(os.path.join(d, f)) for d, _, names in os.walk(params_dir) for f in names)
  return sizes.Stored(params_dir, nbytes, shapes)


def read(path: str) -> tuple[dict[str, Any], Any]:
  """(config dict, params as numpy arrays)."""
  path = os.path.abspath(path)
  config = read_config(path)
  params_dir = os.path.join(path, PARAMS)
  try:
    with ocp.PyTreeCheckpointer() as ckptr:
      meta = ckptr.metadata(params_dir)
      tree = getattr(meta, "item_metadata", meta)
      tree = getattr(tree, "tree", tree)
      restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
      params = ckptr.restore(params_dir, args=ocp.args.PyTreeRestore(restore_args=restore_args))
  except Exception as e:  # pylint: disable=broad-except  (Orbax and TensorStore raise many types)
    from jbert.checkpoint import integrity as checkpoint_integrity  # pylint: disable=g-import-not-at-top
    raise ValueError(f"{params_dir} cannot be read: {checkpoint_integrity.describe(e, epath.Path(path), PARAMS)}. "
                     "The directory is incomplete or corrupt; write it again (python -m jbert.convert).") from None
  return config, params
