"""`python -m jbert.serve` as users run it: bad command lines in one line (exit 2), a plain encoder with
--pooling, SIGTERM draining what was accepted (exit 0), a second SIGTERM ending it at once, and kill -9 under load
(clients see connection errors, never a wrong or partial answer) then the same command serving the same answers."""
import re
import signal
import socket
import threading
import time

import httpx
import numpy as np
import pytest

from serve.conftest import TEXTS, free_port, post
from serve.test_batcher import metric


def _refused(serve, *args, port=None) -> str:
  served = serve(*args, port=port)
  status, err = served.finish(timeout=120)
  lines = err.strip().splitlines()
  assert status == 2 and len(lines) == 1, (status, err)
  assert lines[0].startswith("jbert.serve: ")
  return lines[0]


def test_bad_command_lines_are_one_line_and_exit_2(serve, bi_encoder, tmp_path):
  assert "required: --model" in _refused(serve)
  assert "does not exist" in _refused(serve, f"--model={tmp_path / 'missing'}")
  assert "--max_queue=0 must be at least 1" in _refused(serve, f"--model={bi_encoder}", "--max_queue=0")
  assert "--port=188910 must be at most 65535" in _refused(serve, f"--model={bi_encoder}", port=188910)
  assert "served as a; name them apart" in _refused(serve, f"--model=a={bi_encoder}", f"--model=a={bi_encoder}")
  assert ("--max_input_tokens=100 is more than model encoder computes (max_length 48)"
          in _refused(serve, f"--model={bi_encoder}", "--max_input_tokens=100"))
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    assert f"cannot listen on 127.0.0.1:{port}" in _refused(serve, f"--model={bi_encoder}", port=port)


def test_a_plain_encoder_needs_pooling_and_then_equals_jbert_embed(serve, plain_encoder):
  import jbert  # pylint: disable=import-outside-toplevel
  assert "pass --pooling=mean" in _refused(serve, f"--model={plain_encoder}")
  served = serve(f"--model={plain_encoder}", "--pooling=cls", "--normalize", "--max_batch_tokens=256").wait_ready()
  texts = ["the cat sat on the mat.", "paris is the capital of france", ""]
  body = post(served.url + "/v1/embeddings", {"input": texts}).json()
  expected = jbert.embed(texts, str(plain_encoder), pooling="cls", normalize=True)
  np.testing.assert_allclose([d["embedding"] for d in body["data"]], expected, atol=1e-5)


def _slow(serve, model):
  # The device loop waits 3 s for more once a request is queued: the requests are still queued at the SIGTERM.
  return serve(f"--model={model}", "--max_batch_tokens=256", "--max_wait_ms=3000").wait_ready()


def _post_in_thread(url, body, out, key):
  def run():
    try:
      out[key] = post(url + "/v1/embeddings", body)
    except httpx.TransportError as e:
      out[key] = e
  thread = threading.Thread(target=run)
  thread.start()
  return thread


def test_sigterm_stops_accepting_answers_what_was_queued_and_exits_0(serve, bi_encoder):
  import jbert  # pylint: disable=import-outside-toplevel
  served = _slow(serve, bi_encoder)
  bodies = [{"input": ["the cat sat", "a dog"]}, {"input": "paris is big"}, {"input": ["sun", "moon", "tree"]}]
  out = {}
  threads = [_post_in_thread(served.url, body, out, k) for k, body in enumerate(bodies)]
  deadline = time.monotonic() + 20
  while metric(served.url, "jbert_serve_queue_inputs") < 6:
    assert time.monotonic() < deadline
    time.sleep(0.05)
  served.signal(signal.SIGTERM)
  time.sleep(0.5)
  with pytest.raises(httpx.ConnectError):  # the listener is closed while the queued requests still wait
    httpx.get(served.url + "/health", timeout=5)
  for thread in threads:
    thread.join(60)
  for k, body in enumerate(bodies):
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    assert out[k].status_code == 200, out[k]
    np.testing.assert_allclose([d["embedding"] for d in out[k].json()["data"]],
                               jbert.embed(texts, str(bi_encoder)), atol=1e-5)
  status, err = served.finish()
  assert status == 0, err
  assert "stopped; every accepted request was answered" in err


def test_a_second_sigterm_exits_at_once(serve, bi_encoder):
  served = _slow(serve, bi_encoder)
  out = {}
  thread = _post_in_thread(served.url, {"input": "the cat"}, out, 0)
  deadline = time.monotonic() + 20
  while metric(served.url, "jbert_serve_queue_inputs") < 1:
    assert time.monotonic() < deadline
    time.sleep(0.05)
  served.signal(signal.SIGTERM)
  time.sleep(0.3)
  start = time.monotonic()
  served.signal(signal.SIGTERM)
  status, _ = served.finish(timeout=30)
  assert status == 143 and time.monotonic() - start < 2.5
  thread.join(30)
  assert isinstance(out[0], httpx.TransportError)  # the client sees the connection drop, not an answer


def test_kill_9_under_load_then_the_same_command_serves_the_same_answers(serve, bi_encoder):
  port = free_port()
  served = serve(f"--model={bi_encoder}", "--max_batch_tokens=256", port=port).wait_ready()
  rng = np.random.default_rng(1)
  expected = {t: post(served.url + "/v1/embeddings", {"input": t}).json()["data"][0]["embedding"] for t in TEXTS}
  outcomes, stop = [], threading.Event()

  def client(seed):
    pick = np.random.default_rng(seed)
    with httpx.Client(timeout=30) as http:
      while not stop.is_set():
        chosen = [TEXTS[i] for i in pick.integers(0, len(TEXTS), int(pick.integers(1, 4)))]
        try:
          outcomes.append((chosen, http.post(served.url + "/v1/embeddings", json={"input": chosen})))
        except httpx.TransportError as e:
          outcomes.append((chosen, e))
          return

  threads = [threading.Thread(target=client, args=(int(s),)) for s in rng.integers(0, 1 << 30, 8)]
  for thread in threads:
    thread.start()
  time.sleep(2.0)
  served.proc.send_signal(signal.SIGKILL)
  for thread in threads:
    thread.join(60)
  stop.set()
  answered = [(c, o) for c, o in outcomes if not isinstance(o, Exception)]
  failed = [o for _, o in outcomes if isinstance(o, Exception)]
  assert answered and len(failed) == 8  # every client ended on a connection error, none on a bad answer
  for chosen, answer in answered:
    assert answer.status_code == 200, answer.text
    np.testing.assert_allclose([d["embedding"] for d in answer.json()["data"]], [expected[t] for t in chosen],
                               atol=1e-5, rtol=0)
  again = serve(f"--model={bi_encoder}", "--max_batch_tokens=256", port=port).wait_ready()
  body = post(again.url + "/v1/embeddings", {"input": TEXTS}).json()
  np.testing.assert_allclose([d["embedding"] for d in body["data"]], [expected[t] for t in TEXTS], atol=1e-5, rtol=0)
  assert re.search(r"jbert_serve_compiles_total 0\.0", httpx.get(again.url + "/metrics").text)
