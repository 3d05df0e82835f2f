"""Compute worker processes over loopback HTTP: the same answers bit for bit as the server's own process, a worker
killed under load fails only the batch it held (a 500 naming it) and is replaced, and none outlives a server
killed with -9."""
import os
import pickle
import re
import signal
import threading
import time

import httpx
import numpy as np

from serve.conftest import TEXTS, post


def _children(pid: int) -> list[int]:
  found = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        with open(f"/proc/{entry}/stat") as f:
          stat = f.read()
      except OSError:
        continue
      if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
        found.append(int(entry))
  return found


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except OSError:
    return False


def test_workers_answer_bit_for_bit_what_the_server_process_computes(serve, bi_encoder, classifier):
  args = (f"--model={bi_encoder}", f"--model=cls={classifier}", "--max_batch_tokens=256")
  inline = serve(*args, "--compute_workers=0").wait_ready()
  workers = serve(*args, "--compute_workers=2").wait_ready()
  assert len(_children(workers.proc.pid)) == 2 and not _children(inline.proc.pid)
  assert _metric(workers.url, "jbert_serve_compute_workers") == 2 and not _metric(inline.url,
                                                                                  "jbert_serve_compute_workers")
  warmed = [re.search(r"^jbert_serve_warmup_programs (\S+)$", httpx.get(s.url + "/metrics").text, re.M).group(1)
            for s in (inline, workers)]
  assert warmed[0] == warmed[1] and float(warmed[0]) > 0  # the same shapes, in the workers instead
  answers = [(post(s.url + "/v1/embeddings", {"model": "encoder", "input": TEXTS}).json(),
              post(s.url + "/predict", {"model": "cls", "inputs": TEXTS}).json()) for s in (inline, workers)]
  assert answers[0] == answers[1]  # JSON floats: equal text is equal bits


def test_a_killed_worker_fails_only_its_batch_then_is_replaced_and_none_outlives_the_server(serve, bi_encoder):
  served = serve(f"--model={bi_encoder}", "--max_batch_tokens=256", "--compute_workers=2").wait_ready()
  expected = {t: post(served.url + "/v1/embeddings", {"input": t}).json()["data"][0]["embedding"] for t in TEXTS}
  first = sorted(_children(served.proc.pid))
  outcomes, stop = [], threading.Event()

  def client(seed):
    pick = np.random.default_rng(seed)
    with httpx.Client(timeout=60) as http:
      while not stop.is_set():
        chosen = [TEXTS[i] for i in pick.integers(0, len(TEXTS), int(pick.integers(1, 4)))]
        outcomes.append((time.monotonic(), chosen, http.post(served.url + "/v1/embeddings", json={"input": chosen})))

  threads = [threading.Thread(target=client, args=(s,)) for s in range(6)]
  for thread in threads:
    thread.start()
  time.sleep(1.5)
  os.kill(first[0], signal.SIGKILL)
  killed_at = time.monotonic()
  deadline = killed_at + 120
  while len(set(_children(served.proc.pid)) - set(first)) < 1 and time.monotonic() < deadline:
    time.sleep(0.2)
  replaced = sorted(set(_children(served.proc.pid)) - set(first))
  assert len(replaced) == 1 and first[1] in _children(served.proc.pid)  # the other worker served on
  while _metric(served.url, "jbert_serve_compute_workers") < 2 and time.monotonic() < deadline:
    time.sleep(0.2)
  assert _metric(served.url, "jbert_serve_compute_workers") == 2  # the new worker warm and taking batches
  ready = len(outcomes)
  while len(outcomes) < ready + 20 and time.monotonic() < deadline:
    time.sleep(0.2)
  stop.set()
  for thread in threads:
    thread.join(60)
  failed = [a for _, _, a in outcomes if a.status_code != 200]
  assert 1 <= len(failed) <= 6  # the requests of the one batch the killed worker held, no others
  for answer in failed:
    assert answer.status_code == 500
    assert "compute worker 0 died while computing this request's batch (exit status -9)" in (
        answer.json()["error"]["message"])
  for _, chosen, answer in outcomes:
    if answer.status_code == 200:
      np.testing.assert_allclose([d["embedding"] for d in answer.json()["data"]], [expected[t] for t in chosen],
                                 atol=1e-5, rtol=0)  # bit for bit where the same packed shape ran
  assert sum(1 for at, _, a in outcomes if at > killed_at and a.status_code == 200) >= 20
  assert "compute worker 0 started again and warm" in _stderr_after_kill(served, replaced + [first[1]])


def _metric(url: str, name: str) -> float:
  return float(re.search(rf"^{name} (\S+)$", httpx.get(url + "/metrics").text, re.M).group(1))


def _stderr_after_kill(served, workers: list[int]) -> str:
  """kill -9 the server: its workers die with it (the kernel's parent-death signal), none is left computing."""
  served.proc.send_signal(signal.SIGKILL)
  _, err = served.proc.communicate(timeout=30)
  deadline = time.monotonic() + 10
  while any(_alive(p) for p in workers) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not any(_alive(p) for p in workers)
  return err


def test_errors_cross_the_process_boundary_whole():
  from jbert.serve.models import ApiError  # pylint: disable=import-outside-toplevel
  error = pickle.loads(pickle.dumps(ApiError(503, "busy", retry_after=1)))
  assert (error.status, error.message, error.retry_after, str(error)) == (503, "busy", 1, "busy")
