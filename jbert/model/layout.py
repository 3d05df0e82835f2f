"""Conversion between unrolled (`encoder/layer_{i}`) and scanned (`encoder/layers`, leading [L]) params.

Works on plain (unboxed) nested dicts of numpy or JAX arrays, for BertModel and every head.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np

_LAYER = re.compile(r"layer_(\d+)$")


def stack_layers(params: Mapping[str, Any]) -> dict[str, Any]:
  """`encoder/layer_{i}/...` -> `encoder/layers/...` with a leading [L] axis; other entries unchanged."""
  return _map_encoders(params, _stack)


def unstack_layers(params: Mapping[str, Any]) -> dict[str, Any]:
  """`encoder/layers/...` with a leading [L] axis -> `encoder/layer_{i}/...`; other entries unchanged."""
  return _map_encoders(params, _unstack)


def _map_encoders(tree: Mapping[str, Any], fn) -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    if key == "encoder" and isinstance(value, Mapping):
      out[key] = fn(value)
    elif isinstance(value, Mapping):
      out[key] = _map_encoders(value, fn)
    else:
      out[key] = value
  return out


def _stack(encoder: Mapping[str, Any]) -> dict[str, Any]:
  indices = sorted(int(m.group(1)) for m in map(_LAYER.match, encoder) if m)
  if not indices:
    return dict(encoder)
  if indices != list(range(len(indices))):
    raise ValueError(f"Encoder layers must be layer_0..layer_{{L-1}} to stack; found indices {indices}.")
  layers = [encoder[f"layer_{i}"] for i in indices]
  rest = {k: v for k, v in encoder.items() if not _LAYER.match(k)}
  return {**rest, "layers": jax.tree.map(lambda *xs: _stack_fn(xs)(xs), *layers)}


def _unstack(encoder: Mapping[str, Any]) -> dict[str, Any]:
  if "layers" not in encoder:
    return dict(encoder)
  stacked = encoder["layers"]
  num = {x.shape[0] for x in jax.tree.leaves(stacked)}
  if len(num) != 1:
    raise ValueError(f"Scanned layer params disagree on the leading layer axis: sizes {sorted(num)}.")
  rest = {k: v for k, v in encoder.items() if k != "layers"}
  layers = {f"layer_{i}": jax.tree.map(lambda x, i=i: x[i], stacked) for i in range(num.pop())}
  return {**rest, **layers}


def _stack_fn(xs):
  # Keep numpy as numpy so host-side conversions never touch a device.
  return np.stack if all(isinstance(x, np.ndarray) for x in xs) else jnp.stack
