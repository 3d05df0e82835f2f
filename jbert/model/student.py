"""A student initialised from a teacher's layers (DistilBERT's init), and one encoder layer's parameters.

Works on unboxed or boxed parameter trees of BertModel and every head, scanned (`encoder/layers`, leading [L]) or
unrolled (`encoder/layer_{i}`): everything outside the encoder's layers (embeddings, pooler, the task head) is the
teacher's, and the student keeps the teacher's layout.
"""
from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import jax
import numpy as np

from jbert.model.config import BertConfig

_LAYER = re.compile(r"layer_(\d+)$")


def student_from_teacher(params: Mapping[str, Any], config: BertConfig,
                         teacher_layers: Sequence[int]) -> tuple[BertConfig, dict[str, Any]]:
  """(student config, student params): `config` with `num_hidden_layers=len(teacher_layers)`, and `params` with
  student layer k = teacher layer `teacher_layers[k]` (DistilBERT takes 0, 2, 4, 6, 8, 10 of 12).

  `teacher_layers` must be strictly increasing indices in 0..L-1; anything else is a ValueError saying so.
  """
  layers = check_teacher_layers(teacher_layers, config.num_hidden_layers)
  path, encoder = _find_encoder(params)
  _check_layout(encoder, config)
  if config.scan_layers:
    picked = np.asarray(layers)
    new_encoder = {**encoder, "layers": jax.tree.map(lambda x: x[picked], encoder["layers"])}
  else:
    rest = {k: v for k, v in encoder.items() if not _LAYER.match(k)}
    new_encoder = {**rest, **{f"layer_{k}": encoder[f"layer_{i}"] for k, i in enumerate(layers)}}
  return config.replace(num_hidden_layers=len(layers)), _replace(params, path, new_encoder)


def check_teacher_layers(teacher_layers: Sequence[int], num_layers: int) -> tuple[int, ...]:
  """`teacher_layers` as a tuple of ints, or a ValueError naming what is wrong and the fix."""
  try:
    layers = tuple(teacher_layers)
  except TypeError:
    layers = None
  fix = (f"give strictly increasing teacher layer indices in 0..{num_layers - 1}, e.g. "
         f"{','.join(map(str, range(0, num_layers, 2)))} for every other layer")
  if not layers or not all(isinstance(i, (int, np.integer)) and not isinstance(i, bool) for i in layers):
    raise ValueError(f"student layers {teacher_layers!r}: {fix}.")
  bad = [int(i) for i in layers if not 0 <= i < num_layers]
  if bad:
    raise ValueError(f"student layers {list(map(int, layers))}: the teacher has {num_layers} layers, so {bad[0]} is "
                     f"out of range; {fix}.")
  if any(b <= a for a, b in zip(layers, layers[1:])):
    raise ValueError(f"student layers {list(map(int, layers))} are not strictly increasing; {fix}.")
  return tuple(int(i) for i in layers)


def layer_params(params: Mapping[str, Any], index: int) -> dict[str, Any]:
  """Encoder layer `index`'s parameters (`attention/...`, `mlp/...`, the norms) from either layout."""
  _, encoder = _find_encoder(params)
  if "layers" in encoder:
    return jax.tree.map(lambda x: x[index], encoder["layers"])
  if f"layer_{index}" not in encoder:
    raise ValueError(f"No encoder layer {index}: the parameters hold layer_0..layer_{_count(encoder) - 1}.")
  return encoder[f"layer_{index}"]


def _find_encoder(params: Mapping[str, Any]) -> tuple[tuple[str, ...], Mapping[str, Any]]:
  found = list(_encoders(params))
  if len(found) != 1:
    raise ValueError("Expected the parameters of one BERT model (one `encoder` subtree); found "
                     f"{len(found)}{': ' + ', '.join('/'.join(p) for p, _ in found) if found else ''}.")
  return found[0]


def _encoders(tree: Mapping[str, Any], path: tuple[str, ...] = ()):
  for key, value in tree.items():
    if isinstance(value, Mapping):
      if key == "encoder":
        yield path + (key,), value
      else:
        yield from _encoders(value, path + (key,))


def _count(encoder: Mapping[str, Any]) -> int:
  if "layers" in encoder:
    return len(jax.tree.leaves(encoder["layers"])[0])
  return sum(1 for k in encoder if _LAYER.match(k))


def _check_layout(encoder: Mapping[str, Any], config: BertConfig) -> None:
  scanned = "layers" in encoder
  if scanned != config.scan_layers or _count(encoder) != config.num_hidden_layers:
    held = f"{_count(encoder)} {'scanned' if scanned else 'unrolled'}"
    raise ValueError(f"The teacher's parameters hold {held} layers but its config says {config.num_hidden_layers} "
                     f"{'scanned' if config.scan_layers else 'unrolled'}; pass the config they were built with.")


def _replace(tree: Mapping[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
  if not path:
    return value
  return {**tree, path[0]: _replace(tree[path[0]], path[1:], value)}
