r"""Build a search index of a corpus with a sentence encoder, and query it (optionally re-ranked).

  python -m jbert.search index --model=BI_ENCODER --corpus=docs.jsonl --index=DIR [--id_column=id]
      [--text_column=text] [--index_type=flat|ivf|hnsw --nlist=N --nprobe=N --hnsw_m=M --ef_search=N]
  python -m jbert.search query --index=DIR [--top_k=10] [--rerank=CROSS_ENCODER --rerank_top_k=50] QUERY...
  python -m jbert.search query --index=DIR --input=queries.txt --output=hits.jsonl

index: the corpus (.txt: a document per line, ids its line numbers; .jsonl/.csv/.tsv: --text_column, default
`text`, and --id_column, default the record's line number) is embedded in chunks of --chunk_size documents
under DIR.partial/; an interrupted build continues where it stopped when run again, and DIR appears only when
complete; rerun with other flags that change the vectors (--dtype, --tokenizer, --max_length, --pooling, ...)
it is refused by name (--batch_size may change).
A sentence-transformers folder brings its pooling and normalisation; other models need --pooling.
query: queries are embedded with the index's model, tokenizer, dtype and settings (--model / --tokenizer: the
same model or tokenizer elsewhere; one that embeds differently is refused by name); a damaged index file is named.
Hits print as `rank score id text`, or go to --output as one JSON object per query:
{"query": ..., "hits": [{"id", "score", "text"[, "retrieval_score"]}]}. --rerank scores each query's best
--rerank_top_k hits with a cross-encoder and keeps the --top_k best of those.
Flags of the other command, and numbers no search can use (--top_k=0, --nprobe=-1), are refused before anything
loads.
"""
from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags

from jbert.errors import UserError
from jbert.inference import cli, io

_CORPUS = flags.DEFINE_string("corpus", None, "index: the documents, .txt (one per line), .jsonl, .csv or .tsv.")
_INDEX = flags.DEFINE_string("index", None, "The index folder (index: written; query: read).")
_TEXT_COLUMN = flags.DEFINE_string("text_column", None, "index: the corpus' text column (default `text`, or a "
                                   "one-column CSV's column).")
_ID_COLUMN = flags.DEFINE_string("id_column", None, "index: the corpus' id column (default: line numbers).")
_INDEX_TYPE = flags.DEFINE_enum("index_type", "flat", ["flat", "ivf", "hnsw"], "index: exact inner product (flat), "
                                "IVF cells or an HNSW graph (approximate, for large corpora).")
_NLIST = flags.DEFINE_integer("nlist", None, "index, ivf: k-means cells (default 4 * sqrt(N), at most N / 39).")
_NPROBE = flags.DEFINE_integer("nprobe", None, "ivf: cells a query scans (default nlist / 8; at query time: "
                               "overrides the index's; nprobe = nlist is exact).")
_HNSW_M = flags.DEFINE_integer("hnsw_m", 32, "index, hnsw: links per node.")
_EF_SEARCH = flags.DEFINE_integer("ef_search", None, "hnsw: candidates a query keeps (default 64; at query time: "
                                  "overrides the index's). A query searches with at least top_k (with fewer, faiss "
                                  "returns fewer hits); larger values find more of the true neighbours.")
_RERANK = flags.DEFINE_string("rerank", None, "query: a cross-encoder folder that re-orders the hits.")
_RERANK_TOP_K = flags.DEFINE_integer("rerank_top_k", 50, "query: hits re-ranked per query (at least --top_k).")

COMMANDS = ("index", "query")
DEFAULT_TOP_K = 10
# Flags only one command reads: given to the other, they would be ignored, so they are refused.
INDEX_ONLY = ("corpus", "text_column", "id_column", "index_type", "nlist", "hnsw_m", "chunk_size", "pooling",
              "normalize", "max_length")
QUERY_ONLY = ("top_k", "rerank", "rerank_top_k", "input", "output", "column")
# Numeric flags and their least useful value.
MINIMUM = {"top_k": 1, "rerank_top_k": 1, "nprobe": 1, "ef_search": 1, "nlist": 1, "hnsw_m": 2, "chunk_size": 1,
           "batch_size": 1, "max_length": 2}
for _flag in (cli.MODEL, cli.INPUT, cli.OUTPUT, cli.COLUMN, cli.TOKENIZER, cli.BATCH_SIZE, cli.MAX_LENGTH, cli.DTYPE,
              cli.POOLING, cli.NORMALIZE, cli.CHUNK_SIZE, cli.PROGRESS, cli.TOP_K):
  flags.declare_key_flag(_flag.name)  # --help lists the shared flags this command reads


def main(argv):
  with cli.user_errors("jbert.search"):
    if len(argv) < 2 or argv[1] not in COMMANDS:
      raise UserError(f"Name a command first: `python -m jbert.search index ...` or `... query ...` (got "
                      f"{' '.join(argv[1:2]) or 'none'}).")
    check_flags(argv[1])
    if argv[1] == "index":
      if len(argv) > 2:
        raise UserError(f"Unexpected arguments {argv[2:]}; the corpus goes in --corpus=FILE.")
      index()
    else:
      query(argv[2:])


def check_flags(command: str) -> None:
  """Values no search can use and flags of the other command, refused before anything loads."""
  other = QUERY_ONLY if command == "index" else INDEX_ONLY
  for name in other:
    if flags.FLAGS[name].present:
      raise UserError(f"--{name} applies to `query`; drop it from `index`." if command == "index" else
                      f"--{name} applies to `index` (the index was built with its value); drop it from `query`.")
  for name, least in MINIMUM.items():
    value = flags.FLAGS[name].value
    if value is not None and value < least and (flags.FLAGS[name].present or name not in other):
      why = " (the [CLS] and [SEP] tokens)" if name == "max_length" else ""
      raise UserError(f"--{name}={value} must be at least {least}{why}.")


def index() -> None:
  from jbert.search import build  # pylint: disable=g-import-not-at-top  (JAX and faiss after the flags check)
  from jbert.search.index import DEFAULT_EF_SEARCH, IndexSettings, faiss_module  # pylint: disable=g-import-not-at-top
  cli.require(cli.MODEL, "the sentence encoder that embeds the corpus")
  cli.require(_CORPUS, "the file of documents")
  cli.require(_INDEX, "the index folder to write")
  faiss_module()  # before the corpus is read or the model loads
  for names, kind in ((("nlist", "nprobe"), "ivf"), (("hnsw_m", "ef_search"), "hnsw")):
    for name in names:
      if flags.FLAGS[name].present and _INDEX_TYPE.value != kind:
        raise UserError(f"--{name} applies to an {kind} index (--index_type={kind}); this one is "
                        f"{_INDEX_TYPE.value}.")
  settings = IndexSettings(index_type=_INDEX_TYPE.value, nlist=_NLIST.value, nprobe=_NPROBE.value,
                           hnsw_m=_HNSW_M.value,
                           ef_search=DEFAULT_EF_SEARCH if _EF_SEARCH.value is None else _EF_SEARCH.value)
  folder = os.path.dirname(os.path.abspath(_INDEX.value))
  if not os.path.isdir(folder):
    raise UserError(f"The folder of --index={_INDEX.value} does not exist; create {folder} first.")
  cli.require_model()
  chunk_size = build.DEFAULT_CHUNK_SIZE if cli.CHUNK_SIZE.value is None else cli.CHUNK_SIZE.value
  options = build.BuildOptions(text_column=_TEXT_COLUMN.value, id_column=_ID_COLUMN.value, pooling=cli.POOLING.value,
                               normalize=cli.NORMALIZE.value, max_length=cli.MAX_LENGTH.value,
                               batch_size=cli.BATCH_SIZE.value, dtype=cli.DTYPE.value, tokenizer=cli.TOKENIZER.value,
                               chunk_size=chunk_size, progress=cli.PROGRESS.value)
  start = time.perf_counter()
  try:
    built = build.build_index(_CORPUS.value, cli.MODEL.value, _INDEX.value, settings, options)
  except KeyboardInterrupt:
    if os.path.isdir(f"{_INDEX.value}.partial"):
      print(f"jbert.search: interrupted; {_INDEX.value} was not written. Run the same command again to continue "
            f"from the chunks in {_INDEX.value}.partial.", file=sys.stderr)
    else:  # stopped before its first chunk: the build removed its folder
      print("jbert.search: interrupted before anything was embedded; nothing was written.", file=sys.stderr)
    sys.exit(130)
  elapsed = time.perf_counter() - start
  print(f"jbert.search: indexed {built.size:,} documents ({built.dim} dims, {settings.index_type}) in {_INDEX.value} "
        f"in {elapsed:,.1f} s", file=sys.stderr)


def query(texts: list[str]) -> None:
  from jbert.search.rerank import CrossEncoderScorer, rerank  # pylint: disable=g-import-not-at-top
  from jbert.search.index import Index  # pylint: disable=g-import-not-at-top
  cli.require(_INDEX, "the index folder to search")
  if cli.OUTPUT.value:
    if os.path.splitext(cli.OUTPUT.value)[1].lower() != ".jsonl":
      raise UserError(f"--output={cli.OUTPUT.value}: use a .jsonl file (one JSON object per query).")
    io.check_writable(cli.OUTPUT.value)
  texts = cli.arguments_or_input(texts, "queries")
  top_k = DEFAULT_TOP_K if cli.TOP_K.value is None else cli.TOP_K.value
  if cli.MODEL.value:
    cli.require_model()
  found = Index.load(_INDEX.value)
  found.set_search_options(nprobe=_NPROBE.value, ef_search=_EF_SEARCH.value)
  scorer = None
  if _RERANK.value:
    if not os.path.exists(_RERANK.value):
      raise UserError(f"--rerank={_RERANK.value} does not exist; pass a cross-encoder folder.")
    scorer = CrossEncoderScorer(_RERANK.value, batch_size=cli.BATCH_SIZE.value, dtype=cli.DTYPE.value)
  hits = found.search(texts, max(top_k, _RERANK_TOP_K.value) if scorer else top_k, model=cli.MODEL.value,
                      tokenizer=cli.TOKENIZER.value, batch_size=cli.BATCH_SIZE.value, dtype=cli.DTYPE.value)
  if scorer:
    hits = rerank(texts, hits, scorer, top_k)
  if cli.OUTPUT.value:
    with io.JsonlWriter(cli.OUTPUT.value) as out:
      for text, row in zip(texts, hits):
        out.write({"query": text, "hits": [h.to_json() for h in row]})
    print(f"jbert.search: wrote the hits of {len(texts):,} queries to {cli.OUTPUT.value}", file=sys.stderr)
    return
  for text, row in zip(texts, hits):
    print(f"query: {text}")
    for rank, hit in enumerate(row, 1):
      print(f"  {rank:>3}  {hit.score:9.4f}  {hit.id}  {hit.text}")


if __name__ == "__main__":
  app.run(main)
