"""`python -m jbert.search index|query` as users run it (in this process): a CSV corpus indexed and queried, the
hits written and printed, re-ranked by a cross-encoder; bad input is one line and exit status 2."""
import csv
import importlib
import json

from absl import flags
import pytest

from jbert.search import Index, rerank

from search.conftest import sentences


def _command(*args) -> int:
  command = importlib.import_module("jbert.search.__main__")
  flags.FLAGS.unparse_flags()
  argv = flags.FLAGS(["jbert.search", *map(str, args)])
  try:
    command.main(argv)
    return 0
  except SystemExit as e:
    return e.code
  finally:
    flags.FLAGS.unparse_flags()


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
  cases = [
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
