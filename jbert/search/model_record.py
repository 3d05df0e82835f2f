"""What an index records about the model that embedded it, and the check that queries are embedded the same way.

Everything that changes a vector is recorded: the weights and architecture (`fingerprint`), the
sentence-transformers modules after BERT (`modules`: the Dense weights), the tokenizer (the file and a fingerprint
of its pieces and normalisation; `given` when it came from --tokenizer rather than the model folder), the
compute dtype, and the embedding settings (pooling, normalisation, layers, maximum length, lower-casing, the Dense
projection's shape). A resumed build must match its first run in all of them but the paths (`differences`), and
a query model in all of them but the paths and the dtype (`query_embedder`). Indexes built before the tokenizer,
modules and dtype were recorded are checked on what they record.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from typing import Any

import jax
import numpy as np

from jbert.errors import UserError
from jbert.inference.embedding import Embedder
from jbert.tokenizer import SentencePieceTokenizer, Tokenizer

log = logging.getLogger("jbert")

# What each recorded setting is called in a message, and the flag that sets it (None: no flag).
NAMES = {"dtype": ("--dtype", "dtype"), "settings.max_length": ("--max_length", "max_length"),
         "settings.pooling": ("--pooling", "pooling"), "settings.normalize": ("--normalize", "normalize"),
         "settings.lowercase": ("lower-casing", None), "settings.layers": ("layers", None),
         "settings.layer_combine": ("layer_combine", None), "settings.projection": ("the Dense module", None),
         "dim": ("dimension", None), "fingerprint": ("weights", None), "modules": ("Dense module weights", None),
         "tokenizer.fingerprint": ("tokenizer", "tokenizer")}


def fingerprint(model) -> str:
  """sha256 of a loaded model's architecture and weights: another model (or other weights) has another."""
  digest = hashlib.sha256(json.dumps(model.config.to_dict(), sort_keys=True, default=str).encode())
  for leaf in jax.tree.leaves(model.params):
    _update(digest, leaf)
  return digest.hexdigest()


def modules_fingerprint(model) -> str | None:
  """sha256 of the weights of the sentence-transformers modules after BERT (its Dense), None without any."""
  if model.dense_params is None:
    return None
  digest = hashlib.sha256()
  for name in sorted(model.dense_params):
    digest.update(name.encode())
    _update(digest, model.dense_params[name])
  return digest.hexdigest()


def tokenizer_fingerprint(tokenizer: Tokenizer) -> str:
  """sha256 of what decides a tokenizer's ids: its kind, lower-casing and pieces in id order (a SentencePiece
  model's whole file, normalisation rules included). The same vocabulary as vocab.txt or tokenizer.json agrees."""
  digest = hashlib.sha256(f"{type(tokenizer).__name__} lower={tokenizer.do_lower_case}\n".encode())
  if isinstance(tokenizer, SentencePieceTokenizer):
    digest.update(tokenizer.backend.serialized_model_proto())
  else:
    digest.update("\n".join(tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))).encode())
  return digest.hexdigest()


def _update(digest, leaf) -> None:
  leaf = np.ascontiguousarray(np.asarray(leaf))
  digest.update(str((leaf.shape, leaf.dtype)).encode())
  digest.update(leaf.data)


def model_record(embedder: Embedder, tokenizer: str | None = None) -> dict[str, Any]:
  """What an index records about its model, as JSON holds it (a built and a loaded index compare equal).
  `tokenizer`: the --tokenizer the model was loaded with, if any."""
  model = embedder.model
  path = tokenizer if tokenizer is not None else model.folder.tokenizer if model.folder is not None else None
  record = {"path": os.path.abspath(model.path), "fingerprint": fingerprint(model),
            "modules": modules_fingerprint(model), "dim": embedder.dim,
            "tokenizer": {"path": None if path is None else os.path.abspath(path), "given": tokenizer is not None,
                          "fingerprint": tokenizer_fingerprint(model.tokenizer)},
            "dtype": str(embedder.config.dtype), "settings": dataclasses.asdict(embedder.settings)}
  return json.loads(json.dumps(record))


def flat(record: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in record.items():
    if isinstance(value, dict) and key in ("tokenizer", "settings"):
      out.update(flat(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def differences(old: dict[str, Any], new: dict[str, Any], ignore=("path", "tokenizer.path", "tokenizer.given"),
                strict: bool = True) -> list[str]:
  """The recorded keys (flattened, `settings.pooling`) in which two records differ, in the order of `NAMES`.
  Not `strict`: keys the old record lacks (an index of an older jbert) are not compared."""
  old_flat, new_flat = flat(old), flat(new)
  present = set(old_flat) | (set(new_flat) if strict else set())
  keys = [k for k in NAMES if k in present] + sorted(k for k in present if k not in NAMES)
  return [k for k in keys if k not in ignore and old_flat.get(k) != new_flat.get(k)]


def show(value: Any) -> str:
  if isinstance(value, list):
    return ",".join(map(str, value))
  return str(value)


def query_embedder(record: dict[str, Any] | None, model: str | None = None, tokenizer: str | None = None,
                   **kwargs) -> Embedder:
  """An Embedder for queries: `model` (default the index's) and `tokenizer` (default the one the index was built
  with when it was given, else the model folder's) with the index's embedding settings and dtype (`dtype` in
  kwargs overrides it), refused when anything that changes the vectors differs from what the documents were
  embedded with."""
  if record is None:
    if model is None:
      raise UserError("this index records no model (built from vectors); pass --model, or search with vectors.")
    return Embedder(model, tokenizer=tokenizer, **kwargs)
  path = model or record["path"]
  settings = record["settings"]
  if model is None and not os.path.exists(path):
    raise UserError(f"the index's model {path} is gone; pass the same model with --model.")
  recorded_tokenizer = record.get("tokenizer") or {}
  if tokenizer is None and recorded_tokenizer.get("given"):
    tokenizer = recorded_tokenizer["path"]
    if not os.path.exists(tokenizer):
      raise UserError(f"the index's tokenizer {tokenizer} (given with --tokenizer when it was built) is gone; pass "
                      "the same tokenizer with --tokenizer.")
  if kwargs.get("dtype") is None and record.get("dtype"):
    kwargs["dtype"] = record["dtype"]
  embedder = Embedder(path, pooling=tuple(settings["pooling"]), normalize=settings["normalize"],
                      layers=tuple(settings["layers"]), layer_combine=settings["layer_combine"],
                      max_length=settings["max_length"], tokenizer=tokenizer, **kwargs)
  given = tokenizer if tokenizer is not None and tokenizer != recorded_tokenizer.get("path") else None
  _refuse_differences(record, model_record(embedder, tokenizer), path, given)
  if "tokenizer" not in record:
    log.warning("This index was built by an older jbert that did not record its tokenizer, Dense module or dtype; "
                "queries are checked against its weights and settings only. Rebuild it to have them checked.")
  return embedder


def _refuse_differences(record: dict[str, Any], new: dict[str, Any], path: str, tokenizer: str | None) -> None:
  changed = differences(record, new, ignore=("path", "tokenizer.path", "tokenizer.given", "dtype"), strict=False)
  if not changed:
    return
  who = f"--tokenizer={tokenizer}" if tokenizer and changed == ["tokenizer.fingerprint"] else f"--model={path}"
  theirs = f"the index's model ({record['path']})"
  first = changed[0]
  if first in ("fingerprint", "dim"):
    what = f"{new['dim']}-dimensional" if first == "dim" else "another model's"
    raise UserError(f"{who} gives {what} embeddings: the index was made by another model ({record['path']}, "
                    f"{record['dim']} dims); query it with that model.")
  if first == "tokenizer.fingerprint":
    raise UserError(f"{who} tokenizes with another vocabulary than the index's model ({record['path']}, tokenizer "
                    f"{record['tokenizer']['path']}): query it with that tokenizer (--tokenizer) or that model.")
  if first == "modules":
    raise UserError(f"{who} has other Dense module weights than {theirs}; query it with that model.")
  old, now = flat(record)[first], flat(new)[first]
  raise UserError(f"{who} embeds with {NAMES[first][0]} {show(now)} where {theirs} has {show(old)}; query it with "
                  "that model.")
