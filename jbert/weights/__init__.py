"""Loading and saving BERT weights in every format users already have.

`load_pretrained` reads a Hugging Face directory, an original TF1 checkpoint, a jbert model directory or a jbert
training workdir; every format is first brought to transformers' state-dict names and then mapped by
`hf_names.hf_to_params`, so one mapping (and its shape checks) serves them all.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from jbert.model import (BertConfig, BertForMaskedLM, BertForMultipleChoice, BertForPreTraining,
                         BertForQuestionAnswering, BertForSequenceClassification, BertForTokenClassification,
                         BertModel, init_params, stack_layers)
from jbert.weights import hf_io, hf_names, jbert_dir, tf1

log = logging.getLogger("jbert")

CLASSES = {cls.__name__: cls for cls in (
    BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification, BertForTokenClassification,
    BertForQuestionAnswering, BertForMultipleChoice)}
# transformers' state-dict prefixes of each task head: a checkpoint's head of another shape is re-initialised.
_HEAD_PREFIXES = ("classifier.", "qa_outputs.")
_NUM_LABELED = (BertForSequenceClassification, BertForTokenClassification)


def load_pretrained(path: str, model_cls: type = BertForPreTraining, *, num_labels: int | None = None,
                    rng_seed: int = 0, **overrides) -> tuple[BertConfig, Any]:
  """(config, params) for `model_cls` from `path`; `overrides` replace BertConfig fields (dtype, scan_layers...).

  Weights the class does not use are reported and dropped; a task head (or pooler) the checkpoint lacks, or has
  in another shape, is initialised from `rng_seed` and reported; any other missing weight is an error.
  """
  config_dict, state, skipped = _read_any(os.fspath(path))
  config = dataclasses.replace(BertConfig.from_dict(config_dict), **overrides)
  if num_labels is None and model_cls in _NUM_LABELED:
    num_labels = config_dict.get("num_labels") or len(config_dict.get("id2label") or {}) or None
  state = _drop_mismatched_heads(state, model_cls, num_labels)
  params, unused, missing = hf_names.hf_to_params(state, config, model_cls, num_labels=num_labels)
  unused = sorted(set(unused) | set(skipped))
  if unused:
    log.warning("load_pretrained(%s): %d weights not used by %s were dropped: %s", path, len(unused),
                model_cls.__name__, ", ".join(unused))
  if missing:
    params = _initialise_heads(params, missing, config, model_cls, num_labels, rng_seed, path)
  if config.scan_layers:
    params = stack_layers(params)
  return config, params


def save_pretrained(config: BertConfig, params: Any, out_dir: str, model_cls: type | None = None, *,
                    format: str = "hf") -> str:  # pylint: disable=redefined-builtin
  """Writes a Hugging Face directory (format="hf") or a jbert model directory (format="jbert")."""
  params = nn.meta.unbox(params)
  model_cls = model_cls or infer_model_cls(params)
  num_labels = _num_labels(params, model_cls)
  if format == "jbert":
    jbert_dir.write(out_dir, {**config.to_dict(full=True), "architectures": [model_cls.__name__],
                              "num_labels": num_labels}, params)
  elif format == "hf":
    hf_config = {**config.to_dict(), "architectures": [model_cls.__name__]}
    if num_labels is not None:
      hf_config["id2label"] = {str(i): f"LABEL_{i}" for i in range(num_labels)}
      hf_config["label2id"] = {f"LABEL_{i}": i for i in range(num_labels)}
    state = hf_names.params_to_hf(jax.tree.map(np.asarray, params), config, model_cls)
    hf_io.write(out_dir, hf_config, state)
  else:
    raise ValueError(f"format={format!r}: use 'hf' (transformers) or 'jbert'.")
  return out_dir


def infer_model_cls(params: Any) -> type:
  """The class whose parameter tree `params` is; ambiguous trees ask for `model_cls`."""
  top = set(params)
  if "bert" not in top:
    return BertModel
  if top == {"bert", "mlm", "nsp"}:
    return BertForPreTraining
  if top == {"bert", "mlm"}:
    return BertForMaskedLM
  if top == {"bert", "qa_outputs"}:
    return BertForQuestionAnswering
  if top == {"bert", "classifier"}:
    if "pooler" not in params["bert"]:
      return BertForTokenClassification
    if np.shape(params["classifier"]["kernel"])[-1] != 1:
      return BertForSequenceClassification
  raise ValueError(f"cannot tell which BERT class params with top-level keys {sorted(top)} belong to (e.g. "
                   "multiple choice vs. 1-label regression); pass model_cls=jbert.BertFor... explicitly.")


# ----------------------------------------------------------------------------------------------------------


def _read_any(path: str) -> tuple[dict[str, Any], dict[str, np.ndarray], list[str]]:
  """(config dict, transformers-named state dict, skipped names) of any supported format."""
  if jbert_dir.is_jbert_dir(path):
    config_dict, params = jbert_dir.read(path)
    cls = CLASSES[config_dict.get("architectures", ["BertForPreTraining"])[0]]
    return config_dict, hf_names.params_to_hf(params, BertConfig.from_dict(config_dict), cls), []
  if os.path.isdir(path) and hf_io.is_hf_dir(path):
    return hf_io.read_config(path), hf_io.read_state_dict(path), []
  found = tf1.find_checkpoint(path)
  if found is not None:
    prefix, config_file = found
    state, skipped = tf1.read_state_dict(prefix)
    return BertConfig.from_json_file(config_file).to_dict(), state, skipped
  from jbert import checkpoint  # pylint: disable=g-import-not-at-top  (Orbax managers only when needed)
  if os.path.isdir(path) and checkpoint.find_checkpoint_dir(path) is not None:
    config_dict, params = checkpoint.restore_params(path)
    return config_dict, hf_names.params_to_hf(params, BertConfig.from_dict(config_dict), BertForPreTraining), []
  raise FileNotFoundError(
      f"{path} is not a BERT checkpoint jbert can read. Looked for: a Hugging Face dir (config.json with "
      f"{' or '.join(hf_io.WEIGHT_FILES)}), a TF1 checkpoint (bert_config.json beside *.ckpt.index), a jbert "
      "model dir (config.json + params/) or a jbert workdir (checkpoints/<step>/state).")


def _drop_mismatched_heads(state, model_cls, num_labels):
  if num_labels is None:
    return state
  expected = {"qa_outputs.": 2, "classifier.": 1 if model_cls is BertForMultipleChoice else num_labels}
  keep = {}
  for name, value in state.items():
    head = next((p for p in _HEAD_PREFIXES if name.startswith(p)), None)
    if head and np.shape(value)[0] != expected[head]:
      log.warning("load_pretrained: %s has %d outputs, %s wants %d; it is re-initialised.", name,
                  np.shape(value)[0], model_cls.__name__, expected[head])
      continue
    keep[name] = value
  return keep


def _initialise_heads(params, missing, config, model_cls, num_labels, rng_seed, path):
  backbone = [m for m in missing if m.startswith("bert/") and not m.startswith("bert/pooler/")]
  if backbone:
    raise ValueError(f"{path} lacks weights {model_cls.__name__} needs: {', '.join(backbone)}. Check the "
                     "checkpoint and that config.json matches it.")
  kwargs = {"num_labels": num_labels} if model_cls in _NUM_LABELED and num_labels is not None else {}
  fresh = nn.meta.unbox(init_params(model_cls(dataclasses.replace(config, scan_layers=False), **kwargs),
                                    jax.random.key(rng_seed)))
  for name in missing:
    node_new, node_fresh = params, fresh
    *parents, leaf = name.split("/")
    for p in parents:
      node_new = node_new.setdefault(p, {})
      node_fresh = node_fresh[p]
    node_new[leaf] = np.asarray(node_fresh[leaf])
  log.warning("load_pretrained(%s): %s weights not in the checkpoint were initialised: %s", path, model_cls.__name__,
              ", ".join(missing))
  return params


def _num_labels(params, model_cls) -> int | None:
  if model_cls in _NUM_LABELED:
    return int(np.shape(params["classifier"]["kernel"])[-1])
  return None
