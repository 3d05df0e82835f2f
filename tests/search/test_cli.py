"""`python -m jbert.search index|query` as users run it (in this process): a CSV corpus indexed and queried, the
hits written and printed, re-ranked by a cross-encoder; bad input (a value no search can use, a flag of the other
command, a missing faiss) is one line and exit status 2 before the model loads."""
import csv
import json
import os
import sys

import pytest

from jbert.search import Index, rerank

from search.conftest import command as _command, one_line, sentences, tree_hashes


@pytest.fixture(scope="module")
def csv_corpus(tmp_path_factory):
  path = tmp_path_factory.mktemp("csv") / "docs.csv"
  with path.open("w", encoding="utf-8", newline="") as f:
    writer = csv.writer(f)
    writer.writerow(["doc", "body"])
    writer.writerows([f"d{i}", s] for i, s in enumerate(sentences(40)))
  return path


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory, bi_encoder, csv_corpus):
  folder = tmp_path_factory.mktemp("cli") / "index"
  assert _command("index", f"--model={bi_encoder}", f"--corpus={csv_corpus}", "--text_column=body",
                  "--id_column=doc", f"--index={folder}", "--chunk_size=16") == 0
  return folder


def test_index_then_query_to_a_file_and_reranked_to_the_console(index_dir, reranker, tmp_path, capsys):
  queries = ["the cat sat on the mat", "a red bird"]
  out = tmp_path / "hits.jsonl"
  assert _command("query", f"--index={index_dir}", "--top_k=3", f"--output={out}", *queries) == 0
  index = Index.load(str(index_dir))
  want = index.search(queries, top_k=3)
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert rows == [{"query": q, "hits": [h.to_json() for h in row]} for q, row in zip(queries, want)]
  assert set(rows[0]["hits"][0]) == {"id", "score", "text"}
  capsys.readouterr()
  assert _command("query", f"--index={index_dir}", "--top_k=2", f"--rerank={reranker}", "--rerank_top_k=6",
                  queries[0]) == 0
  printed = capsys.readouterr().out.splitlines()
  (expected,) = rerank([queries[0]], [index.search(queries[:1], top_k=6)[0]], str(reranker), top_k=2)
  assert printed == [f"query: {queries[0]}"] + [f"  {r:>3}  {h.score:9.4f}  {h.id}  {h.text}"
                                                for r, h in enumerate(expected, 1)]


def test_bad_input_is_one_line_and_exit_status_2(index_dir, bi_encoder, other_encoder, classifier, csv_corpus,
                                                 tmp_path, capsys):
  empty = tmp_path / "empty.txt"
  empty.write_text("")
  new = tmp_path / "new"
  surrogate = tmp_path / "surrogate.jsonl"
  surrogate.write_text('{"text": "ok"}\n{"text": "half a pair \\ud800"}\n')
  cases = [
      (("index", f"--model={bi_encoder}", f"--corpus={surrogate}", f"--index={new}"),
       f"{surrogate}, line 2: field 'text' holds the escape \\ud800, half of a UTF-16 surrogate pair"),
      (("index", f"--model={bi_encoder}", f"--corpus={tmp_path / 'missing.csv'}", f"--index={new}"),
       f"--corpus={tmp_path / 'missing.csv'} does not exist."),
      (("index", f"--model={bi_encoder}", f"--corpus={empty}", f"--index={new}"),
       f"--corpus={empty} holds no documents; nothing to index."),
      (("index", f"--model={bi_encoder}", f"--corpus={csv_corpus}", "--text_column=sentence", f"--index={new}"),
       f"column(s) ['sentence'] not in row 0 of {csv_corpus} (line 2); available columns: ['doc', 'body']. Name the "
       "columns with --text_column / --id_column."),
      (("index", f"--model={bi_encoder}", f"--corpus={csv_corpus}", "--text_column=body", f"--index={index_dir}"),
       f"--index={index_dir} already exists; choose another path, or remove it to build it again."),
      (("query", f"--index={index_dir}", f"--model={other_encoder}", "a cat"),
       f"--model={other_encoder} gives another model's embeddings: the index was made by another model "),
      (("query", f"--index={index_dir}", f"--rerank={classifier}", "a cat"),
       f"--rerank={classifier} is a BertForSequenceClassification with 3 labels, not a cross-encoder"),
      (("lookup", "a cat"), "Name a command first: `python -m jbert.search index ...` or `... query ...` (got "
                            "lookup)."),
  ]
  for args, message in cases:
    assert _command(*args) == 2, args
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"jbert.search: {message}"), (args, err)
  assert not new.exists() and not (tmp_path / "new.partial").exists()


@pytest.fixture(scope="module")
def hnsw_and_ivf(tmp_path_factory, bi_encoder, csv_corpus):
  """The CSV corpus as an hnsw and an ivf index (4 cells)."""
  root = tmp_path_factory.mktemp("kinds")
  args = (f"--model={bi_encoder}", f"--corpus={csv_corpus}", "--text_column=body", "--id_column=doc")
  assert _command("index", *args, f"--index={root / 'hnsw'}", "--index_type=hnsw", "--hnsw_m=4") == 0
  assert _command("index", *args, f"--index={root / 'ivf'}", "--index_type=ivf", "--nlist=4") == 0
  return root / "hnsw", root / "ivf"


def test_every_numeric_flag_is_checked_before_anything_loads(index_dir, hnsw_and_ivf, bi_encoder, csv_corpus,
                                                             tmp_path, capsys, monkeypatch):
  from jbert.inference import loading  # pylint: disable=import-outside-toplevel
  hnsw, ivf = hnsw_and_ivf
  new = tmp_path / "new"
  build = ("index", f"--model={bi_encoder}", f"--corpus={csv_corpus}", "--text_column=body", f"--index={new}")
  cases = [
      (("query", f"--index={hnsw}", "--ef_search=0", "a cat"), "--ef_search=0 must be at least 1."),
      (("query", f"--index={hnsw}", "--ef_search=-3", "a cat"), "--ef_search=-3 must be at least 1."),
      (("query", f"--index={ivf}", "--nprobe=0", "a cat"), "--nprobe=0 must be at least 1."),
      (("query", f"--index={ivf}", "--nprobe=-1", "a cat"), "--nprobe=-1 must be at least 1."),
      (("query", f"--index={index_dir}", "--top_k=0", "a cat"), "--top_k=0 must be at least 1."),
      (("query", f"--index={index_dir}", "--rerank_top_k=-2", "a cat"), "--rerank_top_k=-2 must be at least 1."),
      (("query", f"--index={index_dir}", "--batch_size=0", "a cat"), "--batch_size=0 must be at least 1."),
      (("query", f"--index={index_dir}", "--nlist=8", "a cat"),
       "--nlist applies to `index` (the index was built with its value); drop it from `query`."),
      (("query", f"--index={index_dir}", "--max_length=8", "a cat"),
       "--max_length applies to `index` (the index was built with its value); drop it from `query`."),
      ((*build, "--index_type=hnsw", "--ef_search=0"), "--ef_search=0 must be at least 1."),
      ((*build, "--index_type=hnsw", "--hnsw_m=0"), "--hnsw_m=0 must be at least 2."),
      ((*build, "--index_type=hnsw", "--hnsw_m=1"), "--hnsw_m=1 must be at least 2."),  # faiss: SIGSEGV
      ((*build, "--index_type=hnsw", "--hnsw_m=100000"),
       "--hnsw_m=100000 must be between 2 and 512 (links per document; 16 to 64 are usual)."),
      ((*build, "--index_type=hnsw", "--ef_search=65"),
       "--ef_search=65 is more than 40 documents can use (a query never keeps more candidates than there are "
       "documents); use at most 64."),
      ((*build, "--index_type=hnsw", "--ef_search=1000000000"),
       "--ef_search=1000000000 is more than 40 documents can use (a query never keeps more candidates than there "
       "are documents); use at most 64."),
      # Refused after the corpus is counted, before the model loads (it was refused after embedding it all).
      ((*build, "--index_type=ivf", "--nlist=100000"),
       "--nlist=100,000 is more than the 40 documents; use at most 40 cells."),
      ((*build, "--index_type=ivf", "--nlist=4", "--nprobe=5"),
       "--nprobe=5 is more than the 4 cells (--nlist); use at most 4 (nprobe = nlist scans every cell: exact "
       "search)."),
      ((*build, "--index_type=ivf", "--nprobe=2"),
       "--nprobe=2 is more than the 1 cell (the default --nlist for 40 documents); use at most 1 (nprobe = nlist "
       "scans every cell: exact search)."),
      ((*build, "--index_type=ivf", "--nlist=-4"), "--nlist=-4 must be at least 1."),
      ((*build, "--index_type=ivf", "--nprobe=0"), "--nprobe=0 must be at least 1."),
      ((*build, "--chunk_size=0"), "--chunk_size=0 must be at least 1."),
      ((*build, "--batch_size=-8"), "--batch_size=-8 must be at least 1."),
      ((*build, "--max_length=1"), "--max_length=1 must be at least 2 (the [CLS] and [SEP] tokens)."),
      ((*build, "--top_k=5"), "--top_k applies to `query`; drop it from `index`."),
      ((*build, "--nprobe=4"), "--nprobe applies to an ivf index (--index_type=ivf); this one is flat."),
      ((*build, "--index_type=ivf", "--ef_search=8"),
       "--ef_search applies to an hnsw index (--index_type=hnsw); this one is ivf."),
  ]
  folders = (tmp_path, hnsw.parent, index_dir)
  before = [tree_hashes(f) for f in folders]

  def refuse(*args, **kwargs):
    raise AssertionError("the model was loaded")

  monkeypatch.setattr(loading, "load_model", refuse)
  for args, message in cases:
    assert _command(*args) == 2, args
    assert one_line(capsys) == f"jbert.search: {message}", args
  assert [tree_hashes(f) for f in folders] == before and not new.exists()


def test_an_ef_search_below_top_k_still_returns_top_k_hits(hnsw_and_ivf, tmp_path):
  """faiss' HNSW searched with efSearch 1 returned 6 to 9 of 10 hits for half of the queries on such a graph."""
  hnsw, _ = hnsw_and_ivf
  queries = sentences(8, seed=5)
  got = {}
  for ef in (1, 10):
    out = tmp_path / f"hits{ef}.jsonl"
    assert _command("query", f"--index={hnsw}", f"--ef_search={ef}", "--top_k=10", f"--output={out}",
                    *queries) == 0
    got[ef] = [json.loads(line)["hits"] for line in out.read_text().splitlines()]
    assert [len({h["id"] for h in hits}) for hits in got[ef]] == [10] * len(queries)
  assert got[1] == got[10]  # searched with ef_search raised to top_k


def test_without_faiss_the_index_command_stops_before_the_model_loads(bi_encoder, csv_corpus, tmp_path, capsys,
                                                                      monkeypatch):
  from jbert.inference import loading  # pylint: disable=import-outside-toplevel

  def refuse(*args, **kwargs):
    raise AssertionError("the model was loaded")

  monkeypatch.setattr(loading, "load_model", refuse)
  monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` raises ImportError
  assert _command("index", f"--model={bi_encoder}", f"--corpus={csv_corpus}", "--text_column=body",
                  f"--index={tmp_path / 'index'}") == 2
  assert one_line(capsys) == ("jbert.search: jbert.search needs faiss, which is not installed: pip install "
                              "'jbert[search]' (or faiss-cpu).")
  assert os.listdir(tmp_path) == []
