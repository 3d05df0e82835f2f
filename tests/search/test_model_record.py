"""What an index records about its model, and the query-time check against it: every setting that changes the
vectors is recorded (weights, Dense module, tokenizer, lower-casing, dtype, pooling, length), and a query model
that differs in any of them is refused by name; an index built with --tokenizer is queried with that tokenizer."""
import json
import shutil

import numpy as np
import pytest

import jbert
from jbert.errors import UserError
from jbert.inference.embedding import Embedder
from jbert.search import BuildOptions, Index, build_index
from jbert.search import model_record

from search.conftest import OPTIONS_KW, sentences


@pytest.fixture(scope="module")
def built(built_dir):
  return Index.load(str(built_dir))


def test_the_record_names_everything_that_changes_the_vectors(built, bi_encoder):
  record = built.model
  assert record["path"] == str(bi_encoder) and record["dim"] == 32 and record["dtype"] == "float32"
  assert record["tokenizer"] == {"path": str(bi_encoder / "tokenizer.json"), "given": False,
                                 "fingerprint": record["tokenizer"]["fingerprint"]}
  assert record["modules"] is None  # no Dense module
  assert record["settings"] == {"pooling": ["mean"], "normalize": True, "layers": [2], "layer_combine": "concat",
                                "max_length": 16, "lowercase": False, "projection": None}
  # The tokenizer's fingerprint is its pieces and normalisation: the same vocabulary as vocab.txt agrees.
  assert record["tokenizer"]["fingerprint"] == model_record.tokenizer_fingerprint(
      jbert.tokenizer.load_tokenizer(str(bi_encoder / "tokenizer.json")))


def test_a_folder_with_the_same_weights_and_another_vocabulary_is_refused(built, bi_encoder, permuted_vocab,
                                                                           tmp_path):
  impostor = tmp_path / "impostor"
  shutil.copytree(bi_encoder, impostor)
  shutil.copy(permuted_vocab, impostor / "vocab.txt")  # read before tokenizer.json
  message = (rf"^--model={impostor} tokenizes with another vocabulary than the index's model "
             rf"\({bi_encoder}, tokenizer {bi_encoder}/tokenizer.json\): query it with that tokenizer "
             r"\(--tokenizer\) or that model\.$")
  with pytest.raises(UserError, match=message):
    built.search(["terrible"], model=str(impostor))
  with pytest.raises(UserError, match=r"^--tokenizer=.*vocab.txt tokenizes with another vocabulary"):
    built.search(["terrible"], tokenizer=str(permuted_vocab))


def test_lower_casing_and_a_dense_module_are_part_of_the_model(built, bi_encoder, dense_encoders, tmp_path):
  lowering = tmp_path / "lowering"
  shutil.copytree(bi_encoder, lowering)
  config = json.loads((lowering / "sentence_bert_config.json").read_text())
  (lowering / "sentence_bert_config.json").write_text(json.dumps({**config, "do_lower_case": True}))
  with pytest.raises(UserError, match=rf"^--model={lowering} embeds with lower-casing True where the index's model "
                                      rf"\({bi_encoder}\) has False; query it with that model\.$"):
    built.search(["the cat"], model=str(lowering))
  first, second = dense_encoders
  record = model_record.model_record(Embedder(str(first)))
  assert record["dim"] == 16 and record["modules"] is not None
  assert record["settings"]["projection"] == {"in_features": 32, "out_features": 16, "bias": True,
                                              "activation": "tanh"}
  model_record.query_embedder(record, str(first))  # the same folder passes
  with pytest.raises(UserError, match=rf"^--model={second} has other Dense module weights than the index's model "
                                      rf"\({first}\); query it with that model\.$"):
    model_record.query_embedder(record, str(second))


def test_an_index_built_with_a_tokenizer_is_queried_with_it(untokenized_encoder, bi_encoder, built, corpus,
                                                              permuted_vocab, tmp_path):
  folder, vocab = untokenized_encoder
  index = build_index(str(corpus), str(folder), str(tmp_path / "index"),
                      options=BuildOptions(**OPTIONS_KW, tokenizer=str(vocab)))
  assert index.model["tokenizer"] == {"path": str(vocab), "given": True,
                                      "fingerprint": built.model["tokenizer"]["fingerprint"]}
  loaded = Index.load(str(tmp_path / "index"))
  queries = ["the cat sat on the mat", "paris"]
  # The recorded tokenizer, without --tokenizer: the hits of the index the folder's own tokenizer built.
  want = built.search(queries, top_k=5)
  got = loaded.search(queries, top_k=5)
  assert [[h.id for h in row] for row in got] == [[h.id for h in row] for row in want]
  np.testing.assert_allclose([[h.score for h in r] for r in got], [[h.score for h in r] for r in want], atol=1e-6)
  assert loaded.search(queries, top_k=5, tokenizer=str(vocab)) == got  # the same tokenizer given again
  with pytest.raises(UserError, match=r"^--tokenizer=.*vocab.txt tokenizes with another vocabulary"):
    loaded.search(queries, tokenizer=str(permuted_vocab))
  vocab.rename(vocab.with_suffix(".moved"))
  try:
    with pytest.raises(UserError, match=rf"^the index's tokenizer {vocab} \(given with --tokenizer when it was "
                                        r"built\) is gone; pass the same tokenizer with --tokenizer\.$"):
      Index.load(str(tmp_path / "index")).search(queries)
  finally:
    vocab.with_suffix(".moved").rename(vocab)
  assert sentences(40) == loaded.texts
