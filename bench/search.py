r"""Semantic search on this host: a corpus embedded and indexed end to end, then queries/s with and without
re-ranking by a cross-encoder.

  python bench/search.py [--documents=100000 --model=minilm_6x384 --index_type=flat --queries=200
                          --rerank_queries=20 --rerank_top_k=20 --batch_size=32 --max_length=128]
                         [--text=botchan.txt --vocab=bert-base-uncased-vocab.txt]   (../shared/data)
  python bench/search.py --documents=2000 --model=tiny_2x64 --queries=20 --rerank_queries=5   (a smoke run)

The corpus is botchan.txt split into sentences (sentencex); past the first pass over them each copy has its words
rotated by one more place, so every document is distinct and the length mix stays the book's. A random BERT of
the `--model` size is saved as a sentence-transformers folder (mean pooling + Normalize, `--max_length`) and
another as a one-label cross-encoder. `index_build_s` is `jbert.search.build_index` (the `index` command's path:
read and check the corpus, load the model, embed in resumable chunks, build the faiss index, write the folder)
from start to finish, compilation included. Queries are documents' sentences with their words reversed; after
a first pass (the query model's or cross-encoder's load and its compiles, `*_first_pass_s`), a second pass
times the steady state: `--queries` queries searched in one call (embedding + search: `query_per_s`), and
`--rerank_queries` of them re-ranked over their best `--rerank_top_k` hits (search + cross-encoder:
`rerank_query_per_s`). The last line is one JSON object.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile

from absl import app
from absl import logging
from absl import flags

# `python bench/search.py` from a checkout, without installing jbert.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import timing  # noqa: E402  (bench/)
from jbert.inference import runner  # noqa: E402

_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
MODELS = {  # name: (layers, hidden, heads, intermediate)
    "minilm_6x384": (6, 384, 12, 1536),
    "bert_base": (12, 768, 12, 3072),
    "tiny_2x64": (2, 64, 4, 128),
}

_TEXT = flags.DEFINE_string("text", str(_DATA / "botchan.txt"), "Plain-text corpus, split into sentences.")
_VOCAB = flags.DEFINE_string("vocab", str(_DATA / "bert-base-uncased-vocab.txt"), "WordPiece vocab.txt.")
_DOCUMENTS = flags.DEFINE_integer("documents", 100_000, "Documents in the corpus.")
_MODEL = flags.DEFINE_enum("model", "minilm_6x384", list(MODELS), "Size of the random bi- and cross-encoder.")
_INDEX_TYPE = flags.DEFINE_enum("index_type", "flat", ["flat", "ivf", "hnsw"], "The faiss index.")
_QUERIES = flags.DEFINE_integer("queries", 200, "Queries searched without re-ranking.")
_RERANK_QUERIES = flags.DEFINE_integer("rerank_queries", 20, "Queries searched and re-ranked.")
_TOP_K = flags.DEFINE_integer("top_k", 10, "Hits per query.")
_RERANK_TOP_K = flags.DEFINE_integer("rerank_top_k", 20, "Hits re-ranked per query.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Sequences per batch (embedding and re-ranking).")
_MAX_LENGTH = flags.DEFINE_integer("max_length", 128, "max_seq_length of the bi-encoder (cross-encoder: 2x).")
_CHUNK = flags.DEFINE_integer("chunk_size", 8192, "Documents per resumable chunk of the build.")
_SEED = flags.DEFINE_integer("seed", 0, "Weights.")


def corpus(path: str, count: int) -> list[str]:
  """`count` distinct documents: the book's sentences, each later copy's words rotated by one more place."""
  from sentencex import segment  # pylint: disable=g-import-not-at-top
  with open(path, encoding="utf-8") as f:
    text = " ".join(f.read().split())
  found = [s.strip() for s in segment("en", text) if len(s.split()) > 1]
  if not found:
    raise app.UsageError(f"{path} holds no sentences.")
  docs = []
  for k in range(count):
    words = found[k % len(found)].split()
    shift = (k // len(found)) % len(words)
    docs.append(" ".join(words[shift:] + words[:shift]))
  return docs


def write_models(folder: str, vocab: str, size: tuple[int, int, int, int], max_length: int, seed: int) -> None:
  """`folder/bi`: a random BERT as a sentence-transformers folder; `folder/cross`: a random cross-encoder."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from sentence_transformers import SentenceTransformer, models  # pylint: disable=g-import-not-at-top
  layers, hidden, heads, intermediate = size
  torch.manual_seed(seed)
  tokenizer = transformers.BertTokenizer(vocab=vocab)
  config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, intermediate_size=intermediate, num_labels=1)
  source = os.path.join(folder, "source")
  transformers.BertModel(config).save_pretrained(source)
  tokenizer.save_pretrained(source)
  transformer = models.Transformer(source, max_seq_length=max_length)
  SentenceTransformer(modules=[transformer, models.Pooling(hidden, pooling_mode="mean"), models.Normalize()],
                      device="cpu").save(os.path.join(folder, "bi"))
  cross = os.path.join(folder, "cross")
  transformers.BertForSequenceClassification(config).save_pretrained(cross)
  tokenizer.save_pretrained(cross)


def main(argv):
  del argv
  from jbert.search import (  # pylint: disable=g-import-not-at-top
      BuildOptions, CrossEncoderScorer, Index, IndexSettings, build_index, rerank)
  devices = runner.use_every_core()  # As the commands do.
  logging.set_verbosity(logging.WARNING)  # faiss' loader and JAX announce themselves at INFO.
  for path in (_TEXT.value, _VOCAB.value):
    if not os.path.exists(path):
      raise app.UsageError(f"{path} does not exist; pass --text and --vocab (botchan.txt and "
                           "bert-base-uncased-vocab.txt live in ../shared/data).")
  docs = corpus(_TEXT.value, _DOCUMENTS.value)
  queries = [" ".join(reversed(docs[(i * 7919) % len(docs)].split())) for i in range(_QUERIES.value)]
  load_start = os.getloadavg()[0]
  print(f"{len(docs):,} documents, {_MODEL.value}, {_INDEX_TYPE.value} index, batch {_BATCH.value}, max_length "
        f"{_MAX_LENGTH.value}; load average {load_start:.1f} on {os.cpu_count()} cores, jbert on {devices or 1} "
        "XLA:CPU devices", flush=True)
  with tempfile.TemporaryDirectory(prefix="jbert-bench-search-") as folder:
    write_models(folder, _VOCAB.value, MODELS[_MODEL.value], _MAX_LENGTH.value, _SEED.value)
    corpus_file = os.path.join(folder, "corpus.txt")
    with open(corpus_file, "w", encoding="utf-8") as f:
      f.write("".join(d + "\n" for d in docs))
    options = BuildOptions(batch_size=_BATCH.value, chunk_size=_CHUNK.value, progress=True)
    build_s, _ = timing.timed(lambda: build_index(corpus_file, os.path.join(folder, "bi"), os.path.join(folder, "index"),
                                           IndexSettings(_INDEX_TYPE.value), options))
    print(f"index built in {build_s:.1f} s: {len(docs) / build_s:.1f} documents/s", flush=True)
    load_s, index = timing.timed(lambda: Index.load(os.path.join(folder, "index")))
    warmup_s, _ = timing.timed(lambda: index.search(queries, _TOP_K.value, batch_size=_BATCH.value))
    search_s, _ = timing.timed(lambda: index.search(queries, _TOP_K.value, batch_size=_BATCH.value))
    scorer = CrossEncoderScorer(os.path.join(folder, "cross"), batch_size=_BATCH.value,
                                max_length=2 * _MAX_LENGTH.value)
    few = queries[:_RERANK_QUERIES.value]

    def search_and_rerank():
      return rerank(few, index.search(few, _RERANK_TOP_K.value, batch_size=_BATCH.value), scorer, _TOP_K.value)
    rerank_warmup_s, _ = timing.timed(search_and_rerank)
    rerank_s, _ = timing.timed(search_and_rerank)
  report = {
      "documents": len(docs), "model": _MODEL.value, "index_type": _INDEX_TYPE.value, "dim": index.dim,
      "index_build_s": build_s, "documents_per_s": len(docs) / build_s, "index_load_s": load_s,
      "queries": len(queries), "query_first_pass_s": warmup_s, "query_per_s": len(queries) / search_s,
      "rerank_queries": len(few), "rerank_top_k": _RERANK_TOP_K.value, "rerank_first_pass_s": rerank_warmup_s,
      "rerank_query_per_s": len(few) / rerank_s, "batch_size": _BATCH.value, "max_length": _MAX_LENGTH.value,
      "xla_cpu_devices": devices or 1, "load_average_start": load_start, "load_average_end": os.getloadavg()[0],
  }
  print(json.dumps(report))


if __name__ == "__main__":
  app.run(main)
