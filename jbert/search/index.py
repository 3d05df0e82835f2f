"""A vector index of documents: faiss inner-product search over their embeddings, with their ids and texts.

  flat   `IndexFlatIP`: exact; every query scores every document (the default)
  ivf    `IndexIVFFlat`: documents in `nlist` k-means cells, a query scans the `nprobe` nearest cells
         (nprobe = nlist is exact); trained on the corpus' own embeddings
  hnsw   `IndexHNSWFlat`: a graph of `hnsw_m` links per node, searched with `ef_search` candidates

A saved index is a folder: `index.faiss` (faiss' own file), `docs.jsonl` (`{"id", "text"}` per document, in
index order) and `index.json` (the index settings, the document count and dimension, the model record of the
embeddings, so queries are embedded as the documents were: `jbert.search.model_record`, and checksums of it all:
`jbert.search.stored`). Loading checks each file before faiss reads it (a damaged or crafted file is one line
naming it, and reading allocates no more than the file holds).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Sequence

import numpy as np

from jbert.errors import UserError
from jbert.runtime import atomic
from jbert.search import faiss_file, stored
from jbert.search.stored import DOCS, META, VECTORS, StorageError  # noqa: F401  (where callers look for them)

INDEX_TYPES = ("flat", "ivf", "hnsw")
DEFAULT_EF_SEARCH = 64
# faiss' HNSW draws node levels with 1 / log(M): M = 1 crashed it (SIGSEGV). Each document keeps 2 * M links at
# the bottom level (8 * M bytes), and published recall curves stop well below 512.
HNSW_M_RANGE = (2, 512)
FORMAT_VERSION = stored.FORMAT_VERSION


class MissingFaissError(UserError):
  """faiss is an optional dependency of jbert (the `search` extra)."""


def faiss_module():
  try:
    import faiss  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise MissingFaissError("jbert.search needs faiss, which is not installed: pip install 'jbert[search]' (or "
                            "faiss-cpu).") from None
  return faiss


@dataclasses.dataclass(frozen=True)
class IndexSettings:
  """The kind of faiss index. `nlist` None: 4 * sqrt(N) cells, at most N / 39 (faiss' fewest training points per
  cell); `nprobe` None: nlist / 8, at least 1."""
  index_type: str = "flat"
  nlist: int | None = None
  nprobe: int | None = None
  hnsw_m: int = 32
  ef_construction: int = 80
  ef_search: int = DEFAULT_EF_SEARCH

  def __post_init__(self):
    if self.index_type not in INDEX_TYPES:
      raise UserError(f"--index_type={self.index_type}; use one of {', '.join(INDEX_TYPES)}.")
    for name in ("nlist", "nprobe", "hnsw_m", "ef_construction", "ef_search"):
      value = getattr(self, name)
      if value is not None and value < 1:
        raise UserError(f"--{name}={value} must be at least 1.")
    low, high = HNSW_M_RANGE
    if not low <= self.hnsw_m <= high:
      raise UserError(f"--hnsw_m={self.hnsw_m} must be between {low} and {high} (links per document; 16 to 64 "
                      "are usual).")

  def check(self, count: int) -> None:
    """Refuses what a corpus of `count` documents cannot use, before anything is embedded: more IVF cells than
    documents, more cells probed than there are, more HNSW candidates than documents."""
    if self.index_type == "ivf":
      nlist = self.cells(count)
      if self.nprobe is not None and self.nprobe > nlist:
        which = "--nlist" if self.nlist else f"the default --nlist for {count:,} documents"
        cells = f"{nlist:,} cell{'s' if nlist > 1 else ''}"
        raise UserError(f"--nprobe={self.nprobe} is more than the {cells} ({which}); use at most {nlist:,} "
                        "(nprobe = nlist scans every cell: exact search).")
    limit = max(count, DEFAULT_EF_SEARCH)  # the default is fine for any corpus
    if self.index_type == "hnsw" and self.ef_search > limit:
      raise UserError(f"--ef_search={self.ef_search} is more than {count:,} documents can use (a query never keeps "
                      f"more candidates than there are documents); use at most {limit:,}.")

  def cells(self, count: int) -> int:
    """IVF cells for `count` documents."""
    nlist = self.nlist or max(1, min(int(4 * math.sqrt(count)), count // 39))
    if nlist > count:
      raise UserError(f"--nlist={nlist:,} is more than the {count:,} documents; use at most {count:,} cells.")
    return nlist


@dataclasses.dataclass(frozen=True)
class Hit:
  """One search result: the document's id and text and its score (inner product; a re-ranker's score when
  re-ranked, the embedding score then kept as `retrieval_score`)."""
  id: Any
  score: float
  text: str
  retrieval_score: float | None = None

  def to_json(self) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


class Index:
  """Documents' embeddings in a faiss index, their ids and texts, and what embedded them (`model`).

  `Index.build(embeddings, ids, texts)` in one call, or `Index(dim, settings)`, then `train(sample)` (IVF) and
  `add(...)` block by block; `search(queries, top_k)` on vectors or, given the model record, on texts; `save(dir)`
  and `Index.load(dir)`.
  """

  def __init__(self, dim: int, settings: IndexSettings = IndexSettings(), *, model: dict[str, Any] | None = None,
               count_hint: int | None = None):
    self.dim, self.settings, self.model = int(dim), settings, model
    self.ids: list[Any] = []
    self.texts: list[str] = []
    self._faiss = faiss_module()
    self._index = self._make(count_hint)
    self._embedder = None

  def _make(self, count_hint: int | None):
    faiss, s = self._faiss, self.settings
    if s.index_type == "flat":
      return faiss.IndexFlatIP(self.dim)
    if s.index_type == "hnsw":
      index = faiss.IndexHNSWFlat(self.dim, s.hnsw_m, faiss.METRIC_INNER_PRODUCT)
      index.hnsw.efConstruction, index.hnsw.efSearch = s.ef_construction, s.ef_search
      return index
    if count_hint is None and s.nlist is None:
      raise ValueError("an IVF index needs nlist, or the document count to choose it.")
    nlist = s.cells(count_hint) if count_hint else s.nlist
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(self.dim), self.dim, nlist, faiss.METRIC_INNER_PRODUCT)
    index.nprobe = min(nlist, s.nprobe or max(1, nlist // 8))
    return index

  @classmethod
  def build(cls, embeddings: np.ndarray, ids: Sequence[Any] | None = None, texts: Sequence[str] | None = None,
            settings: IndexSettings = IndexSettings(), *, model: dict[str, Any] | None = None) -> "Index":
    """An index of `embeddings` [N, D] (ids default to 0..N-1, texts to "")."""
    embeddings = _vectors(embeddings)
    index = cls(embeddings.shape[1], settings, model=model, count_hint=len(embeddings))
    index.train(embeddings)
    index.add(embeddings, ids, texts)
    return index

  @property
  def size(self) -> int:
    return len(self.ids)

  @property
  def nprobe(self) -> int | None:
    return self._index.nprobe if self.settings.index_type == "ivf" else None

  @property
  def nlist(self) -> int | None:
    return self._index.nlist if self.settings.index_type == "ivf" else None

  def set_search_options(self, nprobe: int | None = None, ef_search: int | None = None) -> None:
    """Query-time trade-offs of speed for recall: IVF cells scanned, HNSW candidates."""
    for name, value in (("nprobe", nprobe), ("ef_search", ef_search)):
      if value is not None and value < 1:
        raise UserError(f"--{name}={value} must be at least 1.")
    if nprobe is not None:
      if self.settings.index_type != "ivf":
        raise UserError(f"--nprobe applies to an ivf index; this one is {self.settings.index_type}.")
      self._index.nprobe = min(int(nprobe), self._index.nlist)
    if ef_search is not None:
      if self.settings.index_type != "hnsw":
        raise UserError(f"--ef_search applies to an hnsw index; this one is {self.settings.index_type}.")
      self._index.hnsw.efSearch = int(ef_search)

  def train(self, sample: np.ndarray) -> None:
    """IVF: k-means cells from `sample` (faiss' fixed seed, so the same sample gives the same cells); the other
    kinds need no training."""
    if not self._index.is_trained:
      self._index.train(_vectors(sample, self.dim))

  def add(self, embeddings: np.ndarray, ids: Sequence[Any] | None = None, texts: Sequence[str] | None = None) -> None:
    embeddings = _vectors(embeddings, self.dim)
    n = len(embeddings)
    ids = list(range(self.size, self.size + n)) if ids is None else list(ids)
    texts = [""] * n if texts is None else list(texts)
    if len(ids) != n or len(texts) != n:
      raise ValueError(f"{n} embeddings with {len(ids)} ids and {len(texts)} texts; give one of each per row.")
    if not self._index.is_trained:
      raise ValueError("train the IVF index (Index.train) before adding documents.")
    self._index.add(embeddings)
    self.ids += ids
    self.texts += texts

  def search_vectors(self, queries: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    """(scores [Q, k], document positions [Q, k]) best first, k = min(top_k, size); faiss' -1 positions (an IVF
    probe that found fewer documents) are dropped by `search`. HNSW searches with at least k candidates: with
    fewer, faiss stops early and returns fewer than k hits."""
    if top_k < 1:
      raise UserError(f"--top_k={top_k} must be at least 1.")
    k = min(top_k, self.size)
    params = None
    if self.settings.index_type == "hnsw":
      # faiss allocates efSearch candidates per query (8 bytes each: --ef_search=10^9 took 8 GB); beyond the
      # number of documents they find nothing more.
      ef = max(k, min(self._index.hnsw.efSearch, self.size))
      if ef != self._index.hnsw.efSearch:
        params = self._faiss.SearchParametersHNSW(efSearch=ef)
    scores, positions = self._index.search(_vectors(queries, self.dim), k, params=params)
    return scores, positions

  def search(self, queries: np.ndarray | Sequence[str], top_k: int = 10, *, model: str | None = None,
             tokenizer: str | None = None, batch_size: int = 32, dtype: str | None = None) -> list[list[Hit]]:
    """The `top_k` hits of each query: embedding vectors [Q, D], or texts embedded by the index's model and
    tokenizer (or `model` / `tokenizer`, refused unless they embed as the index's did:
    `model_record.query_embedder`) in the index's dtype (or `dtype`)."""
    if not isinstance(queries, np.ndarray):
      queries = self.embedder(model, tokenizer, batch_size=batch_size, dtype=dtype)(list(queries))
    scores, positions = self.search_vectors(queries, top_k)
    return [[Hit(self.ids[p], float(s), self.texts[p]) for s, p in zip(row_s, row_p) if p >= 0]
            for row_s, row_p in zip(scores, positions)]

  def embedder(self, model: str | None = None, tokenizer: str | None = None, **kwargs):
    """The query embedder (made once per model, tokenizer and options): the index's model, or `model` if it
    embeds the same way."""
    # JAX and the model code only for text queries: an index searched with vectors needs neither.
    from jbert.search import model_record  # pylint: disable=g-import-not-at-top
    key = (model, tokenizer, tuple(sorted(kwargs.items())))
    if self._embedder is None or self._embedder[0] != key:
      self._embedder = (key, model_record.query_embedder(self.model, model, tokenizer, **kwargs))
    return self._embedder[1]

  # -- files --

  def meta(self) -> dict[str, Any]:
    return {"format": FORMAT_VERSION, "count": self.size, "dim": self.dim, "metric": "inner_product",
            "settings": dataclasses.asdict(self.settings), "nprobe": self.nprobe, "model": self.model}

  def save(self, directory: str) -> None:
    """Writes the index folder whole under a temporary name, then renames it to `directory` (replacing one). A
    storage error is a `StorageError` naming the file by its final path; nothing is left under either name."""
    directory = os.path.abspath(directory)
    name = None  # the file being written; None: the folder itself (its creation, the renames)
    try:
      with atomic.folder_for_write(directory) as folder:
        files = {VECTORS: None, DOCS: None}
        name = VECTORS
        size, crc = faiss_file.write(self._faiss, self._index, os.path.join(folder, VECTORS))
        files[VECTORS] = {"bytes": size, "crc32": crc}
        name = DOCS
        files[DOCS] = stored.write_docs(os.path.join(folder, DOCS), self.ids, self.texts)
        name = META
        stored.write_meta(os.path.join(folder, META), {**self.meta(), "files": files})
        name = None
    except OSError as e:
      raise StorageError(directory if name is None else os.path.join(directory, name), e) from None

  @classmethod
  def load(cls, directory: str) -> "Index":
    """The index saved in `directory`, every file checked first (see `jbert.search.stored`)."""
    directory = os.path.abspath(os.fspath(directory))
    meta_path = os.path.join(directory, META)
    if not os.path.isfile(meta_path):
      partial = f"{directory}.partial"
      if os.path.isdir(partial):
        raise UserError(f"{directory} is not built yet: its build stopped before the end ({partial} holds what it "
                        "embedded); rerun `python -m jbert.search index` with the same flags to finish it.")
      what = "does not exist" if not os.path.exists(directory) else f"holds no {META}"
      raise UserError(f"--index={directory} {what}; build one with `python -m jbert.search index`.")
    meta = stored.read_meta(directory)
    try:
      settings = IndexSettings(**meta["settings"])
    except (TypeError, UserError) as e:
      raise UserError(f"{meta_path}: its settings {meta['settings']} are not an index's ({e}); "
                      f"{faiss_file.REBUILD}") from None
    index = cls.__new__(cls)
    index.dim, index.model, index.settings, index._embedder = meta["dim"], meta.get("model"), settings, None
    index._faiss = faiss_module()
    vectors = os.path.join(directory, VECTORS)
    stored.check_size(vectors, meta)
    faiss_file.check(vectors, meta_path, settings.index_type, meta["dim"], meta["count"])
    index._index, crc = faiss_file.read(index._faiss, vectors)
    stored.check_crc(vectors, meta, crc)
    index.ids, index.texts = stored.read_docs(os.path.join(directory, DOCS), meta)
    return index


def _vectors(x: np.ndarray, dim: int | None = None) -> np.ndarray:
  """float32, C-contiguous [N, D], as faiss takes them."""
  x = np.ascontiguousarray(np.asarray(x, np.float32))
  if x.ndim != 2 or (dim is not None and x.shape[1] != dim):
    raise ValueError(f"vectors of shape {x.shape}; this index takes [N, {dim or 'D'}].")
  return x
