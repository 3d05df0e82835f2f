r"""Embedding servers under closed-loop load on loopback: `python -m jbert.serve`, sentence-transformers' `encode`
behind the same ASGI app (jbert.serve's routes and queue, its own batching: `encode(texts, batch_size=32)` of what
the queue holds), and infinity (`infinity_emb v2`, torch engine on the CPU) where its Python is given.

  python bench/serve.py [--models=minilm_6x384,bert_base --lengths=short,long --concurrency=1,8,32 --seconds=10]
                        [--systems=jbert,st,infinity --infinity_python=/tmp/infvenv/bin/python]
                        [--text=botchan.txt --vocab=bert-base-uncased-vocab.txt]   (../shared/data)

Each model is a random BERT of that size saved as a sentence-transformers folder laid out as all-MiniLM-L6-v2
(mean pooling, Normalize, max_seq_length 256; bert_base 512), which every system loads. Short inputs are
botchan.txt's sentences of at most 32 tokens; long ones are consecutive sentences joined to 216..250 tokens. Each
system's server starts, its embeddings of 16 inputs are checked against jbert.embed's (`max_abs_diff`); every
system's server is up at once and the points are interleaved (each (inputs, clients)
point for every system in turn), each `--seconds` of closed loop: `concurrency` clients, each posting one input
and waiting for its answer, over and over. Reported per point: inputs/s, tokens/s (the inputs' tokens, counted once
by one tokenizer), p50/p99 latency in ms, the server's CPU time per answered input (`cpu_ms_per_input`: all its
threads and children; what an input costs whatever share of the cores the server got), and the 1-minute load
average before and after (other processes share this host). PyTorch computes with `--threads` threads;
jbert.serve with its defaults (one single-threaded compute worker a core).
The last line is one JSON object.

infinity-emb 0.0.78 pins transformers 4 and sentence-transformers 3, so it lives in a venv of its own that keeps
this host's CPU torch: `python -m venv --system-site-packages /tmp/infvenv && /tmp/infvenv/bin/pip install
'infinity-emb[server,torch]==0.0.78' -c <(echo torch==2.13.0)` (no CUDA package comes with it).
`python bench/serve.py --serve_st=FOLDER --port=P` is the sentence-transformers server the bench starts.
"""
from __future__ import annotations

import asyncio
import copy
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import time

from absl import app
from absl import flags
import numpy as np

# `python bench/serve.py` from a checkout, without installing jbert.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import inference as embed_bench  # noqa: E402  (bench/inference.py: the model folders and the corpus)

_MODELS = embed_bench._MODELS  # pylint: disable=protected-access  (its --models, --text and --vocab are ours)
_LENGTHS = flags.DEFINE_list("lengths", ["short", "long"], "Inputs: short (<= 32 tokens) and/or long (~240).")
_CONCURRENCY = flags.DEFINE_list("concurrency", ["1", "8", "32"], "Closed-loop clients per point.")
_SECONDS = flags.DEFINE_float("seconds", 10.0, "Load per point.")
_SYSTEMS = flags.DEFINE_list("systems", ["jbert", "st", "infinity"], "Servers: jbert, st, infinity.")
_INFINITY = flags.DEFINE_string("infinity_python", None, "A Python with infinity-emb installed (its own venv: it "
                                "pins older transformers and sentence-transformers); without it infinity is skipped.")
_MAX_BATCH_TOKENS = flags.DEFINE_integer("max_batch_tokens", 8192, "jbert.serve --max_batch_tokens.")
_SERVE_ST = flags.DEFINE_string("serve_st", None, "Serve this folder with sentence-transformers (the bench's child).")
_PORT = flags.DEFINE_integer("port", 18600, "First port the servers take.")
_THREADS = flags.DEFINE_integer("threads", 1, "PyTorch's threads in the st and infinity servers (0: PyTorch's "
                                 "default, one a core). On this 2-core host under other load, 2 threads made a "
                                 "one-sentence encode 20x slower (279 ms against 14 ms): each op waits for both "
                                 "threads to be scheduled. jbert.serve runs as it does by default: on a CPU host, "
                                 "one compute worker process a core, each on one XLA:CPU thread.")

SHORT_MAX, LONG_TOKENS, LONG_MAX = 32, 240, 250
MAX_LENGTH = {"bert_base": 512}  # else 256, as all-MiniLM-L6-v2


# -- sentence-transformers behind jbert.serve's app --

class SentenceTransformersModel:
  """jbert.serve's embedding-model interface over `SentenceTransformer.encode`."""
  kind = "embedding"

  def __init__(self, name: str, path: str):
    from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
    self.name, self.path = name, path
    self.st = SentenceTransformer(path, device="cpu")
    # transformers 5 tokenizers keep padding/truncation as state on the Rust object: counting tokens in the app's
    # threads with the batcher's tokenizer would reset `encode`'s padding mid-batch (a ValueError, seen under load).
    self.counter = copy.deepcopy(self.st.tokenizer)
    self.counter_lock = threading.Lock()
    self.max_length = self.st.max_seq_length
    self.dim = self.st.get_embedding_dimension()
    self.normalize = any(type(m).__name__ == "Normalize" for m in self.st)

  def describe(self) -> dict:
    return {"kind": self.kind, "dimensions": self.dim, "endpoints": ["/v1/embeddings"]}

  def features(self, inputs, *, max_input_tokens: int, truncate: bool) -> list[tuple[str, int]]:
    del max_input_tokens, truncate  # encode truncates to max_seq_length
    with self.counter_lock:
      ids = self.counter(list(inputs), truncation=True, max_length=self.max_length)["input_ids"]
    return [(text, len(i)) for text, i in zip(inputs, ids)]

  def work(self, features):
    from jbert.serve.models import Work  # pylint: disable=g-import-not-at-top
    return Work([t for t, _ in features], len(features), sum(n for _, n in features), group="st")

  def compute(self, works):
    vectors = self.st.encode([t for w in works for t in w.payload], batch_size=32, convert_to_numpy=True,
                             show_progress_bar=False).astype(np.float32)
    bounds = np.cumsum([0] + [w.inputs for w in works])
    return [vectors[bounds[k]:bounds[k + 1]] for k in range(len(works))]

  def layout(self, works):
    del works


def serve_st(path: str, port: int) -> None:
  import uvicorn  # pylint: disable=g-import-not-at-top
  from jbert.serve import app as app_lib  # pylint: disable=g-import-not-at-top
  from jbert.serve.batcher import Batcher  # pylint: disable=g-import-not-at-top
  from jbert.serve.metrics import Metrics  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  if _THREADS.value:
    torch.set_num_threads(_THREADS.value)
  model = SentenceTransformersModel("model", path)
  metrics = Metrics()
  batcher = Batcher(max_batch_tokens=_MAX_BATCH_TOKENS.value, max_wait_s=0.002, max_queue=2048, metrics=metrics)
  server = app_lib.Server({"model": model}, batcher, metrics, max_input_tokens={"model": model.max_length})
  server.ready = True
  uvicorn.run(app_lib.build(server), host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- the load --

def percentiles(latencies: list[float]) -> tuple[float, float]:
  """(p50, p99) in milliseconds."""
  if not latencies:
    return float("nan"), float("nan")
  p50, p99 = np.percentile(np.asarray(latencies) * 1000, [50, 99])
  return round(float(p50), 2), round(float(p99), 2)


async def closed_loop(url: str, model: str, texts: list[str], lengths: list[int], concurrency: int,
                      seconds: float) -> dict:
  """`concurrency` clients posting one input each until `seconds` have passed; answers that are not 200 count.
  Tokens are the inputs' `lengths` (one tokenizer for every system: their usage fields count differently)."""
  import httpx  # pylint: disable=g-import-not-at-top
  latencies, tokens, errors, first_error = [], 0, 0, None
  deadline = time.monotonic() + seconds

  async def client(k: int, http):
    nonlocal tokens, errors, first_error
    i = k
    while time.monotonic() < deadline:
      start = time.monotonic()
      answer = await http.post(url + "/embeddings", json={"model": model, "input": [texts[i % len(texts)]]})
      if answer.status_code != 200:
        errors += 1
        first_error = first_error or f"{answer.status_code} {answer.text[:300]}"
        continue
      latencies.append(time.monotonic() - start)
      tokens += lengths[i % len(texts)]
      i += concurrency

  limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
  async with httpx.AsyncClient(limits=limits, timeout=300) as http:
    start = time.monotonic()
    await asyncio.gather(*(client(k, http) for k in range(concurrency)))
    took = time.monotonic() - start
  p50, p99 = percentiles(latencies)
  return {"inputs_s": round(len(latencies) / took, 1), "tokens_s": round(tokens / took, 1), "p50_ms": p50,
          "p99_ms": p99, "requests": len(latencies), "errors": errors, "first_error": first_error}


def inputs(tokenizer, kind: str) -> list[str]:
  """Short sentences of botchan.txt (<= SHORT_MAX tokens), or consecutive ones joined to 216..250 tokens (under
  every model's 256: no system truncates)."""
  found = embed_bench.sentences(embed_bench._TEXT.value, 4000, seed=0)  # pylint: disable=protected-access
  counts = [len(ids) for ids in tokenizer.batch_ids(found)]
  if kind == "short":
    return [s for s, n in zip(found, counts) if n + 2 <= SHORT_MAX][:1000]
  out, joined, n = [], [], 2
  for s, c in zip(found, counts):
    if n + c > LONG_MAX:
      joined, n = [], 2  # a sentence that would overshoot starts over
    joined.append(s)
    n += c
    if n >= 0.9 * LONG_TOKENS:
      out.append(" ".join(joined))
      joined, n = [], 2
  return out[:200]


def legacy_copy(folder: str, dest: str, max_length: int) -> str:
  """`folder` as all-MiniLM-L6-v2 is laid out (Transformer, mean Pooling, Normalize) in the format every system
  reads (infinity pins sentence-transformers 3.4): module types of `sentence_transformers.models`, the pooling as
  pooling_mode_* booleans, max_seq_length in sentence_bert_config.json. The same weights and tokenizer."""
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copytree(folder, dest)
  with open(os.path.join(dest, "1_Pooling", "config.json"), encoding="utf-8") as f:
    width = json.load(f)["embedding_dimension"]
  modes = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens")
  with open(os.path.join(dest, "1_Pooling", "config.json"), "w", encoding="utf-8") as f:
    json.dump({"word_embedding_dimension": width, **{f"pooling_mode_{m}": m == "mean_tokens" for m in modes}}, f)
  with open(os.path.join(dest, "sentence_bert_config.json"), "w", encoding="utf-8") as f:
    json.dump({"max_seq_length": max_length, "do_lower_case": False}, f)
  with open(os.path.join(dest, "modules.json"), "w", encoding="utf-8") as f:
    json.dump([{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
               {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}], f)
  os.makedirs(os.path.join(dest, "2_Normalize"))
  return dest


def start(system: str, folder: str, port: int) -> subprocess.Popen:
  if system == "jbert":
    args = [sys.executable, "-m", "jbert.serve", f"--model=model={folder}", f"--port={port}",
            f"--max_batch_tokens={_MAX_BATCH_TOKENS.value}"]
  elif system == "st":
    args = [sys.executable, __file__, f"--serve_st={folder}", f"--port={port}",
            f"--max_batch_tokens={_MAX_BATCH_TOKENS.value}", f"--threads={_THREADS.value}"]
  else:
    args = [_INFINITY.value, "-m", "infinity_emb.cli", "v2", f"--model-id={folder}", "--served-model-name=model",
            f"--port={port}", "--engine=torch", "--device=cpu", "--batch-size=32", "--no-bettertransformer"]
  # infinity's transformers 4 would import this host's TensorFlow (built for numpy 2) and phone home otherwise.
  env = dict(os.environ, USE_TF="0", USE_FLAX="0", USE_JAX="0", INFINITY_ANONYMOUS_USAGE_STATS="0",
             DO_NOT_TRACK="1")
  if _THREADS.value and system == "infinity":
    env.update(OMP_NUM_THREADS=str(_THREADS.value), MKL_NUM_THREADS=str(_THREADS.value))
  return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)


def wait_ready(proc: subprocess.Popen, url: str, timeout: float = 900) -> None:
  import httpx  # pylint: disable=g-import-not-at-top
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    if proc.poll() is not None:
      raise RuntimeError(f"the server exited {proc.returncode}: {proc.stderr.read()[-2000:]}")
    try:
      if httpx.get(url + "/health", timeout=2).status_code == 200:
        return
    except httpx.TransportError:
      pass
    time.sleep(0.5)
  raise RuntimeError(f"{url} not ready in {timeout} s")


def max_abs_diff(url: str, texts: list[str], reference: np.ndarray) -> float:
  import httpx  # pylint: disable=g-import-not-at-top
  body = httpx.post(url + "/embeddings", json={"model": "model", "input": texts}, timeout=300).json()
  got = np.array([d["embedding"] for d in sorted(body["data"], key=lambda d: d["index"])], np.float32)
  return float(np.abs(got - reference).max())


def bench_model(name: str, port: int) -> list[dict]:
  import jbert  # pylint: disable=g-import-not-at-top
  from jbert.inference import load_model  # pylint: disable=g-import-not-at-top
  layers, hidden, heads = embed_bench.MODELS[name]
  rows = []
  with tempfile.TemporaryDirectory(prefix=f"jbert-serve-bench-{name}-") as root:
    embed_bench.write_model(root, embed_bench._VOCAB.value, layers, hidden, heads,  # pylint: disable=protected-access
                            MAX_LENGTH.get(name, 256), seed=0)
    folder = legacy_copy(os.path.join(root, "st"), os.path.join(root, "model"), MAX_LENGTH.get(name, 256))
    tokenizer = load_model(folder).tokenizer
    texts = {kind: inputs(tokenizer, kind) for kind in _LENGTHS.value}
    limit = MAX_LENGTH.get(name, 256)
    lengths = {kind: [min(len(ids) + 2, limit) for ids in tokenizer.batch_ids(texts[kind])] for kind in texts}
    check = [t for kind in _LENGTHS.value for t in texts[kind][:8]]
    reference = jbert.embed(check, folder)
    systems = [x for x in _SYSTEMS.value if x != "infinity" or _INFINITY.value]
    if len(systems) < len(_SYSTEMS.value):
      print("infinity skipped: no --infinity_python", file=sys.stderr)
    # Every server up at once, then each point for every system in turn: the host's load (other jobs share it)
    # drifts over minutes, and interleaving spreads the drift over the systems instead of onto one of them.
    # An idle server waits on its socket and costs nothing while another is measured.
    procs, urls, ready = {}, {}, {}
    try:
      for k, system in enumerate(systems):
        urls[system] = f"http://127.0.0.1:{port + 1 + k}"
        procs[system] = start(system, folder, port + 1 + k)
        began = time.monotonic()
        wait_ready(procs[system], urls[system])  # one at a time: a warm-up is not slowed by another's
        ready[system] = round(time.monotonic() - began, 1)
      diffs = {system: max_abs_diff(urls[system], check, reference) for system in systems}
      for kind in _LENGTHS.value:
        for concurrency in map(int, _CONCURRENCY.value):
          for system in systems:
            load_before, cpu_before = os.getloadavg()[0], cpu_seconds(procs[system].pid)
            point = asyncio.run(closed_loop(urls[system], "model", texts[kind], lengths[kind], concurrency,
                                            _SECONDS.value))
            # CPU time per answered input: what a point costs the server whatever share of the cores it got.
            cpu = cpu_seconds(procs[system].pid) - cpu_before
            point["cpu_ms_per_input"] = round(1000 * cpu / max(point["requests"], 1), 2)
            row = {"model": name, "system": system, "inputs": kind, "concurrency": concurrency, **point,
                   "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
                   "max_abs_diff": diffs[system], "ready_s": ready[system]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
      for proc in procs.values():
        proc.terminate()
      for proc in procs.values():
        try:
          proc.wait(60)
        except subprocess.TimeoutExpired:
          proc.kill()
  return rows


def main(argv):
  del argv
  import logging  # pylint: disable=g-import-not-at-top
  logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
  if _SERVE_ST.value:
    serve_st(_SERVE_ST.value, _PORT.value)
    return
  rows, port = [], _PORT.value
  for name in _MODELS.value:
    rows += bench_model(name, port)
    port += 10
  print(json.dumps({"cpu": cpu_model(), "seconds_per_point": _SECONDS.value, "points": rows}))


def cpu_seconds(pid: int) -> float:
  """User + system CPU seconds of process `pid` and its children so far (every thread)."""
  import psutil  # pylint: disable=g-import-not-at-top
  total = 0.0
  try:
    root = psutil.Process(pid)
    for proc in [root, *root.children(recursive=True)]:
      times = proc.cpu_times()
      total += times.user + times.system
  except psutil.Error:
    pass
  return total


def cpu_model() -> str:
  try:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines():
      if line.startswith("Model name:"):
        return line.split(":", 1)[1].strip()
  except (OSError, subprocess.CalledProcessError):
    pass
  return "unknown"


if __name__ == "__main__":
  app.run(main)
