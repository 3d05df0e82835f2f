"""The last step of `python -m jbert.data prepare`: once every shard is written (by every host), one writer, host 0
or `--finalize`, installs the vocabulary (copied, or trained once on the shards: `jbert.data.vocab`), draws the
held-out evaluation documents and writes the manifest, last, which makes the corpus complete. A rerun on a
finished corpus whose manifest and vocabulary are intact does nothing; one whose manifest or vocabulary is damaged
writes them again.
"""
from __future__ import annotations

import base64
import collections
from collections.abc import Callable
from typing import Any

import numpy as np

from jbert.data import formats
from jbert.data import manifest as manifest_lib
from jbert.data import paths
from jbert.data import vocab as vocab_lib


def _held_out(multi: np.ndarray, wanted: int, seed: int) -> np.ndarray:
  """`wanted` documents drawn at random, those of several sentences first (they make NSP pairs)."""
  rng = np.random.default_rng(seed)
  several, single = np.flatnonzero(multi), np.flatnonzero(~multi)
  if len(several) >= wanted:
    return np.sort(rng.choice(several, wanted, replace=False))
  return np.sort(np.concatenate([several, rng.choice(single, wanted - len(several), replace=False)]))


def finalize(options, plan: dict[str, Any] | None = None,
             log: Callable[[str], None] = print) -> dict[str, Any]:
  """Writes the manifest (and the vocabulary) once every shard is done; refuses naming the missing ones."""
  output = options.output
  requested = {"eval_documents": options.eval_documents, "seed": options.seed, "vocab": options.vocab,
               "train_vocab": options.train_vocab, "lowercase": options.lowercase,
               "vocab_documents": options.vocab_documents}
  if options.vocab_kind not in (None, "wordpiece"):  # a WordPiece corpus prepared before the kinds stays prepared
    requested["vocab_kind"] = options.vocab_kind
  if plan is None:
    path = paths.join(output, manifest_lib.PLAN)
    if not paths.exists(path):
      raise ValueError(f"{output} holds no preparation (no {manifest_lib.PLAN}); run `{manifest_lib.PREPARE}` first.")
    plan = manifest_lib.read_json(path)
  count = len(plan["shards"])
  missing = sorted(set(range(count)) - manifest_lib.written(output, count))
  if missing:
    shown = ", ".join(map(str, missing[:10])) + (" ..." if len(missing) > 10 else "")
    raise ValueError(f"{output}: {len(missing)} of {count} shards are not written yet (shards {shown}); run "
                     "prepare on every host (the same command; each writes its own share) before --finalize.")
  parts = [manifest_lib.read_json(paths.join(output, manifest_lib.part_name(i, count))) for i in range(count)]
  records = [{"name": p["shard"], "documents": p["documents"], "sentences": p["sentences"], "bytes": p["bytes"],
              "crc32c": p["crc32c"]} for p in parts]
  existing = _existing_manifest(output)
  # The shards are compared too: a manifest copied from another corpus, or one whose shards were written again
  # with other bytes, is replaced.
  if existing is not None and existing.get("finalize") == requested and existing.get("shards") == records:
    damage = vocab_lib.damage(options, output, existing.get("vocab"))
    if damage is None:
      log(f"prepare: {output} is already prepared ({existing['documents']:,} documents); nothing to do.")
      return existing
    log(f"prepare: {damage}; the vocabulary is {'copied' if options.vocab else 'trained'} again.")
  multi = np.concatenate([np.unpackbits(np.frombuffer(base64.b64decode(p["multi_sentence"]), np.uint8),
                                        count=p["documents"]).astype(bool) for p in parts])
  bad, by_input = collections.Counter(), collections.defaultdict(collections.Counter)
  for part in parts:
    for path, counts in part["bad_records"].items():
      bad.update(counts)
      by_input[path].update(counts)
  total = int(len(multi))
  if not total:
    inputs = ", ".join(i["path"] for i in plan["inputs"][:3]) + (" ..." if len(plan["inputs"]) > 3 else "")
    raise ValueError(f"nothing usable in {inputs}: every record was bad "
                     f"({_bad_line(bad) or 'no text at all'}); check the format flags (--format, --text_column, "
                     "--text_key) and the files.")
  held_out = _held_out(multi, min(options.eval_documents, total // 10), options.seed)
  vocab = vocab_lib.install(options, output, [paths.join(output, p["shard"]) for p in parts],
                            [p["documents"] for p in parts], [p["crc32c"] for p in parts], log)
  manifest = {
      "format": manifest_lib.FORMAT, "version": manifest_lib.VERSION, "jbert_version": _version(),
      "settings": plan["settings"], "inputs": plan["inputs"],
      "shards": records,
      "documents": total, "sentences": sum(p["sentences"] for p in parts),
      "held_out": {"documents": held_out.tolist(), "several_sentences": int(multi[held_out].sum()),
                   "seed": options.seed, "requested": options.eval_documents},
      "bad_records": dict(sorted(bad.items())),
      "bad_records_by_input": {p: dict(sorted(c.items())) for p, c in sorted(by_input.items())},
      "vocab": vocab, "finalize": requested,
  }
  paths.write_atomic(paths.join(output, manifest_lib.MANIFEST), manifest_lib.dumps(manifest))
  log(f"prepare: {output}: {total:,} documents ({manifest['sentences']:,} sentences) in {count} shard(s); "
      f"{len(held_out):,} held out for evaluation; vocabulary: {vocab or 'none (pass --vocab or --train_vocab)'}")
  if bad:
    log(f"prepare: bad records: {_bad_line(bad)} (by input in {manifest_lib.MANIFEST})")
  log(f"prepare: train with --config.data.source=prepared --config.data.prepared={output}")
  return manifest


def _existing_manifest(output: str) -> dict[str, Any] | None:
  """The manifest already there, or None when there is none or it is not one this jbert reads (it is rewritten)."""
  if not paths.exists(paths.join(output, manifest_lib.MANIFEST)):
    return None
  try:
    return manifest_lib.read(output)
  except ValueError:
    return None


def _bad_line(bad: collections.Counter) -> str:
  return "; ".join(f"{n:,} {formats.BAD[k]}" for k, n in sorted(bad.items()) if n)


def _version() -> str:
  from importlib import metadata  # pylint: disable=g-import-not-at-top
  try:
    return metadata.version("jbert")
  except metadata.PackageNotFoundError:
    return "unknown"
