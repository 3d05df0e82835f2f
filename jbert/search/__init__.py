"""Semantic search over a corpus with a sentence encoder, optionally re-ranked by a cross-encoder.

  index    `Index`: faiss inner-product search (exact flat, IVF or HNSW) over document embeddings, with their ids
           and texts and the record of the model that embedded them; save/load as a folder
  build    `build_index(corpus, model, index_dir)`: a corpus file embedded in resumable chunks into an index
           folder; `query_embedder`: queries embedded as the documents were, by the same model only
  rerank   `rerank(queries, hits, cross_encoder)`: hits re-ordered by a cross-encoder's (query, text) scores
  __main__ `python -m jbert.search index|query`

faiss is the optional `search` extra (pip install 'jbert[search]'); without it these raise one clear error.
"""
from jbert.search.build import BuildOptions, build_index, query_embedder
from jbert.search.index import INDEX_TYPES, Hit, Index, IndexSettings
from jbert.search.rerank import CrossEncoderScorer, rerank

__all__ = ["BuildOptions", "CrossEncoderScorer", "Hit", "INDEX_TYPES", "Index", "IndexSettings", "build_index",
           "query_embedder", "rerank"]
