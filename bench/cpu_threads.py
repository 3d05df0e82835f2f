r"""CPU time an input of jbert's serving Runner on XLA:CPU's default thread pool (one thread a core) and on one
thread (`NPROC=1`, as `jbert.serve`'s compute workers run), each in a fresh process, in turn.

  python bench/cpu_threads.py [--model=DIR --inputs=32 --tokens=250 --rounds=3 --repeats=5]

The model defaults to a random all-MiniLM-L6-v2-sized BERT (6 layers, 384 wide). Each process embeds `--inputs`
random inputs of `--tokens` tokens through the Runner as `jbert.serve` sets it up on a CPU (packed rows of 32, 128
and 256 tokens, 512 tokens a call), `--repeats` times after one warm call; reported per configuration and round:
the best repeat's wall and CPU milliseconds an input, and whether the embeddings equal the first configuration's bit
for bit. The last line is one JSON object.
"""
from __future__ import annotations

import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

# `python bench/cpu_threads.py` from a checkout, without installing jbert.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

_MODEL = flags.DEFINE_string("model", None, "A sentence-transformers or Hugging Face BERT folder (default: random).")
_INPUTS = flags.DEFINE_integer("inputs", 32, "Inputs a call.")
_TOKENS = flags.DEFINE_integer("tokens", 250, "Tokens an input, [CLS] and [SEP] included.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Times each configuration runs, in turn.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls a process; the best counts.")
_CHILD = flags.DEFINE_string("child", None, "Internal: run one measurement, write its JSON and embeddings here.")

CONFIGS = {"default pool": {}, "one thread": {"NPROC": "1"}}


def _cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_SELF)
  return usage.ru_utime + usage.ru_stime


def child(out: str) -> None:
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jbert.inference import embedding  # pylint: disable=g-import-not-at-top
  from jbert.serve import models  # pylint: disable=g-import-not-at-top
  embedder = embedding.Embedder(_MODEL.value, pooling="mean", batch_size=32, buckets=models.row_lengths(256))
  embedder.runner.step_tokens = models.CPU_STEP_TOKENS
  rng = np.random.default_rng(0)
  n = _TOKENS.value
  tokenizer, vocab = embedder.model.tokenizer, embedder.config.vocab_size
  features = [{"input_ids": [tokenizer.cls_id, *rng.integers(vocab // 4, vocab, n - 2).tolist(), tokenizer.sep_id],
               "token_type_ids": [0] * n} for _ in range(_INPUTS.value)]
  first = embedder.runner.run(features, progress=False)
  best = []
  for _ in range(_REPEATS.value):
    wall, cpu = time.perf_counter(), _cpu()
    embedder.runner.run(features, progress=False)
    best.append((time.perf_counter() - wall, _cpu() - cpu))
  wall, cpu = min(best)
  np.save(out + ".npy", np.stack([r["embedding"] for r in first]))
  pathlib.Path(out).write_text(json.dumps({"wall_ms_per_input": round(wall * 1000 / len(features), 1),
                                           "cpu_ms_per_input": round(cpu * 1000 / len(features), 1)}))


def random_model(folder: str) -> str:
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import BertConfig, BertModel  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                      intermediate_size=1536, max_position_embeddings=512)
  BertModel(config).save_pretrained(folder)
  with open(os.path.join(folder, "vocab.txt"), "w") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(30517)]))
  return folder


def main(argv):
  del argv
  if _CHILD.value:
    return child(_CHILD.value)
  import numpy as np  # pylint: disable=g-import-not-at-top
  with tempfile.TemporaryDirectory() as tmp:
    model = _MODEL.value or random_model(os.path.join(tmp, "model"))
    points, reference = [], None
    for round_ in range(_ROUNDS.value):
      for name, env in CONFIGS.items():
        out = os.path.join(tmp, f"{round_}-{len(points)}")
        subprocess.run([sys.executable, __file__, f"--child={out}", f"--model={model}", f"--inputs={_INPUTS.value}",
                        f"--tokens={_TOKENS.value}", f"--repeats={_REPEATS.value}"],
                       env={**os.environ, "JAX_NUM_CPU_DEVICES": "1", **env}, check=True)
        vectors = np.load(out + ".npy")
        reference = vectors if reference is None else reference
        point = {"config": name, "round": round_, **json.loads(pathlib.Path(out).read_text()),
                 "bitwise_equal": bool((vectors == reference).all()), "load": round(os.getloadavg()[0], 2)}
        print(point, flush=True)
        points.append(point)
  print(json.dumps({"inputs": _INPUTS.value, "tokens": _TOKENS.value, "points": points}))


if __name__ == "__main__":
  app.run(main)
