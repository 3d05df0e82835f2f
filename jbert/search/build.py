"""Building an index from a corpus file, streaming and resumable; embedding queries as the corpus was embedded.

`build_index(corpus, model, index_dir)`:
  1. reads the corpus once through `jbert.data.files` (every bad line, a missing column, a repeated id or an empty
     corpus is refused before the model loads) and counts its documents, against which the index settings are
     checked (`IndexSettings.check`: --nlist, --nprobe, --ef_search);
  2. embeds it chunk by chunk (`jbert.inference.Embedder`: length-sorted buckets within a chunk) with a progress
     line, each chunk written to `INDEX_DIR.partial/chunks/NNNNNN.npy` under a temporary name and renamed when
     complete, beside `manifest.json` (the corpus, the model and the settings the chunks were made with);
  3. builds the faiss index from the chunks, writes it whole under a temporary name and renames it to INDEX_DIR,
     then removes INDEX_DIR.partial.
A rerun after an interruption (Ctrl-C, kill -9, a full disk) keeps the complete chunks and embeds the rest; chunks
are fixed row ranges, so the result is the index an uninterrupted build makes. A chunk damaged since it was
written (junk, cut short, another array in its place: `partial.read_chunk`) is named in a warning and embedded
again. A run that stops before its first chunk is written (a refused model, Ctrl-C, a full disk) removes the
folder it took: nothing is left behind, while a folder holding chunks stays for the rerun. One process builds an
index at a time (a `flock` on INDEX_DIR.partial/.lock); a different corpus, model or setting that changes the
vectors (the dtype, the tokenizer, the maximum length, the pooling...) for an unfinished build is refused by name,
with the flag that restores it, rather than mixed in; `--batch_size` may change.

The index records its model (`jbert.search.model_record`: everything that changes a vector); `query_embedder`
embeds queries with those settings and refuses a model that differs in any of them.

A user's storage fault (a read-only folder, a full disk) at any write is one line naming the file, with what was
embedded kept for the rerun; faiss is checked before the model loads; the leftovers of killed builders are removed
when a builder takes the folder (`jbert.search.partial`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
from typing import Any, Iterator

import numpy as np

from jbert.data import files
from jbert.errors import UserError
from jbert.inference import io, runner
from jbert.inference.embedding import Embedder
from jbert.inference.progress import ProgressLine
from jbert.search import index as index_lib
from jbert.search import model_record
from jbert.search import partial as partial_lib
from jbert.search.index import Index, IndexSettings, faiss_module
DEFAULT_CHUNK_SIZE = 8192
# IVF k-means sees at most this many documents per cell (faiss samples 256 per cell itself beyond it).
_TRAIN_PER_CELL = 256

log = logging.getLogger("jbert")


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

  def check(self) -> None:
    """Values no build can use, refused before anything is read."""
    for name in ("chunk_size", "batch_size"):
      if getattr(self, name) < 1:
        raise UserError(f"--{name}={getattr(self, name)} must be at least 1.")
    if self.max_length is not None and self.max_length < 2:
      raise UserError(f"--max_length={self.max_length} must be at least 2 (the [CLS] and [SEP] tokens).")


def build_index(corpus: str, model: str, index_dir: str, settings: IndexSettings = IndexSettings(),
                options: BuildOptions = BuildOptions()) -> Index:
  """Embeds `corpus` with `model` into the index folder `index_dir` (see the module docstring)."""
  index_dir = os.path.abspath(index_dir)
  faiss_module()  # before the corpus is read or the model loads: nothing is worth doing without it
  options.check()
  _refuse_existing(index_dir)
  count = scan(corpus, options.text_column, options.id_column)
  settings.check(count)  # --nlist and the like against the corpus, before the folder or the model
  existed = os.path.isdir(f"{index_dir}.partial")
  try:
    folder = partial_lib.BuildFolder.take(index_dir)
  except OSError as e:
    if existed:
      raise UserError(_storage_message(e.filename or f"{index_dir}.partial", e, index_dir,
                                       partial_lib.complete_chunks(f"{index_dir}.partial"))) from None
    raise UserError(f"cannot create {index_dir}.partial: {e.strerror}; {_fix(e, os.path.dirname(index_dir))} or "
                    "choose another --index folder.") from None
  try:
    folder.remove_leftovers()
    if os.path.exists(index_dir):  # another builder finished it since we looked: our folder is of no use
      folder.remove()
      _refuse_existing(index_dir)
    embedder = Embedder(model, pooling=options.pooling, normalize=options.normalize, max_length=options.max_length,
                        batch_size=options.batch_size, dtype=options.dtype, tokenizer=options.tokenizer)
    record = model_record.model_record(embedder, options.tokenizer)
    stat = os.stat(corpus)
    manifest = {"corpus": os.path.abspath(corpus), "corpus_bytes": stat.st_size, "corpus_mtime_ns": stat.st_mtime_ns,
                "documents": count, "text_column": options.text_column, "id_column": options.id_column,
                "chunk_size": options.chunk_size, "model": record, "settings": dataclasses.asdict(settings)}
    todo = _resume(folder, manifest, record["dim"])
    _embed_chunks(embedder, corpus, options, folder, todo, count)
    embedder.report_truncation(count)
    index = _assemble(corpus, options, folder, settings, record, count)
    _refuse_existing(index_dir)
    try:
      index.save(index_dir)
    except index_lib.StorageError as e:
      chunks = partial_lib.complete_chunks(folder.path)
      raise UserError(_storage_message(e.path, e.error, index_dir, chunks)) from None
    folder.remove()
  except BaseException:
    # Stopped (refused, interrupted, failed) before any chunk was written: the folder holds no work, so it goes,
    # lock and all, as if the run had never started. One with chunks stays for the rerun.
    if not partial_lib.complete_chunks(folder.path):
      folder.remove()
    raise
  finally:
    folder.close()
  return index


def _refuse_existing(index_dir: str) -> None:
  if os.path.exists(index_dir):
    partial_lib.remove_orphan(index_dir)
    raise UserError(f"--index={index_dir} already exists; choose another path, or remove it to build it again.")


def _storage_message(path: str, error: OSError, index_dir: str, chunks: int) -> str:
  """A write that failed for the user's storage: the file, why, the fix and what the rerun keeps."""
  partial = f"{index_dir}.partial"
  fix = _fix(error, os.path.dirname(path))
  kept = ("nothing was embedded yet" if not chunks else
          f"the {chunks} chunk{'s' if chunks > 1 else ''} embedded so far {'are' if chunks > 1 else 'is'} kept in "
          f"{partial}")
  return f"cannot write {path}: {error.strerror or error}; {fix} and rerun the same command ({kept})."


def _fix(error: OSError, folder: str) -> str:
  if error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
    return f"free space on {_mount_point(folder)}"
  return f"make {folder} writable"


def _mount_point(path: str) -> str:
  path = os.path.abspath(path)
  while not os.path.ismount(path):
    path = os.path.dirname(path)
  return path


@contextlib.contextmanager
def _writing(path: str, folder: partial_lib.BuildFolder) -> Iterator[None]:
  """A storage error inside is one line naming `path` (the file as the user will see it)."""
  try:
    yield
  except OSError as e:
    cause = e.__cause__ if isinstance(e, io.OutputError) and isinstance(e.__cause__, OSError) else e
    chunks = partial_lib.complete_chunks(folder.path)
    raise UserError(_storage_message(path, cause, folder.index_dir, chunks)) from None


def _resume(folder: partial_lib.BuildFolder, manifest: dict[str, Any], dim: int) -> list[int]:
  """The chunks left to embed: all for a new build (or an earlier one that wrote none: its manifest is replaced),
  else those an earlier build of the same inputs did not write whole, or that are damaged since (each named in a
  warning, then removed)."""
  count, size = manifest["documents"], manifest["chunk_size"]
  if not partial_lib.complete_chunks(folder.path):
    with _writing(os.path.join(folder.path, partial_lib.MANIFEST), folder):
      folder.write_manifest(manifest)
    return list(range(-(-count // size)))
  old = folder.read_manifest()
  if old is not None and "tokenizer" not in (old.get("model") or {}):
    raise UserError(f"{folder.path} holds an unfinished build started by an older jbert, which did not record the "
                    "tokenizer, Dense module or dtype its chunks were embedded with, so they cannot be checked "
                    f"against this run; remove {folder.path} to start over.")
  if old is None:
    raise UserError(f"{folder.path} holds chunks but no {partial_lib.MANIFEST} (what they were embedded from and "
                    f"with); remove {folder.path} to start over.")
  changed, hints = _changes(old, manifest)
  if changed:
    raise UserError(f"{folder.path} holds an unfinished build made with other settings: {', '.join(changed)}; "
                    f"rerun {', '.join(dict.fromkeys(hints))} to finish it, or remove {folder.path} to start over.")
  todo = []
  for k in range(-(-count // size)):
    path, rows = folder.chunk_path(k), min(size, count - k * size)
    if not os.path.isfile(path):
      todo.append(k)
      continue
    try:
      partial_lib.read_chunk(path, rows, dim, check_values=True)
    except partial_lib.DamagedChunk as e:
      log.warning("%s is damaged: %s; recomputing it (documents %d to %d).", path, e, k * size + 1,
                  k * size + rows)
      with contextlib.suppress(OSError):  # a read-only folder: the write of its replacement names the problem
        os.remove(path)
      todo.append(k)
  return todo


_FLAGS = {"text_column": "--text_column", "id_column": "--id_column", "chunk_size": "--chunk_size",
          "index_type": "--index_type", "nlist": "--nlist", "nprobe": "--nprobe", "hnsw_m": "--hnsw_m",
          "ef_search": "--ef_search", "dtype": "--dtype", "settings.max_length": "--max_length",
          "settings.pooling": "--pooling"}


def _changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str]]:
  """What differs between an unfinished build's manifest and this run's, as `NAME OLD -> NEW`, and how to rerun
  the first build's way (`with --dtype=float32`)."""
  changed, hints = [], []
  if any(old.get(k) != new[k] for k in ("corpus", "corpus_bytes", "corpus_mtime_ns", "documents")):
    if old.get("corpus") != new["corpus"]:
      changed.append(f"--corpus {old.get('corpus')} -> {new['corpus']}")
      hints.append(f"with --corpus={old.get('corpus')}")
    else:
      changed.append(f"the corpus (changed since: {old.get('documents')} -> {new['documents']} documents, "
                     f"{old.get('corpus_bytes')} -> {new['corpus_bytes']} bytes)")
      hints.append("with the corpus as it was")
  for key in ("text_column", "id_column", "chunk_size"):
    if old.get(key) != new[key]:
      changed.append(f"{_FLAGS[key]} {old.get(key)} -> {new[key]}")
      hints.append(f"with {_FLAGS[key]}={old.get(key)}")
  old_settings = old.get("settings") or {}
  for key, value in new["settings"].items():
    if old_settings.get(key) != value:
      flag = _FLAGS.get(key, key)
      changed.append(f"{flag} {old_settings.get(key)} -> {value}")
      hints.append(f"with {flag}={old_settings.get(key)}")
  old_model, new_model = old.get("model") or {}, new["model"]
  flat_old, flat_new = model_record.flat(old_model), model_record.flat(new_model)
  for key in model_record.differences(old_model, new_model):
    was, now = flat_old.get(key), flat_new.get(key)
    if key == "tokenizer.fingerprint":
      changed.append(f"tokenizer {flat_old.get('tokenizer.path')} -> {flat_new.get('tokenizer.path')}")
      hints.append(f"with --tokenizer={flat_old.get('tokenizer.path')}" if flat_old.get("tokenizer.given") else
                   "without --tokenizer")
    elif key == "settings.normalize":
      changed.append(f"--normalize {was} -> {now}")
      hints.append("with --normalize" if was else "with --nonormalize")
    elif key in _FLAGS:
      changed.append(f"{_FLAGS[key]} {model_record.show(was)} -> {model_record.show(now)}")
      hints.append(f"with {_FLAGS[key]}={model_record.show(was)}")
    else:
      name = model_record.NAMES.get(key, (key,))[0]
      changed.append(f"{name} ({old_model.get('path')} -> {new_model.get('path')})" if key in (
          "fingerprint", "modules") else f"{name} {model_record.show(was)} -> {model_record.show(now)}")
      hints.append(f"with --model={old_model.get('path')}")
  return changed, hints


def _embed_chunks(embedder: Embedder, corpus: str, options: BuildOptions, folder: partial_lib.BuildFolder,
                  todo: list[int], count: int) -> None:
  if not todo:
    return
  size = options.chunk_size
  wanted = set(todo)
  remaining = sum(min(size, count - k * size) for k in todo)
  enabled = remaining >= runner.PROGRESS_MIN_ROWS if options.progress is None else options.progress
  progress = ProgressLine(remaining, "embed", enabled=enabled)
  texts: list[str] = []
  for i, (_, text) in enumerate(documents(corpus, options.text_column, options.id_column)):
    if i // size > todo[-1]:
      break
    if i // size not in wanted:
      continue
    texts.append(text)
    if len(texts) == size or i == count - 1:
      k = i // size
      vectors = embedder(texts, progress=progress, offset=k * size)
      with _writing(folder.chunk_path(k), folder), io.NpyWriter(folder.chunk_path(k)) as out:
        out.write(vectors)
      texts = []
  progress.close()


def _chunks(folder: partial_lib.BuildFolder, count: int, size: int, dim: int) -> Iterator[np.ndarray]:
  for k in range(-(-count // size)):
    path = folder.chunk_path(k)
    try:
      yield partial_lib.read_chunk(path, min(size, count - k * size), dim)
    except partial_lib.DamagedChunk as e:  # checked when the build started: changed since, by someone else
      raise UserError(f"{path} is damaged: {e}; rerun the same command to recompute it.") from None


def _assemble(corpus: str, options: BuildOptions, folder: partial_lib.BuildFolder, settings: IndexSettings,
              record: dict[str, Any], count: int) -> Index:
  index = Index(record["dim"], settings, model=record, count_hint=count)
  if settings.index_type == "ivf":  # k-means on an even sample of the corpus: the same sample on every rerun
    keep = min(count, index.nlist * _TRAIN_PER_CELL)
    rows = set(np.linspace(0, count - 1, keep).astype(np.int64).tolist())
    sample, start = [], 0
    for block in _chunks(folder, count, options.chunk_size, record["dim"]):
      sample += [block[r - start] for r in range(start, start + len(block)) if r in rows]
      start += len(block)
    index.train(np.stack(sample))
  docs = documents(corpus, options.text_column, options.id_column)
  for block in _chunks(folder, count, options.chunk_size, record["dim"]):
    ids, texts = zip(*(next(docs) for _ in range(len(block))))
    index.add(np.asarray(block), ids, texts)
  return index
