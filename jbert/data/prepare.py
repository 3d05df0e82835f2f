"""`python -m jbert.data prepare`: a corpus in the formats users have (`jbert.data.formats`), from local disk or a
bucket, turned once into sentence-split documents in ArrayRecord shards that training reads by random access
(`jbert.data.prepared`), so no training host ever re-reads or re-splits the raw text.

The inputs are planned first (`plan.json`): every file is checked against its name, and cut into units (row
groups, byte ranges, example ranges) that are grouped, in input order, into shards of about `shard_mb` of
input. The plan depends on the inputs and settings alone, so every worker count, every host and every rerun
writes the same shards with the same bytes. Workers (one process per core, `jbert.data.workers`) each write
whole shards: a shard is written under a temporary name and renamed (or uploaded whole), then its part file (its
counts, size and CRC32C), which marks it done; a rerun after a kill skips the done shards whose files are still
the bytes their parts record, and writes the others again (`jbert.data.shards`). Ctrl-C or SIGTERM stop the
workers at once: what was in progress is redone by the rerun. With `num_hosts`, host `host_index` writes the
shards `host_index::num_hosts`, and host 0, once every host's shards are done, writes the vocabulary and the
manifest (`jbert.data.finalize`), last: one writer, so a vocabulary trained then is trained once.
"""
from __future__ import annotations

import base64
import dataclasses
import os
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import numpy as np

from jbert import errors
from jbert.data import finalize as finalize_lib
from jbert.data import formats
from jbert.data import manifest as manifest_lib
from jbert.data import paths
from jbert.data import shards as shards_lib
from jbert.data import vocab as vocab_lib
from jbert.data import workers as workers_lib

ARRAY_RECORD_OPTIONS = "group_size:1,zstd:3"  # one record per group: random access reads one document


@dataclasses.dataclass(frozen=True)
class Options:
  """What `python -m jbert.data prepare` was asked for (its flags, documented there)."""
  inputs: str
  output: str
  settings: formats.Settings = formats.Settings()
  shard_mb: float = 32.0
  eval_documents: int = 2000
  seed: int = 0
  workers: int = 0
  num_hosts: int = 1
  host_index: int = 0
  vocab: str | None = None
  train_vocab: int = 0
  lowercase: bool = True
  vocab_documents: int = 200_000
  vocab_kind: str | None = None  # what --train_vocab trains (jbert.tokenizer's trainable kinds); None: wordpiece


def check(options: Options) -> None:
  for name in ("eval_documents", "workers", "train_vocab", "seed"):
    if getattr(options, name) < 0:
      raise ValueError(f"--{name}={getattr(options, name)} must be >= 0.")
  if options.vocab_documents < 1 or options.settings.max_line_chars < 1 or options.settings.max_record_bytes < 1:
    raise ValueError(f"--vocab_documents={options.vocab_documents}, --max_line_chars="
                     f"{options.settings.max_line_chars} and --max_record_mb (bytes: "
                     f"{options.settings.max_record_bytes}) must be positive.")
  if options.shard_mb <= 0:
    raise ValueError(f"--shard_mb={options.shard_mb} must be positive (MB of input per shard).")
  if not 0 <= options.host_index < options.num_hosts:
    raise ValueError(f"--host_index={options.host_index} must lie in [0, --num_hosts={options.num_hosts}).")
  if options.vocab and options.train_vocab:
    raise ValueError("--vocab and --train_vocab both given; copy a vocabulary in or train one, not both.")
  if options.vocab_kind is not None:
    kinds = vocab_lib.trainable_kinds()
    if options.vocab_kind not in kinds:
      raise ValueError(f"--vocab_kind={options.vocab_kind}; expected one of {', '.join(kinds)}.")
    if not options.train_vocab:
      raise ValueError(f"--vocab_kind={options.vocab_kind} without --train_vocab=N: the kind is what --train_vocab "
                       "trains (a copied --vocab is read as its files say); add --train_vocab=N.")
  if options.settings.format not in ("auto", *formats.FORMATS):
    raise ValueError(f"--format={options.settings.format}; expected auto or one of {', '.join(formats.FORMATS)}.")


def expand_inputs(spec: str) -> list[str]:
  """`--input`'s comma-separated globs, each expanded, and `tfds:NAME[:SPLIT]` entries as they are."""
  entries = [s.strip() for s in spec.split(",") if s.strip()]
  if not entries:
    raise ValueError("--input is empty; pass a glob of Parquet, JSONL or text files, e.g. --input='data/*.parquet'.")
  found = []
  for entry in entries:
    if entry.startswith(formats.TFDS_PREFIX):
      found.append(entry)
    else:
      found += [p if paths.is_url(p) else os.path.abspath(p) for p in paths.expand_globs(entry, "--input")]
  return found


def make_plan(options: Options) -> dict[str, Any]:
  """The inputs with their sizes, the settings, and the units of every shard (lists [input, start, stop, size])."""
  inputs = expand_inputs(options.inputs)
  chunk = max(1, int(options.shard_mb * 1e6))
  with futures.ThreadPoolExecutor(min(16, len(inputs))) as pool:  # metadata reads: I/O-bound on a bucket
    units = list(pool.map(lambda p: formats.units_of(p, options.settings, chunk), inputs))
  shards, current, size = [], [], 0
  for index, file_units in enumerate(units):
    for unit in file_units:
      current.append([index, unit.start, unit.stop, unit.size])
      size += unit.size
      if size >= chunk or unit.format == "tfds":
        shards.append(current)
        current, size = [], 0
  if current:
    shards.append(current)
  return {"format": manifest_lib.FORMAT, "version": manifest_lib.VERSION,
          "settings": {**dataclasses.asdict(options.settings), "shard_mb": options.shard_mb},
          "inputs": [{"path": p, "format": formats.format_of(p, options.settings.format),
                      "bytes": sum(u.size for u in us)} for p, us in zip(inputs, units)],
          "shards": shards}


def _record_plan(output: str, plan: dict[str, Any]) -> None:
  """Writes plan.json, or checks that the one there (an earlier run's, another host's) is the same."""
  path = paths.join(output, manifest_lib.PLAN)
  if paths.exists(path):
    old = manifest_lib.read_json(path)
    if {**old, "version": plan["version"]} == plan:  # an older jbert's: its shards are checked (and rewritten)
      old = plan
      paths.write_atomic(path, manifest_lib.dumps(plan))
    if old != plan:
      raise ValueError(f"{output} holds a preparation of other inputs or settings "
                       f"({manifest_lib.differences(old, plan)}); pass another --output, or the same --input and "
                       "settings to finish or reuse it.")
    return
  paths.write_atomic(path, manifest_lib.dumps(plan))


def write_shard(job: tuple[str, int, int, list[formats.Unit], formats.Settings]) -> dict[str, Any]:
  """Writes one shard and then its part file; returns the part (counts of the shard)."""
  from array_record.python import array_record_module  # pylint: disable=g-import-not-at-top
  output, index, count, units, settings = job
  final = paths.join(output, manifest_lib.shard_name(index, count))
  tmp = paths.temporary(final)
  reader = formats.Reader(settings)
  multi, sentences = [], 0
  try:
    writer = array_record_module.ArrayRecordWriter(tmp, ARRAY_RECORD_OPTIONS)
    try:
      for unit in units:
        for document in reader.documents(unit):
          writer.write("\n".join(document).encode("utf-8"))
          multi.append(len(document) > 1)
          sentences += len(document)
    finally:
      writer.close()
  except RuntimeError as e:  # ArrayRecord's words for a full or read-only disk ("write() failed: No space ...")
    _remove(tmp)
    raise errors.UserError(f"{final}: cannot write this shard ({e}); free space on, or make writable, the disk "
                           f"of {output} (or of the temporary directory for a bucket) and rerun the same command: "
                           "the shards already written are kept.") from e
  except BaseException:
    _remove(tmp)
    raise
  size, crc = os.path.getsize(tmp), shards_lib.crc32c(tmp)  # the temporary is local, even for a bucket
  paths.commit(tmp, final)
  part = {"shard": manifest_lib.shard_name(index, count), "documents": len(multi), "sentences": sentences,
          "bytes": size, "crc32c": crc,
          "input_bytes": sum(u.size for u in units),
          "multi_sentence": base64.b64encode(np.packbits(np.array(multi, bool)).tobytes()).decode("ascii"),
          "bad_records": {p: dict(sorted(c.items())) for p, c in sorted(reader.counts.items()) if c}}
  paths.write_atomic(paths.join(output, manifest_lib.part_name(index, count)), manifest_lib.dumps(part))
  return part


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except OSError:
    pass


def _units(plan: dict[str, Any], index: int) -> list[formats.Unit]:
  inputs = plan["inputs"]
  return [formats.Unit(inputs[i]["path"], inputs[i]["format"], start, stop, size)
          for i, start, stop, size in plan["shards"][index]]


def _settings(plan: dict[str, Any]) -> formats.Settings:
  fields = {f.name for f in dataclasses.fields(formats.Settings)}
  return formats.Settings(**{k: v for k, v in plan["settings"].items() if k in fields})


def _undo_damaged(output: str, count: int, done: set[int], log: Callable[[str], None]) -> set[int]:
  """`done` less the shards that are missing or are not the bytes their part records (size, CRC32C: a truncated,
  overwritten or bit-flipped shard), whose parts are removed so that they are written again."""
  parts = {i: manifest_lib.read_json(paths.join(output, manifest_lib.part_name(i, count))) for i in sorted(done)}
  old = {i for i, p in parts.items() if "crc32c" not in p}  # written by a jbert that recorded no checksum
  records = [{"name": p["shard"], "bytes": p["bytes"], "crc32c": p["crc32c"]} for i, p in parts.items()
             if i not in old]
  found = shards_lib.problems(output, records, read=True)
  found += [f"{parts[i]['shard']} has no recorded checksum (an older jbert's)" for i in sorted(old)]
  if not found:
    return done
  bad = {i for i, p in parts.items() if any(issue.startswith(p["shard"] + " ") for issue in found)}
  for i in bad:
    shards_lib.remove(paths.join(output, manifest_lib.part_name(i, count)))
  log(f"prepare: {len(bad)} written shard(s) are damaged or missing and are written again: "
      f"{errors.listing(found, shown=5)}")
  return done - bad


def _size(n: float) -> str:
  return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _duration(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class _Progress:
  """A line at most every `every` seconds: shards, input bytes, MB/s and the ETA of this host's share."""

  def __init__(self, jobs: list[int], plan: dict[str, Any], log: Callable[[str], None], every: float = 10.0):
    self.sizes = {i: sum(u[3] for u in plan["shards"][i]) for i in jobs}
    self.total, self.bytes, self.shards = sum(self.sizes.values()), 0, 0
    self.log, self.every, self.start, self.last = log, every, time.monotonic(), time.monotonic()

  def add(self, index: int) -> None:
    self.shards += 1
    self.bytes += self.sizes[index]
    now = time.monotonic()
    if now - self.last < self.every and self.shards < len(self.sizes):
      return
    self.last, elapsed = now, now - self.start
    share = self.bytes / self.total if self.total else self.shards / len(self.sizes)
    eta = elapsed * (1 - share) / share if share else 0.0
    self.log(f"prepare: {self.shards}/{len(self.sizes)} shards, {_size(self.bytes)} of {_size(self.total)} "
             f"({100 * share:.1f}%), {self.bytes / 1e6 / max(elapsed, 1e-9):.1f} MB/s, ETA {_duration(eta)}")


def prepare(options: Options, log: Callable[[str], None] = print) -> dict[str, Any] | None:
  """Writes this host's shards of the corpus, resuming a killed run; returns the manifest when all are done."""
  check(options)
  output = options.output
  paths.makedirs(paths.join(output, manifest_lib.PARTS))
  plan = make_plan(options)
  _record_plan(output, plan)
  count = len(plan["shards"])
  ours = [i for i in range(options.host_index, count, options.num_hosts)]
  done = manifest_lib.written(output, count)
  done = _undo_damaged(output, count, done & set(ours), log) | (done - set(ours))  # other hosts check their own
  jobs = [i for i in ours if i not in done]
  # A killed run leaves a shard or a shard's record (parts/) under a temporary name: both folders are swept.
  removed = paths.remove_stale(output) + paths.remove_stale(paths.join(output, manifest_lib.PARTS))
  total = sum(i["bytes"] for i in plan["inputs"])
  log(f"prepare: {len(plan['inputs'])} input(s), {_size(total)}, in {count} shard(s)"
      + (f"; host {options.host_index} of {options.num_hosts} writes {len(ours)}" if options.num_hosts > 1 else "")
      + (f"; {len(ours) - len(jobs)} already written" if len(jobs) < len(ours) else "")
      + (f"; removed {len(removed)} unfinished file(s) of a killed run" if removed else ""))
  if jobs:
    _run(plan, output, jobs, options.workers, log)
  missing = sorted(set(range(count)) - manifest_lib.written(output, count))
  if missing and options.host_index:
    log(f"prepare: this host's shards are written; host 0 writes the manifest once every host's are ({len(missing)} "
        f"shard(s) to go), or run `python -m jbert.data prepare --output={output} --finalize` then.")
    return None
  _wait_for_hosts(output, count, options.num_hosts, log)
  return finalize_lib.finalize(options, plan, log)


def _wait_for_hosts(output: str, count: int, num_hosts: int, log: Callable[[str], None],
                    poll: float = 5.0, every: float = 60.0) -> None:
  """Host 0: waits until every shard is done, saying which hosts it waits for every minute."""
  last = 0.0
  while True:
    missing = sorted(set(range(count)) - manifest_lib.written(output, count))
    if not missing:
      return
    if time.monotonic() - last >= every:
      last = time.monotonic()
      hosts = sorted({i % num_hosts for i in missing})
      log(f"prepare: waiting for {len(missing)} shard(s) of host(s) {hosts} to write the manifest (a host that "
          "stopped: rerun prepare there; its written shards are kept)")
    time.sleep(poll)


def _run(plan: dict[str, Any], output: str, jobs: list[int], workers: int, log: Callable[[str], None]) -> None:
  count, settings = len(plan["shards"]), _settings(plan)
  args = [(output, i, count, _units(plan, i), settings) for i in jobs]
  workers = min(workers or len(os.sched_getaffinity(0)), len(jobs))
  in_memory = any(p.startswith("memory://") for p in [output, *(i["path"] for i in plan["inputs"])])
  progress = _Progress(jobs, plan, log)
  if workers <= 1 or in_memory:  # memory:// lives in this process only
    for job in args:
      write_shard(job)
      progress.add(job[1])
    return
  try:
    workers_lib.run(write_shard, args, workers, lambda part: progress.add(int(part["shard"].split("-")[1])),
                    name=lambda job: manifest_lib.shard_name(job[1], count))
  except BaseException:
    # The workers are stopped (killed, on Ctrl-C): the temporary shards they leave are swept now.
    paths.remove_stale(output)
    paths.remove_stale(paths.join(output, manifest_lib.PARTS))
    raise
