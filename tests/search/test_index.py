"""`jbert.search.Index` against brute force: flat equals a numpy search, IVF scanning every cell equals flat, HNSW
finds nearly all true neighbours; a saved index searches as the original; no faiss is one clear error; a damaged
file of a saved index (index.faiss cut or flipped, docs.jsonl without a text, cut or reordered, index.json without
a key or edited) is one line naming it when a query loads it, and nothing is written."""
import json
import shutil
import sys

import numpy as np
import pytest

from jbert.errors import UserError
from jbert.search import Hit, Index, IndexSettings

from search.conftest import command, one_line, tree_hashes


def _unit(rng, n, d=16):
  x = rng.standard_normal((n, d)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def _brute_force(docs, queries, k):
  scores = queries.astype(np.float64) @ docs.astype(np.float64).T  # [Q, N]
  order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
  return np.take_along_axis(scores, order, 1), order


def test_flat_search_equals_a_numpy_brute_force_search():
  rng = np.random.default_rng(0)
  docs, queries = rng.standard_normal((300, 16)).astype(np.float32), rng.standard_normal((7, 16)).astype(np.float32)
  ids = [f"doc{i}" for i in range(300)]
  index = Index.build(docs, ids, [f"text {i}" for i in range(300)])
  want_scores, want_rows = _brute_force(docs, queries, 10)
  hits = index.search(queries, top_k=10)
  assert [[h.id for h in row] for row in hits] == [[ids[r] for r in row] for row in want_rows]
  np.testing.assert_allclose([[h.score for h in row] for row in hits], want_scores, rtol=1e-5, atol=1e-5)
  assert hits[0][0] == Hit(ids[want_rows[0, 0]], hits[0][0].score, f"text {want_rows[0, 0]}")
  assert len(index.search(queries[:1], top_k=1000)[0]) == 300  # top_k past the corpus: every document once


def test_ivf_scanning_every_cell_equals_flat_and_fewer_cells_approximate_it():
  rng = np.random.default_rng(1)
  docs, queries = _unit(rng, 800), _unit(rng, 20)
  flat = Index.build(docs).search(queries, top_k=10)
  exact = Index.build(docs, settings=IndexSettings("ivf", nlist=16, nprobe=16))
  assert exact.nprobe == 16
  got = exact.search(queries, top_k=10)
  assert [[h.id for h in row] for row in got] == [[h.id for h in row] for row in flat]
  np.testing.assert_allclose([[h.score for h in r] for r in got], [[h.score for h in r] for r in flat], atol=1e-6)
  exact.set_search_options(nprobe=1)
  one_cell = exact.search(queries, top_k=10)
  recall = np.mean([len({h.id for h in a} & {h.id for h in b}) / 10 for a, b in zip(one_cell, flat)])
  assert 0.1 < recall < 1.0  # one of 16 cells finds some neighbours, not all


def test_hnsw_recall_at_10_is_high_on_random_unit_vectors():
  rng = np.random.default_rng(2)
  docs, queries = _unit(rng, 2000), _unit(rng, 50)
  _, truth = _brute_force(docs, queries, 10)
  hits = Index.build(docs, settings=IndexSettings("hnsw", hnsw_m=16, ef_search=64)).search(queries, top_k=10)
  recall = np.mean([len({h.id for h in row} & set(t.tolist())) / 10 for row, t in zip(hits, truth)])
  assert recall >= 0.95


def test_an_ef_search_past_the_corpus_searches_with_the_corpus_size():
  """faiss allocates a query's ef_search candidates up front: ef_search=10^9 took 8 GB for 300 documents."""
  rng = np.random.default_rng(4)
  docs, queries = _unit(rng, 300), _unit(rng, 20)
  index = Index.build(docs, settings=IndexSettings("hnsw", hnsw_m=8))
  index.set_search_options(ef_search=300)
  want = index.search(queries, top_k=10)
  index.set_search_options(ef_search=10**9)
  assert index.search(queries, top_k=10) == want


@pytest.mark.parametrize("index_type", ["flat", "ivf", "hnsw"])
def test_a_saved_index_loads_and_searches_as_the_original(tmp_path, index_type):
  rng = np.random.default_rng(3)
  docs, queries = _unit(rng, 200), _unit(rng, 5)
  settings = IndexSettings(index_type, nlist=4 if index_type == "ivf" else None, nprobe=2 if index_type == "ivf"
                           else None)
  index = Index.build(docs, [f"é{i}" for i in range(200)], [f"t{i}\n" for i in range(200)], settings)
  index.save(str(tmp_path / "index"))
  loaded = Index.load(str(tmp_path / "index"))
  assert loaded.size == 200 and loaded.settings == settings and loaded.nprobe == index.nprobe
  assert loaded.search(queries, top_k=5) == index.search(queries, top_k=5)


def test_bad_uses_are_one_line_errors(tmp_path, monkeypatch):
  with pytest.raises(UserError, match=r"^--index_type=annoy; use one of flat, ivf, hnsw\.$"):
    IndexSettings("annoy")
  with pytest.raises(UserError, match=r"^--nlist=50 is more than the 10 documents"):
    Index.build(np.eye(10, dtype=np.float32), settings=IndexSettings("ivf", nlist=50))
  with pytest.raises(UserError, match=r"^--nlist=11 is more than the 10 documents; use at most 10 cells\.$"):
    IndexSettings("ivf", nlist=11).check(10)
  for m in (1, 513):  # M = 1 crashed faiss (SIGSEGV)
    with pytest.raises(UserError, match=rf"^--hnsw_m={m} must be between 2 and 512"):
      IndexSettings("hnsw", hnsw_m=m)
  IndexSettings("hnsw", ef_search=64).check(10)  # the default, for any corpus
  IndexSettings("hnsw", ef_search=1000).check(1000)
  with pytest.raises(UserError, match=r"^--ef_search=1001 is more than 1,000 documents can use"):
    IndexSettings("hnsw", ef_search=1001).check(1000)
  IndexSettings("ivf", nlist=4, nprobe=4).check(10)
  with pytest.raises(UserError, match=r"^--index=.*missing does not exist; build one with `python -m jbert.search"):
    Index.load(str(tmp_path / "missing"))
  (tmp_path / "half.partial").mkdir()
  with pytest.raises(UserError, match=r"half is not built yet: its build stopped before the end"):
    Index.load(str(tmp_path / "half"))
  monkeypatch.setitem(sys.modules, "faiss", None)  # `import faiss` now raises ImportError
  with pytest.raises(UserError, match=r"^jbert.search needs faiss, which is not installed: pip install "
                                      r"'jbert\[search\]'"):
    Index(8)


def _damage(folder, case: str) -> None:
  faiss_path, docs, meta_path = folder / "index.faiss", folder / "docs.jsonl", folder / "index.json"
  lines = docs.read_text(encoding="utf-8").splitlines(keepends=True)
  meta = json.loads(meta_path.read_text())
  if case == "truncated index.faiss":
    faiss_path.write_bytes(faiss_path.read_bytes()[:-100])
  elif case == "flipped index.faiss":
    data = bytearray(faiss_path.read_bytes())
    data[-7] ^= 0x10  # a bit of the last vector
    faiss_path.write_bytes(bytes(data))
  elif case == "docs without text":
    lines[2] = json.dumps({"id": json.loads(lines[2])["id"]}) + "\n"
    docs.write_text("".join(lines), encoding="utf-8")
  elif case == "docs cut mid-line":
    docs.write_text("".join(lines)[:-20], encoding="utf-8")
  elif case == "swapped docs":
    lines[3], lines[4] = lines[4], lines[3]
    docs.write_text("".join(lines), encoding="utf-8")
  elif case == "index.json without dim":
    del meta["dim"]
    meta_path.write_text(json.dumps(meta))
  elif case == "index.json with another pooling":
    meta["model"]["settings"]["pooling"] = ["cls"]
    meta_path.write_text(json.dumps(meta))


DAMAGE = {
    "truncated index.faiss": "{d}/index.faiss is damaged: it has {size} bytes where index.json records {recorded}; "
                             "rebuild the index with `python -m jbert.search index` (or restore the folder from a "
                             "copy).",
    "flipped index.faiss": "{d}/index.faiss does not match the checksum index.json records for it: it was damaged or "
                           "changed after the build; rebuild the index with `python -m jbert.search index` (or "
                           "restore the folder from a copy).",
    "docs without text": "{d}/docs.jsonl line 3 has no \"text\": the file is damaged; rebuild the index with "
                         "`python -m jbert.search index` (or restore the folder from a copy).",
    "docs cut mid-line": "{d}/docs.jsonl line 40 is not a JSON object (cut short?): the file is damaged; rebuild the "
                         "index with `python -m jbert.search index` (or restore the folder from a copy).",
    "swapped docs": "{d}/docs.jsonl does not match the checksum index.json records for it: it was damaged or changed "
                    "after the build; rebuild the index with `python -m jbert.search index` (or restore the folder "
                    "from a copy).",
    "index.json without dim": "{d}/index.json lacks \"dim\": the file is damaged; rebuild the index with `python -m "
                              "jbert.search index` (or restore the folder from a copy).",
    "index.json with another pooling": "{d}/index.json was changed after the build (its checksum does not match its "
                                       "contents); rebuild the index with `python -m jbert.search index` (or restore "
                                       "the folder from a copy).",
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_index_is_one_line_naming_the_file(case, built_dir, tmp_path, capsys):
  folder = tmp_path / "index"
  shutil.copytree(built_dir, folder)
  recorded = (folder / "index.faiss").stat().st_size
  _damage(folder, case)
  before = tree_hashes(folder)
  assert command("query", f"--index={folder}", "the cat") == 2
  message = DAMAGE[case].format(d=folder, size=(folder / "index.faiss").stat().st_size, recorded=recorded)
  assert one_line(capsys) == f"jbert.search: {message}"
  assert tree_hashes(folder) == before


def test_an_index_of_format_1_still_loads_and_is_queried_on_what_it_records(built_dir, tmp_path, caplog):
  folder = tmp_path / "index"
  shutil.copytree(built_dir, folder)
  meta = json.loads((folder / "index.json").read_text())
  old = {k: v for k, v in meta.items() if k not in ("files", "checksum")}
  old["format"] = 1
  old["model"] = {k: v for k, v in meta["model"].items() if k not in ("tokenizer", "modules", "dtype")}
  (folder / "index.json").write_text(json.dumps(old))
  loaded, current = Index.load(str(folder)), Index.load(str(built_dir))
  assert loaded.ids == current.ids and loaded.texts == current.texts
  assert loaded.search(["the cat sat"], top_k=5) == current.search(["the cat sat"], top_k=5)
  assert "built by an older jbert that did not record its tokenizer" in caplog.text
