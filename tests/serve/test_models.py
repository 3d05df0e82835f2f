"""What a served model computes, over loopback HTTP: a request whose own input overflows (finite weights, a
non-finite output) is a 500 naming that input, never a number, and a request that shared its batch is answered as
if it had been alone."""
import asyncio
import json

import httpx
import numpy as np
import pytest

from inference.tiny_models import TEXTS, VOCAB, hf_tokenizer, random_torch_model, write_vocab
from serve.conftest import Served
import trained


def test_a_non_finite_output_is_a_500_naming_the_input_and_its_batch_mates_are_answered(serve, tmp_path):
  from safetensors.numpy import load_file, save_file  # pylint: disable=import-outside-toplevel
  folder = tmp_path / "overflowing"
  random_torch_model("BertModel", seed=15).save_pretrained(folder)
  write_vocab(folder)
  state = load_file(folder / "model.safetensors")
  state["embeddings.word_embeddings.weight"][VOCAB.index("cat")] = 3e38  # finite; any sum with it is inf
  save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
  # The loop waits up to a second for more, so the two requests sent together share a batch.
  served = serve(f"--model=m={folder}", "--pooling=mean", "--max_batch_tokens=256", "--max_wait_ms=1000")
  served.wait_ready()
  alone = httpx.post(served.url + "/v1/embeddings", json={"input": ["the sun", "a red bird"]}, timeout=60).json()

  async def together():
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
      return await asyncio.gather(client.post("/v1/embeddings", json={"input": ["the dog", "a cat sat"]}),
                                  client.post("/v1/embeddings", json={"input": ["the sun", "a red bird"]}))

  bad, good = asyncio.run(together())
  assert bad.status_code == 500
  assert bad.json()["error"]["message"] == (
      "the model's outputs for inputs 1 (0-based) are not finite (NaN or inf): the weights overflow on these inputs "
      "(e.g. float16/bfloat16 range, or a damaged model); try --dtype=float32 or another model.")
  assert good.status_code == 200
  np.testing.assert_array_equal([d["embedding"] for d in good.json()["data"]],
                                [d["embedding"] for d in alone["data"]])
  assert 'jbert_serve_requests_total{endpoint="embeddings",status="500"} 1.0' in httpx.get(served.url + "/metrics").text


# ------------------------------------------------------------------------- every kind of fine-tuned folder served


@pytest.fixture(scope="module")
def st_cross_encoder(tmp_path_factory):
  """A random tiny BERT saved by sentence-transformers' CrossEncoder (one label, its sigmoid, max length 32)."""
  from sentence_transformers import CrossEncoder  # pylint: disable=import-outside-toplevel
  source = tmp_path_factory.mktemp("serve_ce_source")
  random_torch_model("BertForSequenceClassification", seed=16, num_labels=1).save_pretrained(source)
  hf_tokenizer(write_vocab(source)).save_pretrained(source)
  folder = tmp_path_factory.mktemp("serve_ce") / "ce"
  CrossEncoder(str(source), num_labels=1, max_length=32, device="cpu").save(str(folder))
  return folder


@pytest.fixture(scope="module")
def task_server(tmp_path_factory, st_cross_encoder):
  """One server of the fine-tuned kinds jbert.predict serves beyond classification (NER with and without a CRF,
  question answering over windows, multiple choice), from their exports, and the CrossEncoder folder."""
  runs = {"ner": trained.tagger(tmp_path_factory), "crf": trained.tagger(tmp_path_factory, crf=True),
          "mc": trained.chooser(tmp_path_factory), "qa": trained.squad_v2(tmp_path_factory)}
  folders = {name: run.workdir / "export" for name, run in runs.items()}
  # Small batches: the requests below take several batches and every batch size warm-up compiled.
  served = Served(*(f"--model={name}={path}" for name, path in folders.items()), f"--model=ce={st_cross_encoder}",
                  "--max_batch_tokens=128", "--max_wait_ms=50")
  try:
    yield served.wait_ready(), runs, folders
  finally:
    served.kill()


def _assert_same_records(got, want, where):
  """Records equal as JSON, floats within 1e-5 (another batch's shapes may round the last bits apart)."""
  assert len(got) == len(want), where
  for k, (g, w) in enumerate(zip(got, want)):
    assert isinstance(g, dict) and set(g) == set(w), (where, k, g, w)
    for key, value in w.items():
      flat = np.asarray(value, dtype=object).ravel().tolist() if isinstance(value, (list, tuple)) else [value]
      got_flat = np.asarray(g[key], dtype=object).ravel().tolist() if isinstance(g[key], list) else [g[key]]
      if isinstance(value, dict):
        assert list(g[key]) == list(value), (where, k, key)
        np.testing.assert_allclose(list(g[key].values()), list(value.values()), atol=1e-5, err_msg=f"{where} {k}")
      elif any(isinstance(x, float) for x in flat):
        np.testing.assert_allclose(np.asarray(got_flat, float), np.asarray(flat, float), atol=1e-5,
                                   err_msg=f"{where} {k} {key}")
      else:
        assert g[key] == (list(value) if isinstance(value, tuple) else value), (where, k, key, g[key], value)


def _predict_concurrently(url, bodies):
  async def send():
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
      return await asyncio.gather(*(client.post("/predict", json=b) for b in bodies))
  answers = asyncio.run(send())
  for answer in answers:
    assert answer.status_code == 200, answer.text
  return [a.json()["predictions"] for a in answers]


def test_ner_qa_and_multiple_choice_answers_equal_jbert_predict(task_server):
  import jbert  # pylint: disable=import-outside-toplevel
  served, runs, folders = task_server
  sentences = [json.loads(l)["tokens"] for l in runs["ner"].dev.read_text().splitlines()]
  assert max(map(len, sentences)) > 14  # some take two or three 16-token windows
  choices = [{k: r[k] for k in ("context", "endings")} for r in map(json.loads, runs["mc"].dev.read_text()
                                                                     .splitlines())]
  questions = [{k: ex[k] for k in ("id", "question", "context")} for ex in runs["qa"].dev]
  cases = {"ner": sentences, "crf": sentences, "mc": choices, "qa": questions}
  for name, inputs in cases.items():
    want = jbert.predict(inputs, str(folders[name]))
    # The whole list in one request, and the same inputs as concurrent requests of one to three inputs each
    # (batched together with each other and with the other models' requests).
    whole = _predict_concurrently(served.url, [{"model": name, "inputs": inputs}])[0]
    _assert_same_records(whole, want, name)
    pieces = [inputs[i:i + 3] for i in range(0, len(inputs), 3)]
    answers = _predict_concurrently(served.url, [{"model": name, "inputs": p} for p in pieces])
    _assert_same_records([r for a in answers for r in a], want, f"{name} in pieces")
  # What was compared is what the tasks answer: tags per word, an answer span (or none), an ending.
  tagged = jbert.predict(sentences[:1], str(folders["crf"]))[0]
  assert tagged["tokens"] == sentences[0] and len(tagged["tags"]) == len(sentences[0])
  assert {"id", "answer", "score"} <= set(jbert.predict(questions[:1], str(folders["qa"]))[0])
  assert set(r["label"] for r in jbert.predict(choices, str(folders["mc"]))) <= {0, 1, 2, 3}
  compiles = [l for l in httpx.get(served.url + "/metrics").text.splitlines()
              if l.startswith("jbert_serve_compiles_total")]
  assert compiles == ["jbert_serve_compiles_total 0.0"], compiles  # warm-up compiled every shape requests met


def test_a_sentence_transformers_cross_encoder_reranks_as_cross_encoder_predict(task_server, st_cross_encoder):
  from sentence_transformers import CrossEncoder  # pylint: disable=import-outside-toplevel
  served, _, _ = task_server
  query, docs = "the cat", TEXTS + ["the dog and the bird " * k for k in range(1, 5)]
  want = CrossEncoder(str(st_cross_encoder), device="cpu").predict([(query, d) for d in docs],
                                                                    convert_to_numpy=True)
  assert 0 < want.min() and want.max() < 1  # the folder's sigmoid applied
  answer = httpx.post(served.url + "/rerank", json={"model": "ce", "query": query, "documents": docs}, timeout=60)
  assert answer.status_code == 200, answer.text
  results = answer.json()["results"]
  assert [r["index"] for r in results] == sorted(range(len(docs)), key=lambda i: -want[i])
  np.testing.assert_allclose([r["relevance_score"] for r in results], np.sort(want)[::-1], atol=1e-5, rtol=0)


def test_row_lengths_keep_a_paragraph_out_of_a_512_token_row():
  from jbert.serve.models import row_lengths  # pylint: disable=import-outside-toplevel
  # A 240-token input of a 512-token model runs in a row of 256, not 512 (2x the tokens, 4x the attention).
  assert row_lengths(512) == (32, 128, 256, 512)
  assert row_lengths(256) == (32, 128, 256) and row_lengths(48) == (32, 48) and row_lengths(16) == (16,)
