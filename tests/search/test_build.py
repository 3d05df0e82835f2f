"""Building an index from a corpus: the stored embeddings are jbert.embed's and queries search as a numpy brute
force over them; a build killed with SIGKILL mid-chunk leaves nothing under the index's name and resumes to the
index an uninterrupted build makes; a second writer, other inputs for an unfinished build (a setting that
changes the vectors is named with the flag that restores it) and another query model are refused."""
import fcntl
import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import jbert
from jbert.errors import UserError
from jbert.search import BuildOptions, Index, build_index
from jbert.search import build as build_lib

from search.conftest import OPTIONS_KW, interrupted_build, sentences, tree_hashes, vectors as _vectors

REPO = pathlib.Path(__file__).resolve().parents[2]
OPTIONS = BuildOptions(**OPTIONS_KW)

# Builds the index in a child that kills itself with SIGKILL halfway through writing its third chunk.
_KILLED_CHILD = """
import os, signal, sys
sys.path.insert(0, {repo!r})
from jbert.inference import io
from jbert.search import build
written = []
def write(self, block):
  written.append(len(block))
  if len(written) == 3:
    self._write(block[:len(block) // 2].tobytes())
    self.file.flush()
    os.kill(os.getpid(), signal.SIGKILL)
  real(self, block)
real, io.NpyWriter.write = io.NpyWriter.write, write
build.build_index({corpus!r}, {model!r}, {index!r}, options=build.BuildOptions(text_column="body", id_column="doc",
                  chunk_size=16))
"""


@pytest.fixture(scope="module")
def built(built_dir):
  return Index.load(str(built_dir))


def test_the_index_holds_jbert_embeddings_and_searches_as_brute_force(built, bi_encoder, corpus):
  texts = sentences(40)
  assert built.ids == [f"d{i}" for i in range(40)] and built.texts == texts
  docs = jbert.embed(texts, str(bi_encoder))
  np.testing.assert_allclose(_vectors(built), docs, atol=1e-6)
  queries = ["the cat sat on the mat", "a bird sings at night", "paris"]
  hits = built.search(queries, top_k=5)  # embedded by the index's own model and settings
  scores = jbert.embed(queries, str(bi_encoder)) @ docs.T
  want = np.argsort(-scores, axis=1, kind="stable")[:, :5]
  assert [[h.id for h in row] for row in hits] == [[f"d{i}" for i in row] for row in want]
  np.testing.assert_allclose([[h.score for h in row] for row in hits], np.take_along_axis(scores, want, 1),
                             atol=1e-5)
  assert built.model["settings"]["pooling"] == ["mean"] and built.model["settings"]["normalize"] is True
  assert built.model["dim"] == 32 and built.model["path"] == str(bi_encoder)


def test_a_build_killed_mid_chunk_resumes_to_the_uninterrupted_index(tmp_path, built, bi_encoder, corpus,
                                                                     monkeypatch):
  index_dir = tmp_path / "index"
  child = subprocess.run([sys.executable, "-c", _KILLED_CHILD.format(repo=str(REPO), corpus=str(corpus),
                                                                     model=str(bi_encoder), index=str(index_dir))],
                         capture_output=True, text=True, timeout=300)
  assert child.returncode == -9, child.stderr
  partial = tmp_path / "index.partial"
  assert not index_dir.exists()  # nothing under the final name
  # The half-written third chunk never got its name: it lies under a temporary one.
  names = sorted(os.listdir(partial / "chunks"))
  assert names[1:] == ["000000.npy", "000001.npy"] and re.fullmatch(r"\.000002\.npy\.\d+\.tmp", names[0])
  embedded = []
  real = build_lib.Embedder.__call__
  monkeypatch.setattr(build_lib.Embedder, "__call__", lambda self, texts, **kw: embedded.append(len(texts)) or
                      real(self, texts, **kw))
  resumed = build_index(str(corpus), str(bi_encoder), str(index_dir), options=OPTIONS)
  assert embedded == [8]  # only the third chunk (rows 32..39) was embedded again
  assert not partial.exists() and sorted(os.listdir(index_dir)) == ["docs.jsonl", "index.faiss", "index.json"]
  assert resumed.ids == built.ids and resumed.texts == built.texts
  np.testing.assert_array_equal(_vectors(resumed), _vectors(built))
  assert Index.load(str(index_dir)).ids == built.ids


def test_a_second_writer_and_other_inputs_for_an_unfinished_build_are_refused(tmp_path, bi_encoder, corpus):
  index_dir = tmp_path / "index"
  interrupted_build(tmp_path / "index", corpus, bi_encoder)
  with open(tmp_path / "index.partial" / ".lock", "w", encoding="utf-8") as held:
    fcntl.flock(held, fcntl.LOCK_EX)
    with pytest.raises(UserError, match=r"index is being built by another process \(it holds .*index.partial/.lock"):
      build_index(str(corpus), str(bi_encoder), str(index_dir), options=OPTIONS)
  manifest = json.loads((tmp_path / "index.partial" / "manifest.json").read_text())
  (tmp_path / "index.partial" / "manifest.json").write_text(json.dumps({**manifest, "chunk_size": 99}))
  with pytest.raises(UserError, match=r"index.partial holds an unfinished build made with other settings: "
                                      r"--chunk_size 99 -> 16; rerun with --chunk_size=99 to finish it, or remove "):
    build_index(str(corpus), str(bi_encoder), str(index_dir), options=OPTIONS)
  old_model = {k: v for k, v in manifest["model"].items() if k not in ("tokenizer", "modules", "dtype")}
  (tmp_path / "index.partial" / "manifest.json").write_text(json.dumps({**manifest, "model": old_model}))
  with pytest.raises(UserError, match=r"index.partial holds an unfinished build started by an older jbert, which "
                                      r"did not record the tokenizer, Dense module or dtype"):
    build_index(str(corpus), str(bi_encoder), str(index_dir), options=OPTIONS)
  assert not index_dir.exists()


def test_a_resume_with_a_setting_that_changes_the_vectors_is_refused_by_name(tmp_path, built, bi_encoder, corpus,
                                                                            permuted_vocab, monkeypatch):
  index_dir = tmp_path / "index"
  partial = tmp_path / "index.partial"
  interrupted_build(index_dir, corpus, bi_encoder)
  before = tree_hashes(partial)
  fix = f"to finish it, or remove {partial} to start over."
  cases = [
      (dict(dtype="bfloat16"), f"--dtype float32 -> bfloat16; rerun with --dtype=float32 {fix}"),
      (dict(tokenizer=str(permuted_vocab)),
       f"tokenizer {bi_encoder}/tokenizer.json -> {permuted_vocab}; rerun without --tokenizer {fix}"),
      (dict(max_length=12, normalize=False), f"--max_length 16 -> 12, --normalize True -> False; rerun with "
                                             f"--max_length=16, with --normalize {fix}"),
      (dict(pooling="cls"), f"--pooling mean -> cls; rerun with --pooling=mean {fix}"),
  ]
  for changed, message in cases:
    options = BuildOptions(**{**OPTIONS_KW, **changed})
    with pytest.raises(UserError) as refused:
      build_index(str(corpus), str(bi_encoder), str(index_dir), options=options)
    assert str(refused.value) == f"{partial} holds an unfinished build made with other settings: {message}"
    assert tree_hashes(partial) == before and not index_dir.exists()
  embedded = []
  real = build_lib.Embedder.__call__
  monkeypatch.setattr(build_lib.Embedder, "__call__", lambda self, texts, **kw: embedded.append(len(texts)) or
                      real(self, texts, **kw))
  # --batch_size only changes how rows are grouped: it may differ.
  resumed = build_index(str(corpus), str(bi_encoder), str(index_dir),
                        options=BuildOptions(**OPTIONS_KW, batch_size=4))
  assert embedded == [16, 8] and resumed.ids == built.ids and resumed.model == built.model
  np.testing.assert_allclose(_vectors(resumed), _vectors(built), atol=1e-6)


def test_queries_with_another_model_are_refused(built, other_encoder):
  with pytest.raises(UserError, match=r"^--model=.*encoder gives another model's embeddings: the index was made by "
                                      r"another model \(.*bi_encoder, 32 dims\); query it with that model\.$"):
    built.search(["the cat"], model=str(other_encoder))
