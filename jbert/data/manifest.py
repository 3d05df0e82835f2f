"""The files of a prepared corpus (`python -m jbert.data prepare`), and reading its manifest.

  DIR/plan.json                                   inputs (with sizes), settings and the units of every shard;
                                                  every host and every rerun must arrive at the same plan
  DIR/documents-00000-of-00640.array_record       ArrayRecord shards, one record per document: its sentences,
                                                  UTF-8, joined by "\\n" (group_size 1, zstd: random access)
  DIR/parts/documents-00000-of-00640.json         a shard's counts, size and CRC32C, written after the shard: its
                                                  completion mark
  DIR/vocab.txt (or spm.model)                    the vocabulary, when prepare was given or trained one
  DIR/parts/vocab.json                            what a trained vocab.txt was trained on, so reruns keep it
  DIR/manifest.json                               written last: the corpus is complete

The manifest holds: the format and its version, the jbert version, the settings (format, text column/key,
language, line and record limits, shard size), the inputs with their sizes, the documents, sentences, bytes and
CRC32C of each shard (`jbert.data.shards` checks them), the held-out evaluation documents (global indices,
sorted), the bad records by kind and by input, and the vocabulary's file name. It holds no time or host, so the
same inputs and settings give the same bytes.
"""
from __future__ import annotations

import json
from typing import Any

from jbert.data import paths

FORMAT = "jbert-prepared-corpus"
VERSION = 2  # 2: each shard's size and CRC32C recorded (in its part file and the manifest)
MANIFEST = "manifest.json"
PLAN = "plan.json"
PARTS = "parts"
PREPARE = "python -m jbert.data prepare --input=GLOB --output=DIR"


def shard_name(index: int, count: int) -> str:
  return f"documents-{index:05d}-of-{count:05d}.array_record"


def part_name(index: int, count: int) -> str:
  return f"{PARTS}/documents-{index:05d}-of-{count:05d}.json"


def written(directory: str, count: int) -> set[int]:
  """The shards of `directory` (of `count`) whose part file, written after the shard, marks them done."""
  names = set(paths.listdir(paths.join(directory, PARTS)))
  return {i for i in range(count) if part_name(i, count).rsplit("/", 1)[-1] in names}


def dumps(value: Any) -> bytes:
  return (json.dumps(value, indent=1, sort_keys=True) + "\n").encode("utf-8")


def read_json(path: str) -> Any:
  with paths.open_raw(path) as f:
    return json.loads(f.read().decode("utf-8"))


def differences(old: dict[str, Any], new: dict[str, Any]) -> str:
  """Every setting and input that differs between two plans (`plan.json`), the inputs named up to a bound."""
  found = []
  if old.get("version") != new.get("version"):
    found.append(f"format version {old.get('version')} -> {new.get('version')}")
  for key in sorted(set(old["settings"]) | set(new["settings"])):
    if old["settings"].get(key) != new["settings"].get(key):
      flag = "--max_record_mb (bytes)" if key == "max_record_bytes" else f"--{key}"
      found.append(f"{flag} {old['settings'].get(key)!r} -> {new['settings'].get(key)!r}")
  was, now = {i["path"]: i["bytes"] for i in old["inputs"]}, {i["path"]: i["bytes"] for i in new["inputs"]}
  inputs = [f"input {path}: " + ("new" if path not in was else "gone" if path not in now else
                                 f"{was[path]} -> {now[path]} bytes")
            for path in sorted(set(was) | set(now)) if was.get(path) != now.get(path)]
  found += inputs[:5] + ([f"{len(inputs) - 5:,} more inputs"] if len(inputs) > 5 else [])
  return "; ".join(found) or "the shards' units"


def read(directory: str) -> dict[str, Any]:
  """The manifest of a complete prepared corpus; anything else is a ValueError saying what to run."""
  path = paths.join(directory, MANIFEST)
  if not paths.exists(path):
    if paths.exists(paths.join(directory, PLAN)):
      raise ValueError(f"{directory} is an unfinished preparation (no {MANIFEST} yet): rerun the same `python -m "
                       "jbert.data prepare` command to finish it (on a slice: every host, or `--finalize` once "
                       "they are done).")
    raise ValueError(f"{directory} is not a prepared corpus (no {MANIFEST}); make one with `{PREPARE}`.")
  try:
    manifest = read_json(path)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path} cannot be read ({e}); rerun the `python -m jbert.data prepare` command that made "
                     "it (it rewrites the manifest from the finished shards).") from e
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    raise ValueError(f"{path} is not the manifest of a jbert prepared corpus; make one with `{PREPARE}`.")
  if manifest.get("version") != VERSION:
    raise ValueError(f"{path} is version {manifest.get('version')} of the prepared format; this jbert reads version "
                     f"{VERSION}: rerun the `python -m jbert.data prepare` command that made it with this jbert (it "
                     "writes the shards again, recording their sizes and checksums).")
  return manifest
