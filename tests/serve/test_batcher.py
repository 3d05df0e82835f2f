"""The device loop over loopback HTTP: hundreds of concurrent mixed requests each answered with what it gets alone,
a full queue refused with 503 + Retry-After (memory does not grow), a request that could never fit refused with
413, and a client that disconnects while queued costing no computation."""
import asyncio
import json
import re
import socket
import threading
import time

import httpx
import numpy as np
import pytest

from inference.tiny_models import WORDS
from serve.conftest import post


def metric(url: str, name: str) -> float:
  match = re.search(rf"^{re.escape(name)} (\S+)$", httpx.get(url + "/metrics").text, re.M)
  return float(match.group(1)) if match else 0.0


def test_hundreds_of_concurrent_mixed_requests_each_equal_its_single_answer(server):
  rng = np.random.default_rng(0)
  texts = sorted({" ".join(rng.choice(WORDS, int(n))) for n in rng.integers(1, 12, 40)})
  texts += ["the " * int(n) + "end" for n in rng.integers(10, 40, 8)]  # 3 to ~45 tokens
  singles = {t: post(server.url + "/v1/embeddings", {"model": "encoder", "input": t}).json()["data"][0]["embedding"]
             for t in texts}
  labels = {t: post(server.url + "/predict", {"model": "cls", "inputs": [t]}).json()["predictions"][0]
            for t in texts[:10]}
  requests = []
  for k in range(300):
    if k % 5 == 4:
      chosen = [str(t) for t in rng.choice(texts[:10], int(rng.integers(1, 4)))]
      requests.append(("/predict", {"model": "cls", "inputs": chosen}))
    else:
      chosen = [str(t) for t in rng.choice(texts, int(rng.integers(1, 5)))]
      requests.append(("/v1/embeddings", {"model": "encoder", "input": chosen}))
  before = metric(server.url, "jbert_serve_batch_inputs_count")

  async def run_all():
    limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
    async with httpx.AsyncClient(base_url=server.url, limits=limits, timeout=120) as client:
      return await asyncio.gather(*(client.post(path, json=body) for path, body in requests))

  answers = asyncio.run(run_all())
  for (path, body), answer in zip(requests, answers):
    assert answer.status_code == 200, answer.text
    if path == "/predict":
      for text, got in zip(body["inputs"], answer.json()["predictions"]):
        assert got["label"] == labels[text]["label"]
        np.testing.assert_allclose(list(got["probabilities"].values()),
                                   list(labels[text]["probabilities"].values()), atol=1e-5)
    else:
      got = [d["embedding"] for d in answer.json()["data"]]
      np.testing.assert_allclose(got, [singles[t] for t in body["input"]], atol=1e-5, rtol=0)
  batches = metric(server.url, "jbert_serve_batch_inputs_count") - before
  assert batches < 300 - 50, f"{batches} device batches for 300 concurrent requests: the loop did not batch"
  assert metric(server.url, "jbert_serve_compiles_total") == 0


@pytest.fixture(scope="module")
def slow_server(bi_encoder):
  """A server whose device loop waits 3 s for more once a request is queued: requests stay queued long enough to
  fill the queue (4 inputs) or to leave it."""
  from serve.conftest import Served  # pylint: disable=import-outside-toplevel
  served = Served(f"--model={bi_encoder}", "--max_batch_tokens=256", "--max_queue=4", "--max_wait_ms=3000")
  try:
    yield served.wait_ready()
  finally:
    served.kill()


def test_a_full_queue_is_503_with_retry_after_and_the_queued_requests_are_answered(slow_server):
  url = slow_server.url
  first = {}
  thread = threading.Thread(target=lambda: first.update(
      answer=post(url + "/v1/embeddings", {"input": ["the cat", "a dog", "the sun", "paris"]})))
  thread.start()
  _wait_queued(url, 4)
  refused = post(url + "/v1/embeddings", {"input": "one more"})
  assert refused.status_code == 503 and refused.headers["Retry-After"] == "1"
  assert "at capacity (4 inputs queued, --max_queue=4)" in refused.json()["error"]["message"]
  too_big = post(url + "/v1/embeddings", {"input": ["a", "b", "c", "d", "e"]})
  assert too_big.status_code == 413 and "--max_queue=4" in too_big.json()["error"]["message"]
  thread.join(60)
  assert first["answer"].status_code == 200 and len(first["answer"].json()["data"]) == 4
  assert metric(url, 'jbert_serve_rejected_total{reason="queue_full"}') == 1
  assert metric(url, "jbert_serve_queue_inputs") == 0


def _wait_queued(url: str, inputs: int, timeout: float = 20) -> None:
  deadline = time.monotonic() + timeout
  while metric(url, "jbert_serve_queue_inputs") < inputs:
    assert time.monotonic() < deadline, "the request was not queued"
    time.sleep(0.05)


def test_a_client_that_disconnects_while_queued_costs_nothing(slow_server):
  url = slow_server.url
  tokens = metric(url, "jbert_serve_tokens_total")
  body = json.dumps({"input": ["the cat sat", "a dog ran"]}).encode()
  with socket.create_connection(("127.0.0.1", slow_server.port)) as sock:
    sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    _wait_queued(url, 2)
  deadline = time.monotonic() + 20
  while metric(url, "jbert_serve_cancelled_inputs_total") < 2:
    assert time.monotonic() < deadline, "the disconnected request was not dropped"
    time.sleep(0.05)
  assert metric(url, "jbert_serve_queue_inputs") == 0
  time.sleep(3.5)  # past the loop's wait: had the request stayed queued, it would have run by now
  assert metric(url, "jbert_serve_tokens_total") == tokens
  assert metric(url, 'jbert_serve_requests_total{endpoint="embeddings",status="499"}') == 1
  assert post(url + "/v1/embeddings", {"input": "still serving"}).status_code == 200
