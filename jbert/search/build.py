"""Building an index from a corpus file, streaming and resumable; embedding queries as the corpus was embedded.

`build_index(corpus, model, index_dir)`:
  1. reads the corpus once through `jbert.data.files` (every bad line, a missing column, a repeated id or an empty
     corpus is refused before the model loads) and counts its documents;
  2. embeds it chunk by chunk (`jbert.inference.Embedder`: length-sorted buckets within a chunk) with a progress
     line, each chunk written to `INDEX_DIR.partial/chunks/NNNNNN.npy` under a temporary name and renamed when
     complete, beside `manifest.json` (the corpus, the model and the settings the chunks were made with);
  3. builds the faiss index from the chunks, writes it whole under a temporary name and renames it to INDEX_DIR,
     then removes INDEX_DIR.partial.
A rerun after an interruption (Ctrl-C, kill -9, a full disk) keeps the complete chunks and embeds the rest; chunks
are fixed row ranges, so the result is the index an uninterrupted build makes. One process builds an index at a
time (a `flock` on INDEX_DIR.partial/.lock); a different corpus, model or setting for an unfinished build is
refused rather than mixed in.

The index records its model (path, fingerprint of config and weights, embedding settings); `query_embedder`
embeds queries with those settings and refuses another model.
"""
from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
from typing import Any, Iterator

import jax
import numpy as np

from jbert.data import files
from jbert.errors import UserError
from jbert.inference import io, runner
from jbert.inference.embedding import EmbedSettings, Embedder
from jbert.inference.progress import ProgressLine
from jbert.runtime import atomic
from jbert.search.index import Index, IndexSettings

MANIFEST, CHUNKS, LOCK = "manifest.json", "chunks", ".lock"
DEFAULT_CHUNK_SIZE = 8192
# IVF k-means sees at most this many documents per cell (faiss samples 256 per cell itself beyond it).
_TRAIN_PER_CELL = 256


# -- the corpus --


def documents(path: str, text_column: str | None = None, id_column: str | None = None) -> Iterator[tuple[Any, str]]:
  """(id, text) of every document of a corpus file, in order: a .txt line per document (id: its line number), or
  the records of a .jsonl/.csv/.tsv file (text: `text_column`, default "text" or a one-column file's column; id:
  `id_column`, default the record's line number)."""
  if files.input_format(path) == "text":
    if text_column or id_column:
      raise UserError(f"{path} is a text file (one document per line): it has no columns; drop --text_column and "
                      "--id_column (ids are line numbers).")
    yield from files.lines(path)
    return
  if text_column is None and files.input_format(path) != "jsonl":
    header = files.columns(path)
    text_column = header[0] if len(header) == 1 and "text" not in header else None
  text_column = text_column or "text"
  names = [text_column] + ([id_column] if id_column else [])
  for row, (line, record) in enumerate(files.rows(path)):
    files.require_columns(record, names, path, row, line, "Name the columns with --text_column / --id_column.")
    text = "" if record[text_column] is None else record[text_column]
    if not isinstance(text, str):
      raise UserError(f"{files.where(path, line)}: field {text_column!r} is a {type(text).__name__}, not text.")
    doc_id = record[id_column] if id_column else line
    if not isinstance(doc_id, (str, int)) or isinstance(doc_id, bool):
      raise UserError(f"{files.where(path, line)}: id {doc_id!r} is not a string or an integer.")
    yield doc_id, text


def scan(path: str, text_column: str | None = None, id_column: str | None = None) -> int:
  """The number of documents, after reading them all once: the first bad line or repeated id is refused here."""
  if os.path.isdir(path):
    raise UserError(f"--corpus={path} is a directory; name a file in it.")
  if not os.path.isfile(path):
    raise UserError(f"--corpus={path} does not exist.")
  seen: set = set()
  for doc_id, _ in documents(path, text_column, id_column):
    if doc_id in seen:
      raise UserError(f"{path}: id {doc_id!r} is used by two documents; ids name one document each (drop "
                      "--id_column to use line numbers).")
    seen.add(doc_id)
  if not seen:
    raise UserError(f"--corpus={path} holds no documents; nothing to index.")
  return len(seen)


# -- the model record --


def fingerprint(model) -> str:
  """sha256 of a loaded model's architecture and weights: another model (or other weights) has another."""
  digest = hashlib.sha256(json.dumps(model.config.to_dict(), sort_keys=True, default=str).encode())
  for leaf in jax.tree.leaves(model.params):
    leaf = np.ascontiguousarray(np.asarray(leaf))
    digest.update(str((leaf.shape, leaf.dtype)).encode())
    digest.update(leaf.data)
  return digest.hexdigest()


def model_record(embedder: Embedder) -> dict[str, Any]:
  """What an index records about its model, as JSON holds it (a built and a loaded index compare equal)."""
  record = {"path": os.path.abspath(embedder.model.path), "fingerprint": fingerprint(embedder.model),
            "dim": embedder.dim, "settings": dataclasses.asdict(embedder.settings)}
  return json.loads(json.dumps(record))


def query_embedder(record: dict[str, Any] | None, model: str | None = None, **kwargs) -> Embedder:
  """An Embedder for queries: `model` (default the index's) with the index's embedding settings, refused when its
  weights, architecture or dimension are not those the documents were embedded with."""
  if record is None:
    if model is None:
      raise UserError("this index records no model (built from vectors); pass --model, or search with vectors.")
    return Embedder(model, **kwargs)
  path = model or record["path"]
  settings = EmbedSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in record["settings"].items()})
  if model is None and not os.path.exists(path):
    raise UserError(f"the index's model {path} is gone; pass the same model with --model.")
  embedder = Embedder(path, pooling=settings.pooling, normalize=settings.normalize, layers=settings.layers,
                      layer_combine=settings.layer_combine, max_length=settings.max_length, **kwargs)
  if embedder.dim != record["dim"] or fingerprint(embedder.model) != record["fingerprint"]:
    what = f"{embedder.dim}-dimensional" if embedder.dim != record["dim"] else "another model's"
    raise UserError(f"--model={path} gives {what} embeddings: the index was made by another model "
                    f"({record['path']}, {record['dim']} dims); query it with that model.")
  return embedder


# -- building --


@dataclasses.dataclass(frozen=True)
class BuildOptions:
  """How a corpus is read and embedded (the index kind is `IndexSettings`)."""
  text_column: str | None = None
  id_column: str | None = None
  pooling: str | None = None
  normalize: bool | None = None
  max_length: int | None = None
  batch_size: int = runner.DEFAULT_BATCH_SIZE
  dtype: str | None = None
  tokenizer: str | None = None
  chunk_size: int = DEFAULT_CHUNK_SIZE
  progress: bool | None = None


def build_index(corpus: str, model: str, index_dir: str, settings: IndexSettings = IndexSettings(),
                options: BuildOptions = BuildOptions()) -> Index:
  """Embeds `corpus` with `model` into the index folder `index_dir` (see the module docstring)."""
  index_dir = os.path.abspath(index_dir)
  _refuse_existing(index_dir)
  if options.chunk_size < 1:
    raise UserError(f"--chunk_size={options.chunk_size} must be at least 1.")
  count = scan(corpus, options.text_column, options.id_column)
  partial = f"{index_dir}.partial"
  os.makedirs(os.path.join(partial, CHUNKS), exist_ok=True)
  lock = _lock(partial, index_dir)
  try:
    embedder = Embedder(model, pooling=options.pooling, normalize=options.normalize, max_length=options.max_length,
                        batch_size=options.batch_size, dtype=options.dtype, tokenizer=options.tokenizer)
    record = model_record(embedder)
    stat = os.stat(corpus)
    manifest = {"corpus": os.path.abspath(corpus), "corpus_bytes": stat.st_size, "corpus_mtime_ns": stat.st_mtime_ns,
                "documents": count, "text_column": options.text_column, "id_column": options.id_column,
                "chunk_size": options.chunk_size, "model": record, "settings": dataclasses.asdict(settings)}
    done = _resume(partial, manifest)
    _embed_chunks(embedder, corpus, options, partial, done, count)
    embedder.report_truncation(count)
    index = _assemble(corpus, options, partial, settings, record, count)
    _refuse_existing(index_dir)
    index.save(index_dir)
    shutil.rmtree(partial)
  finally:
    os.close(lock)
  return index


def _refuse_existing(index_dir: str) -> None:
  if os.path.exists(index_dir):
    raise UserError(f"--index={index_dir} already exists; choose another path, or remove it to build it again.")


def _lock(partial: str, index_dir: str) -> int:
  """An exclusive flock on the build's folder, dropped by the kernel however the process ends."""
  fd = os.open(os.path.join(partial, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
  try:
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
  except BlockingIOError:
    os.close(fd)
    raise UserError(f"{index_dir} is being built by another process (it holds {partial}/{LOCK}); wait for it to "
                    "finish, or choose another --index.") from None
  return fd


def _chunk_path(partial: str, k: int) -> str:
  return os.path.join(partial, CHUNKS, f"{k:06d}.npy")


def _resume(partial: str, manifest: dict[str, Any]) -> int:
  """The number of complete chunks of an earlier build of the same inputs (0 for a new build)."""
  path = os.path.join(partial, MANIFEST)
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
    changed = [k for k in manifest if old.get(k) != manifest[k]]
    if changed:
      raise UserError(f"{partial} holds an unfinished build of other inputs ({', '.join(changed)} differ); rerun "
                      f"it with the same corpus, model and flags, or remove {partial} to start over.")
  else:
    with atomic.open_for_write(path, encoding="utf-8") as f:
      json.dump(manifest, f, indent=2)
  for name in os.listdir(os.path.join(partial, CHUNKS)):
    if name.startswith("."):  # A chunk a killed build was writing (under the lock, no one else writes here).
      os.remove(os.path.join(partial, CHUNKS, name))
  done = 0
  while os.path.isfile(_chunk_path(partial, done)):
    done += 1
  return done


def _embed_chunks(embedder: Embedder, corpus: str, options: BuildOptions, partial: str, done: int,
                  count: int) -> None:
  size = options.chunk_size
  remaining = max(count - done * size, 0)
  enabled = remaining >= runner.PROGRESS_MIN_ROWS if options.progress is None else options.progress
  progress = ProgressLine(remaining, "embed", enabled=enabled)
  texts: list[str] = []
  k = 0
  for i, (_, text) in enumerate(documents(corpus, options.text_column, options.id_column)):
    if i < done * size:
      continue
    texts.append(text)
    if len(texts) == size or i == count - 1:
      k = i // size
      with io.NpyWriter(_chunk_path(partial, k)) as out:
        out.write(embedder(texts, progress=progress, offset=k * size))
      texts = []
  progress.close()


def _chunks(partial: str, count: int, size: int) -> Iterator[np.ndarray]:
  for k in range(-(-count // size)):
    yield np.load(_chunk_path(partial, k), mmap_mode="r")


def _assemble(corpus: str, options: BuildOptions, partial: str, settings: IndexSettings, record: dict[str, Any],
              count: int) -> Index:
  index = Index(record["dim"], settings, model=record, count_hint=count)
  if settings.index_type == "ivf":  # k-means on an even sample of the corpus: the same sample on every rerun
    keep = min(count, index._index.nlist * _TRAIN_PER_CELL)  # pylint: disable=protected-access
    rows = set(np.linspace(0, count - 1, keep).astype(np.int64).tolist())
    sample, start = [], 0
    for block in _chunks(partial, count, options.chunk_size):
      sample += [block[r - start] for r in range(start, start + len(block)) if r in rows]
      start += len(block)
    index.train(np.stack(sample))
  docs = documents(corpus, options.text_column, options.id_column)
  for block in _chunks(partial, count, options.chunk_size):
    ids, texts = zip(*(next(docs) for _ in range(len(block))))
    index.add(np.asarray(block), ids, texts)
  return index
