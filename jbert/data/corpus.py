"""Which corpus a pretraining run reads: one line at its start, and, for phase 2, the phase-1 workdir's.

`configs/phase2.py` leaves the data keys of `inheritable` unset (None, typed, so `--config.data.KEY=VALUE` still
works). `inherit` then fills each from the config that trained `init_from` (WORKDIR/config.json), so phase 2
reads phase 1's corpus with its recipe (NSP, masking, document groups) instead of a default one; a key given on
the command line keeps its value, and a key neither gives takes jbert's default. Without a corpus to take (no
init_from, or one that is not a jbert workdir) the run stops, naming the two ways to give one.
"""
from __future__ import annotations

import copy
import json
from typing import Any

from etils import epath
import ml_collections

from jbert.data import config as data_config
from jbert.data import prepared

# How this run runs or what phase 2 changes, not what it reads: never inherited. The tokenizer comes with init_from.
OWN = ("max_seq_length", "max_predictions_per_seq", "vocab", "num_shards", "worker_count", "worker_buffer_size",
       "prefetch_groups")
RECORD = "config.json"  # what jbert.train.workdir_record writes in every workdir: the config that trained it


def inheritable() -> list[str]:
  return [k for k in data_config.default_pretrain_config() if k not in OWN]


def leave_to_init_from(data_cfg: ml_collections.ConfigDict) -> None:
  """Unsets the inheritable keys of a config's data section (configs/phase2.py)."""
  defaults = data_config.default_pretrain_config()
  for key in inheritable():
    data_cfg[key] = ml_collections.FieldReference(None, field_type=defaults.get_type(key))


def _recorded_data(init_from: str) -> dict[str, Any] | None:
  path = epath.Path(init_from) / RECORD
  try:
    return json.loads(path.read_text(encoding="utf-8"))["config"]["data"]
  except (OSError, ValueError, KeyError, TypeError):
    return None


def inherit(config: ml_collections.ConfigDict) -> tuple[ml_collections.ConfigDict, list[tuple[str, Any]]]:
  """`config` with its unset data keys filled (module docstring), and the (key, value) pairs taken from
  init_from's workdir that are not jbert's defaults (the source always). A config whose `data.source` is set is
  returned as it is."""
  data = config.get("data")
  if data is None or "source" not in data or data.source is not None:
    return config, []
  init_from = config.get("init_from")
  recorded = _recorded_data(init_from) if init_from else None
  if recorded is None or recorded.get("source") is None:
    where = f"init_from={init_from} is not a jbert training workdir (no {RECORD})" if init_from else "no init_from"
    raise ValueError(f"data.source is unset, to take the corpus of the phase-1 run, but there is {where}: pass "
                     "--config.init_from=PHASE1_WORKDIR, or name the corpus (--config.data.source=prepared "
                     "--config.data.prepared=DIR, or source=text/files/tfds with its keys).")
  config = copy.deepcopy(config)
  defaults, taken = data_config.default_pretrain_config(), []
  for key in inheritable():
    if data[key] is not None:
      continue
    if recorded.get(key) is not None:
      config.data[key] = recorded[key]
      if key == "source" or recorded[key] != defaults[key]:  # what the record says beyond the defaults
        taken.append((key, recorded[key]))
    elif defaults[key] is not None:
      config.data[key] = defaults[key]
  return config, taken


def describe(data_cfg: ml_collections.ConfigDict) -> str:
  """The corpus in a few words, for the run's first lines."""
  source = data_cfg.source
  if source == "prepared":
    manifest = prepared.PreparedDocuments(data_cfg.prepared).manifest
    return (f"prepared corpus {data_cfg.prepared}: {manifest['documents']:,} documents in "
            f"{len(manifest['shards'])} shards, {len(manifest['held_out']['documents']):,} held out")
  if source == "synthetic":
    return ("the generated demo corpus (data.source=synthetic; for your own text: python -m jbert.data prepare, "
            "then --config.data.source=prepared --config.data.prepared=DIR)")
  if source == "tfds":
    return f"TFDS {data_cfg.tfds_name}[{data_cfg.tfds_split}]"
  if source == "text":
    return f"text files {data_cfg.text_files}"
  return f"BERT-format files {data_cfg.files}"
