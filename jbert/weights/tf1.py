"""Original google-research/bert TF1 checkpoints (bert_config.json beside bert_model.ckpt.*).

Variables are renamed to transformers' state-dict names (dense kernels transposed to torch's [out, in]) so one
mapping, `hf_names.hf_to_params`, serves both formats.
"""
from __future__ import annotations

import glob
import os
import re

import numpy as np

CONFIG = "bert_config.json"
_SKIP = re.compile(r"(adam_m|adam_v|global_step|bad_steps|good_steps|loss_scale)")


def find_checkpoint(path: str) -> tuple[str, str] | None:
  """(checkpoint prefix, bert_config.json) for a directory or a prefix such as `.../bert_model.ckpt`."""
  if os.path.isdir(path):
    indexes = sorted(glob.glob(os.path.join(path, "*.index")))
    config = os.path.join(path, CONFIG)
    if indexes and os.path.isfile(config):
      return indexes[0][: -len(".index")], config
    return None
  config = os.path.join(os.path.dirname(path), CONFIG)
  if os.path.isfile(path + ".index") and os.path.isfile(config):
    return path, config
  return None


def tf_name_to_hf(name: str) -> tuple[str, bool] | None:
  """TF1 variable name -> (transformers name, transpose?), or None for optimiser/bookkeeping variables."""
  if _SKIP.search(name):
    return None
  if name in ("output_weights", "output_bias"):  # run_classifier.py's fine-tuned head
    return ("classifier.weight" if name == "output_weights" else "classifier.bias"), False
  if name == "cls/squad/output_weights":  # run_squad.py's head
    return "qa_outputs.weight", False
  if name == "cls/squad/output_bias":
    return "qa_outputs.bias", False
  if name == "cls/predictions/output_bias":
    return "cls.predictions.bias", False
  if name.startswith("cls/seq_relationship/"):
    leaf = "weight" if name.endswith("output_weights") else "bias"
    return f"cls.seq_relationship.{leaf}", False  # output_weights is already [2, H] = [out, in]
  parts = name.split("/")
  transpose = parts[-1] == "kernel"
  leaf = {"kernel": "weight", "gamma": "weight", "beta": "bias", "bias": "bias"}.get(parts[-1])
  if leaf is None:  # embeddings are stored under their table's name
    parts.append("weight")
  else:
    parts[-1] = leaf
  hf = ".".join(parts).replace("encoder.layer_", "encoder.layer.")
  return hf, transpose


def read_state_dict(prefix: str) -> tuple[dict[str, np.ndarray], list[str]]:
  """(transformers-named arrays, names of TF variables that are not weights of any BERT class)."""
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError("reading an original TF1 BERT checkpoint needs TensorFlow: pip install 'jbert[tf]'") from e
  reader = tf.train.load_checkpoint(prefix)
  state, skipped = {}, []
  for name in sorted(reader.get_variable_to_shape_map()):
    mapped = tf_name_to_hf(name)
    if mapped is None:
      skipped.append(name)
      continue
    hf, transpose = mapped
    value = np.asarray(reader.get_tensor(name))
    state[hf] = value.T if transpose else value
  return state, skipped
