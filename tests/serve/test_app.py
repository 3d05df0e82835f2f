"""The routes over loopback HTTP against one running server: answers equal to jbert.embed / jbert.predict /
jbert.search's re-ranking on the same inputs, the official `openai` client unchanged, every bad request a 4xx
with a JSON message naming the problem, and the metrics."""
import base64

import httpx
import numpy as np
import pytest

from inference.tiny_models import TEXTS
from serve.conftest import post

SHORT = [t for t in TEXTS if len(t) < 60] + ["the dog and the bird", "a sad day in paris"]


def embed_reference(model, texts, **kw):
  import jbert  # pylint: disable=import-outside-toplevel
  return jbert.embed(texts, str(model), **kw)


def test_embeddings_equal_jbert_embed_in_both_encodings_and_matryoshka(server, bi_encoder):
  expected = embed_reference(bi_encoder, SHORT)
  answer = post(server.url + "/v1/embeddings", {"model": "encoder", "input": SHORT})
  assert answer.status_code == 200, answer.text
  body = answer.json()
  got = np.array([d["embedding"] for d in body["data"]], np.float32)
  assert [d["index"] for d in body["data"]] == list(range(len(SHORT)))
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=0)
  tokens = sum(len(ids) + 2 for ids in _ids(bi_encoder, SHORT))
  assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
  # base64: the same float32 bits as the JSON numbers
  b64 = post(server.url + "/v1/embeddings", {"model": "encoder", "input": SHORT, "encoding_format": "base64"}).json()
  decoded = np.stack([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in b64["data"]])
  np.testing.assert_array_equal(decoded, got)
  # dimensions: cut, then unit length again (the folder normalises)
  cut = post(server.url + "/v1/embeddings", {"model": "encoder", "input": SHORT, "dimensions": 8}).json()
  cut = np.array([d["embedding"] for d in cut["data"]])
  want = expected[:, :8] / np.linalg.norm(expected[:, :8], axis=1, keepdims=True)
  np.testing.assert_allclose(cut, want, atol=1e-5)
  np.testing.assert_allclose(np.linalg.norm(cut, axis=1), 1.0, atol=1e-5)


def _ids(model, texts):
  from jbert.inference import load_model  # pylint: disable=import-outside-toplevel
  return load_model(str(model)).tokenizer.batch_ids(texts)


def test_token_ids_and_a_single_string_are_inputs_too(server, bi_encoder):
  ids = _ids(bi_encoder, ["the cat sat on the mat."])[0]
  expected = embed_reference(bi_encoder, ["the cat sat on the mat."])
  for value in (ids, [ids], "the cat sat on the mat."):
    body = post(server.url + "/v1/embeddings", {"model": "encoder", "input": value}).json()
    np.testing.assert_allclose(np.array([d["embedding"] for d in body["data"]]), expected, atol=1e-5)


def test_openai_client_unchanged(server, bi_encoder):
  import openai  # pylint: disable=import-outside-toplevel
  client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
  expected = embed_reference(bi_encoder, SHORT[:3])
  answer = client.embeddings.create(model="encoder", input=SHORT[:3])  # the client asks for base64 by default
  np.testing.assert_allclose(np.array([d.embedding for d in answer.data]), expected, atol=1e-5)
  assert answer.usage.prompt_tokens > 0
  floats = client.embeddings.create(model="encoder", input=SHORT[0], encoding_format="float", dimensions=16)
  assert len(floats.data[0].embedding) == 16
  with pytest.raises(openai.NotFoundError, match="serves"):
    client.embeddings.create(model="text-embedding-3-small", input="x")


def test_rerank_equals_the_cross_encoder_and_the_bi_encoder_cosine(server, bi_encoder, cross_encoder):
  from jbert.search.rerank import CrossEncoderScorer  # pylint: disable=import-outside-toplevel
  query, docs = "the cat", SHORT[:6]
  scores = CrossEncoderScorer(str(cross_encoder))([(query, d) for d in docs])
  body = post(server.url + "/rerank", {"model": "rerank", "query": query, "documents": docs, "top_n": 3,
                                       "return_documents": True}).json()
  order = sorted(range(len(docs)), key=lambda i: -scores[i])[:3]
  assert [r["index"] for r in body["results"]] == order
  assert [r["document"] for r in body["results"]] == [docs[i] for i in order]
  np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], scores[order], atol=1e-5)
  # text-embeddings-inference's field names, a bi-encoder: the cosine of the embeddings
  vectors = embed_reference(bi_encoder, [query] + docs).astype(np.float64)
  cosine = vectors[1:] @ vectors[0] / np.linalg.norm(vectors[1:], axis=1) / np.linalg.norm(vectors[0])
  body = post(server.url + "/v1/rerank", {"model": "encoder", "query": query, "texts": docs}).json()
  assert len(body["results"]) == len(docs) and "document" not in body["results"][0]
  got = {r["index"]: r["relevance_score"] for r in body["results"]}
  np.testing.assert_allclose([got[i] for i in range(len(docs))], cosine, atol=1e-5)


def test_predict_equals_jbert_predict(server, classifier, cross_encoder):
  import jbert  # pylint: disable=import-outside-toplevel
  texts = SHORT[:5]
  expected = jbert.predict(texts, str(classifier))
  body = post(server.url + "/predict", {"model": "cls", "inputs": texts}).json()
  assert [p["label"] for p in body["predictions"]] == [e["label"] for e in expected]
  for got, want in zip(body["predictions"], expected):
    np.testing.assert_allclose(list(got["probabilities"].values()), list(want["probabilities"].values()), atol=1e-5)
  pairs = [["the cat", t] for t in texts]
  expected = jbert.predict([tuple(p) for p in pairs], str(cross_encoder))
  body = post(server.url + "/predict", {"model": "rerank", "inputs": pairs}).json()
  np.testing.assert_allclose([p["value"] for p in body["predictions"]], [e["value"] for e in expected], atol=1e-5)


LONG = "the " * 60 + "end"  # 65 tokens with [CLS] and [SEP] ("end" is 3 pieces): more than the encoder's 48
LONGER = "the " * 70 + "end"  # 75: more than the classifier's 64

BAD = [  # (path, body, content type, status, words the message must hold)
    ("/v1/embeddings", b"{not json", "application/json", 400, "not valid JSON"),
    ("/v1/embeddings", {"model": "encoder", "input": ["x"]}, "text/plain", 415, "Content-Type is text/plain"),
    ("/v1/embeddings", [1, 2], "application/json", 400, "not an object"),
    ("/v1/embeddings", {"model": "encoder"}, "application/json", 400, "no \"input\""),
    ("/v1/embeddings", {"model": "encoder", "input": []}, "application/json", 400, "an empty list"),
    ("/v1/embeddings", {"model": "encoder", "input": ["ok", 3.5]}, "application/json", 400, "\"input\"[1] is 3.5"),
    ("/v1/embeddings", {"model": "encoder", "input": [[1, 2], [99999]]}, "application/json", 400,
     "input 1 holds token ids outside"),
    ("/v1/embeddings", {"model": "nope", "input": "x"}, "application/json", 404, "model \"nope\": this server serves"),
    ("/v1/embeddings", {"model": "cls", "input": "x"}, "application/json", 400, "cls is a prediction model"),
    ("/v1/embeddings", {"model": "encoder", "input": LONG}, "application/json", 413, "input 0 has 65 tokens"),
    ("/v1/embeddings", {"model": "encoder", "input": "x", "dimensions": 0}, "application/json", 400,
     "\"dimensions\" is 0"),
    ("/v1/embeddings", {"model": "encoder", "input": "x", "encoding_format": "int8"}, "application/json", 400,
     "\"encoding_format\""),
    ("/v1/embeddings", {"model": "encoder", "input": "x", "truncate": "yes"}, "application/json", 400,
     "\"truncate\" is \"yes\""),
    ("/rerank", {"model": "rerank", "query": "q", "documents": []}, "application/json", 400, "\"documents\" must"),
    ("/rerank", {"model": "rerank", "documents": ["d"]}, "application/json", 400, "\"query\" must be a string"),
    ("/rerank", {"model": "cls", "query": "q", "documents": ["d"]}, "application/json", 400, "/rerank is served by"),
    ("/rerank", {"model": "rerank", "query": "q", "documents": ["d"], "top_n": -1}, "application/json", 400,
     "\"top_n\""),
    ("/predict", {"model": "cls", "inputs": ["a", ["b", "c"]]}, "application/json", 400, "the others are pairs"),
    ("/predict", {"model": "cls", "inputs": ["a", LONGER]}, "application/json", 413, "input 1 has 75 tokens"),
    ("/predict", {"model": "cls"}, "application/json", 400, "no \"inputs\""),
    ("/nowhere", {}, "application/json", 404, "no route /nowhere"),
]


def test_bad_requests_are_4xx_with_a_json_message_naming_the_problem(server):
  for path, body, media, status, words in BAD:
    answer = post(server.url + path, body, headers={"Content-Type": media})
    assert answer.status_code == status, (path, body, answer.text)
    assert words in answer.json()["error"]["message"], (path, body, answer.text)
  answer = httpx.get(server.url + "/v1/embeddings")
  assert answer.status_code == 405 and "GET is not allowed" in answer.json()["error"]["message"]
  # the same long input with truncate: cut to the model's length, as jbert.embed cuts it
  body = post(server.url + "/v1/embeddings", {"model": "encoder", "input": LONG, "truncate": True}).json()
  assert body["usage"]["prompt_tokens"] == 48
  assert post(server.url + "/predict", {"model": "cls", "inputs": [LONGER], "truncate": True}).status_code == 200


def test_health_models_and_metrics(server):
  assert httpx.get(server.url + "/health").json()["status"] == "ok"
  listed = {m["id"]: m for m in httpx.get(server.url + "/v1/models").json()["data"]}
  assert listed["encoder"]["kind"] == "embedding" and listed["encoder"]["dimensions"] == 32
  assert listed["rerank"]["endpoints"] == ["/predict", "/rerank"] and listed["cls"]["task"] == "classification"
  post(server.url + "/v1/embeddings", {"model": "encoder", "input": "the cat"})
  text = httpx.get(server.url + "/metrics").text
  assert 'jbert_serve_requests_total{endpoint="embeddings",status="200"}' in text
  assert "jbert_serve_compiles_total 0.0" in text  # warm-up compiled every shape the requests met
  assert "jbert_serve_warmup_programs" in text and "jbert_serve_batch_rows_count" in text
