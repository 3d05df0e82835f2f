"""Tiny random model folders as users have them, and `python -m jbert.serve` started on a free loopback port (always
killed at the end), for the serving tests."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from inference.tiny_models import hf_tokenizer, random_torch_model, write_vocab

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def bi_encoder(tmp_path_factory):
  """A random BERT as a sentence-transformers folder (mean pooling, Normalize, max length 48)."""
  from sentence_transformers import SentenceTransformer, models  # pylint: disable=import-outside-toplevel
  source = tmp_path_factory.mktemp("serve_bert")
  random_torch_model("BertModel", seed=11).save_pretrained(source)
  hf_tokenizer(write_vocab(source)).save_pretrained(source)
  transformer = models.Transformer(str(source), max_seq_length=48)
  pooling = models.Pooling(transformer.get_embedding_dimension(), pooling_mode="mean")
  folder = tmp_path_factory.mktemp("serve_st") / "encoder"
  SentenceTransformer(modules=[transformer, pooling, models.Normalize()], device="cpu").save(str(folder))
  return folder


@pytest.fixture(scope="session")
def plain_encoder(tmp_path_factory):
  """A random Hugging Face BertModel folder with its vocab.txt: an encoder without a pooling of its own."""
  folder = tmp_path_factory.mktemp("serve_plain") / "plain"
  random_torch_model("BertModel", seed=14).save_pretrained(folder)
  write_vocab(folder)
  return folder


def _sequence_classifier(tmp_path_factory, name: str, seed: int, num_labels: int):
  folder = tmp_path_factory.mktemp("serve_heads") / name
  random_torch_model("BertForSequenceClassification", seed=seed, num_labels=num_labels).save_pretrained(folder)
  write_vocab(folder)
  return folder


@pytest.fixture(scope="session")
def cross_encoder(tmp_path_factory):
  """A random one-label BertForSequenceClassification: a cross-encoder's shape."""
  return _sequence_classifier(tmp_path_factory, "cross", 12, 1)


@pytest.fixture(scope="session")
def classifier(tmp_path_factory):
  """A random three-label classifier."""
  return _sequence_classifier(tmp_path_factory, "classifier", 13, 3)


# Inputs of a few lengths, up to ~33 tokens, that load tests send in random mixes.
TEXTS = ["the cat sat", "a big red dog ran quickly under the blue tree", "paris", "the " * 30 + "end",
         "it was a happy day, and a sad night."]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Served:
  """`python -m jbert.serve ARGS` on a free port; `wait_ready` polls GET /health."""

  def __init__(self, *args, port: int | None = None):
    self.port = port or free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.args = [sys.executable, "-m", "jbert.serve", f"--port={self.port}", *map(str, args)]
    self.proc = subprocess.Popen(self.args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

  def wait_ready(self, timeout: float = 180.0) -> "Served":
    import httpx  # pylint: disable=import-outside-toplevel
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if self.proc.poll() is not None:
        raise AssertionError(f"jbert.serve exited {self.proc.returncode}: {self.proc.stderr.read()}")
      try:
        if httpx.get(self.url + "/health", timeout=2).status_code == 200:
          return self
      except httpx.TransportError:
        pass
      time.sleep(0.2)
    raise AssertionError(f"jbert.serve not ready in {timeout} s")

  def signal(self, sig) -> None:
    self.proc.send_signal(sig)

  def finish(self, timeout: float = 60.0) -> tuple[int, str]:
    """(exit status, stderr) once it exits."""
    _, err = self.proc.communicate(timeout=timeout)
    return self.proc.returncode, err

  def kill(self) -> None:
    if self.proc.poll() is None:
      self.proc.send_signal(signal.SIGKILL)
    self.proc.communicate(timeout=30)


@pytest.fixture
def serve():
  """Starts servers (`serve(*args)` -> Served) and kills every one still running at the end."""
  started = []

  def start(*args, port=None):
    served = Served(*args, port=port)
    started.append(served)
    return served

  yield start
  for served in started:
    served.kill()


@pytest.fixture(scope="session")
def server(bi_encoder, cross_encoder, classifier):
  """One server of the three models, shared by the tests that only send it requests: embeddings, re-ranking,
  predictions."""
  served = Served(f"--model={bi_encoder}", f"--model=rerank={cross_encoder}", f"--model=cls={classifier}",
                  "--max_batch_tokens=256")
  try:
    yield served.wait_ready()
  finally:
    served.kill()


def post(url: str, body, **kw):
  import httpx  # pylint: disable=import-outside-toplevel
  return httpx.post(url, content=json.dumps(body) if not isinstance(body, (bytes, str)) else body,
                    headers={"Content-Type": "application/json", **kw.pop("headers", {})}, timeout=60, **kw)
