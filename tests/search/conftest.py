"""A tiny sentence-transformers bi-encoder, a tiny cross-encoder and a generated corpus for the search tests."""
import json
import shutil

import numpy as np
import pytest

from inference.tiny_models import WORDS, hf_tokenizer, random_torch_model, write_vocab


def sentences(n: int, seed: int = 0) -> list[str]:
  """`n` distinct sentences of 2 to 9 words of the tiny vocabulary (so several length buckets)."""
  rng = np.random.default_rng(seed)
  out = set()
  while len(out) < n:
    out.add(" ".join(rng.choice(WORDS, int(rng.integers(2, 10)))))
  return sorted(out)


@pytest.fixture(scope="session")
def bi_encoder(tmp_path_factory):
  """A random BERT as a sentence-transformers folder (mean pooling, Normalize, max length 16), as
  sentence-transformers saves it."""
  from sentence_transformers import SentenceTransformer, models  # pylint: disable=import-outside-toplevel
  source = tmp_path_factory.mktemp("bert")
  random_torch_model("BertModel", seed=3).save_pretrained(source)
  hf_tokenizer(write_vocab(source)).save_pretrained(source)
  transformer = models.Transformer(str(source), max_seq_length=16)
  pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
  folder = tmp_path_factory.mktemp("st") / "bi_encoder"
  SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu").save(str(folder))
  return folder


@pytest.fixture(scope="session")
def other_encoder(tmp_path_factory, bi_encoder):
  """The bi-encoder's folder with other random weights of the same shapes."""
  folder = tmp_path_factory.mktemp("other") / "encoder"
  shutil.copytree(bi_encoder, folder)
  random_torch_model("BertModel", seed=4).save_pretrained(folder)
  return folder


def _sequence_classifier(tmp_path_factory, name: str, seed: int, num_labels: int):
  folder = tmp_path_factory.mktemp(name)
  random_torch_model("BertForSequenceClassification", seed=seed, num_labels=num_labels).save_pretrained(folder)
  write_vocab(folder)
  return folder


@pytest.fixture(scope="session")
def reranker(tmp_path_factory):
  """A random one-label BertForSequenceClassification with its vocab: a cross-encoder's shape."""
  return _sequence_classifier(tmp_path_factory, "cross_encoder", 5, 1)


@pytest.fixture(scope="session")
def classifier(tmp_path_factory):
  """A random three-label classifier: not a cross-encoder."""
  return _sequence_classifier(tmp_path_factory, "classifier", 6, 3)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
  """40 documents as JSONL with string ids."""
  path = tmp_path_factory.mktemp("corpus") / "docs.jsonl"
  path.write_text("".join(json.dumps({"doc": f"d{i}", "body": s}) + "\n" for i, s in enumerate(sentences(40))),
                  encoding="utf-8")
  return path
