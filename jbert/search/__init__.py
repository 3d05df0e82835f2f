"""Semantic search over a corpus with a sentence encoder, optionally re-ranked by a cross-encoder.

  index         `Index`: faiss inner-product search (exact flat, IVF or HNSW) over document embeddings, with their
                ids and texts and the record of the model that embedded them; save/load as a folder
  stored        the folder's files: index.json with checksums of itself and of the others, docs.jsonl, and each
                damaged file named on load
  faiss_file    index.faiss written and read through Python files, its layout checked against index.json first
  model_record  what changes a vector (weights, Dense module, tokenizer, dtype, pooling, length, lower-casing);
                `query_embedder`: queries embedded as the documents were, refused when anything differs
  partial       INDEX_DIR.partial, the locked folder of an unfinished build, and the leftovers of killed builders
  build         `build_index(corpus, model, index_dir)`: a corpus file embedded in resumable chunks into an index
                folder
  rerank        `rerank(queries, hits, cross_encoder)`: hits re-ordered by a cross-encoder's (query, text) scores
  __main__      `python -m jbert.search index|query`

faiss is the optional `search` extra (pip install 'jbert[search]'); without it these raise one clear error.
"""
from jbert.search.build import BuildOptions, build_index
from jbert.search.index import INDEX_TYPES, Hit, Index, IndexSettings
from jbert.search.model_record import query_embedder
from jbert.search.rerank import CrossEncoderScorer, rerank

__all__ = ["BuildOptions", "CrossEncoderScorer", "Hit", "INDEX_TYPES", "Index", "IndexSettings", "build_index",
           "query_embedder", "rerank"]
