"""Original google-research/bert TF1 checkpoints (bert_config.json beside bert_model.ckpt.*).

Variables are renamed to transformers' state-dict names (dense kernels transposed to torch's [out, in]) so one
mapping, `hf_names.hf_to_params`, serves both formats and checks every shape.
"""
from __future__ import annotations

import glob
import os
import re

import numpy as np

from jbert import untrusted
from jbert.weights import sizes

CONFIG = "bert_config.json"
# Optimiser slots and bookkeeping that run_pretraining.py / run_classifier.py save beside the weights.
_OPTIMIZER = re.compile(r"(^|/)(adam_m|adam_v|global_step|bad_steps|good_steps|loss_scale)$")
# `model.ckpt-1000.index` / `model.ckpt-1000.data-00000-of-00001` name the prefix `model.ckpt-1000`.
_SUFFIX = re.compile(r"\.(index|meta|data-\d+-of-\d+)$")


def find_checkpoint(path: str) -> tuple[str, str] | None:
  """(checkpoint prefix, bert_config.json) for a directory, a prefix or one of its files; else None.

  A directory with several checkpoints uses the one its `checkpoint` state file names; failing that it is
  ambiguous and a ValueError lists the prefixes to choose from.
  """
  if os.path.isdir(path):
    config = os.path.join(path, CONFIG)
    prefixes = sorted(p[: -len(".index")] for p in glob.glob(os.path.join(path, "*.index")))
    if not prefixes or not os.path.isfile(config):
      return None
    if len(prefixes) > 1:
      latest = _latest_from_state_file(path)
      if latest not in prefixes:
        raise ValueError(f"{path} holds {len(prefixes)} TF checkpoints ({', '.join(map(os.path.basename, prefixes))})"
                         " and no `checkpoint` file names one of them; pass the prefix, e.g. "
                         f"{prefixes[-1]}.")
      return latest, config
    return prefixes[0], config
  prefix = _SUFFIX.sub("", path)
  config = os.path.join(os.path.dirname(prefix), CONFIG)
  if os.path.isfile(prefix + ".index") and os.path.isfile(config):
    return prefix, config
  return None


def _latest_from_state_file(directory: str) -> str | None:
  """The prefix named by TF's `checkpoint` text file (`model_checkpoint_path: "..."`), if any."""
  state = os.path.join(directory, "checkpoint")
  if not os.path.isfile(state):
    return None
  match = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', untrusted.read_text(state), re.MULTILINE)
  return os.path.join(directory, match.group(1)) if match else None


def tf_name_to_hf(name: str) -> tuple[str, bool] | None:
  """TF1 variable name -> (transformers name, transpose?), or None for optimiser/bookkeeping variables."""
  if _OPTIMIZER.search(name):
    return None
  special = {
      "output_weights": "classifier.weight",  # run_classifier.py's fine-tuned head, already [out, in]
      "output_bias": "classifier.bias",
      "cls/squad/output_weights": "qa_outputs.weight",  # run_squad.py's head
      "cls/squad/output_bias": "qa_outputs.bias",
      "cls/predictions/output_bias": "cls.predictions.bias",
      "cls/seq_relationship/output_weights": "cls.seq_relationship.weight",  # [2, H] = [out, in]
      "cls/seq_relationship/output_bias": "cls.seq_relationship.bias",
  }
  if name in special:
    return special[name], False
  parts = name.split("/")
  transpose = parts[-1] == "kernel"  # tf.layers.dense kernels are [in, out]
  leaf = {"kernel": "weight", "gamma": "weight", "beta": "bias", "bias": "bias"}.get(parts[-1])
  if leaf is None:  # Embedding tables are variables named after the table.
    parts.append("weight")
  else:
    parts[-1] = leaf
  return ".".join(parts).replace("encoder.layer_", "encoder.layer."), transpose


def read_state_dict(prefix: str) -> tuple[dict[str, np.ndarray], dict[str, str], list[str]]:
  """(transformers-named arrays, {transformers name: TF name}, names of skipped optimiser variables)."""
  try:
    import tensorflow as tf  # pylint: disable=g-import-not-at-top  (TensorFlow only for this format)
  except ImportError as e:
    raise ImportError(f"{prefix} is an original TF1 BERT checkpoint and reading it needs TensorFlow: "
                      "pip install 'jbert[tf]'.") from e
  data_files = _data_files(prefix)
  try:
    reader = tf.train.load_checkpoint(prefix)
  except tf.errors.OpError as e:
    raise ValueError(f"{prefix}.index cannot be read by TensorFlow ({_first_line(e)}): the file is truncated or "
                     "corrupt; copy the checkpoint again.") from None
  state, tf_names, optimizer = {}, {}, []
  for name in sorted(reader.get_variable_to_shape_map()):
    mapped = tf_name_to_hf(name)
    if mapped is None:
      optimizer.append(name)
      continue
    hf, transpose = mapped
    try:
      value = np.asarray(reader.get_tensor(name))
    except (tf.errors.OpError, IndexError, ValueError) as e:  # TF raises IndexError for a short read
      raise ValueError(f"variable {name} of {prefix} cannot be read ({_first_line(e)}): a data file "
                       f"({', '.join(map(os.path.basename, data_files))}) is truncated or corrupt; copy the "
                       "checkpoint again.") from None
    state[hf] = np.ascontiguousarray(value.T) if transpose else value
    tf_names[hf] = name
  return state, tf_names, optimizer


def stored(prefix: str) -> sizes.Stored:
  """The bytes of a checkpoint's data files: what bounds the values it can hold (read without TensorFlow)."""
  files = _data_files(prefix)
  return sizes.Stored(files[0] if len(files) == 1 else f"{prefix}.data-*", sum(os.path.getsize(f) for f in files))


def _data_files(prefix: str) -> list[str]:
  """`prefix.data-i-of-n` for every i; a FileNotFoundError names the missing ones (an index alone holds no
  weights)."""
  found = sorted(glob.glob(glob.escape(prefix) + ".data-*-of-*"))
  counts = {int(m.group(1)) for m in (re.search(r"-of-(\d+)$", f) for f in found) if m}
  total = max(counts) if counts else 1
  wanted = [f"{prefix}.data-{i:05d}-of-{total:05d}" for i in range(total)]
  missing = [os.path.basename(f) for f in wanted if f not in found]
  if missing:
    raise FileNotFoundError(f"{prefix}.index has no data file {', '.join(missing)} beside it: a TF checkpoint is "
                            "the .index and every .data-* file; copy all of them.")
  for file in (f"{prefix}.index", *wanted):  # TensorFlow would block on a FIFO, or read /dev/zero for ever.
    untrusted.check_regular(file)
  return wanted


def _first_line(error) -> str:
  return (getattr(error, "message", None) or str(error)).strip().splitlines()[0]
