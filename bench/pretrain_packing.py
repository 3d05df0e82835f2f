r"""Pretraining on short documents with and without packed rows: real tokens/s and padding, from `run.py`.

  python bench/pretrain_packing.py --out=/tmp/packing [--steps=300 --seq=128 --batch=32]

The corpus is botchan.txt's sentences (split by `sentencex`, as `data.source=text` splits them) grouped into
documents of 1 to 3 sentences, blank lines between them: the kind of corpus where BERT's one-sequence rows are
mostly padding (the issue measured 46 real tokens of 128). Each mode is the command a user runs, the demo config
on that text with bert-base-uncased's vocabulary:

  python run.py --config=configs/tiny.py --workdir=W --compile_cache=off --config.data.source=text
      --config.data.text_files=CORPUS --config.data.vocab=VOCAB --config.data.max_seq_length=SEQ
      --config.data.max_predictions_per_seq=... --config.data.packing=True|False --config.batch_size=BATCH ...

at the same batch (rows) and sequence length, every run from an empty compile cache. Reported per mode: the
step-weighted mean of the logged `train/tokens_per_sec` (real tokens; the first step, mostly compilation, is
left out by the trainer), `train/padding_fraction` and `train/mfu`, steps/s, the final loss, the command's wall
time, and what `python -m jbert.data --stats` says of the same data (sequences per row, mean sequence tokens).
The last line printed is one JSON object (also `--out/results.json`) with the CPU's name and flags.
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import time

from absl import app
from absl import flags
import numpy as np
import sentencex

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"
MODES = {"padded": False, "packed": True}

_OUT = flags.DEFINE_string("out", None, "Directory for the corpus, the runs and results.json.")
_TEXT = flags.DEFINE_string("text", str(SHARED / "botchan.txt"), "Source text of the sentences.")
_VOCAB = flags.DEFINE_string("vocab", str(SHARED / "bert-base-uncased-vocab.txt"), "WordPiece vocab.txt.")
_STEPS = flags.DEFINE_integer("steps", 300, "Training steps of each run.")
_SEQ = flags.DEFINE_integer("seq", 128, "data.max_seq_length (max_predictions_per_seq follows BERT's 15%).")
_BATCH = flags.DEFINE_integer("batch", 32, "Global batch: rows of --seq tokens.")
_MODES = flags.DEFINE_list("modes", list(MODES), f"Any of {', '.join(MODES)}.")
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the documents' sizes and of the runs.")


def short_documents(text: str, seed: int) -> list[list[str]]:
  """The sentences of the text between Project Gutenberg's START and END lines, in order, as documents of 1 to 3
  sentences (sizes drawn uniformly)."""
  start, end = text.find("*** START OF"), text.find("*** END OF")
  body = text[text.find("\n", start) + 1 if start >= 0 else 0:end if end >= 0 else len(text)]
  paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", body)]
  sentences = [s.strip() for p in paragraphs if p for s in sentencex.segment("en", p) if s.strip()]
  rng = np.random.default_rng(seed)
  documents, i = [], 0
  while i < len(sentences):
    size = int(rng.integers(1, 4))
    documents.append(sentences[i:i + size])
    i += size
  return documents


def write_corpus(documents: list[list[str]], path: pathlib.Path) -> None:
  """Plain text as `data.source=text` reads it: a document's sentences on one line, blank lines between."""
  path.write_text("\n\n".join(" ".join(d) for d in documents) + "\n", encoding="utf-8")


def settings(corpus: str, vocab: str, seq: int, batch: int, steps: int, packing: bool, seed: int) -> dict[str, str]:
  """The `--config.KEY=VALUE` settings of one run of configs/tiny.py."""
  return {"data.source": "text", "data.text_files": corpus, "data.vocab": vocab, "data.max_seq_length": str(seq),
          "data.max_predictions_per_seq": str(-(-15 * seq // 100)), "data.packing": str(packing),
          "batch_size": str(batch), "total_steps": str(steps), "log_every_steps": str(max(1, steps // 10)),
          "eval_every_steps": "0", "checkpoint_every_steps": "0", "seed": str(seed)}


def run_command(workdir: str, config: dict[str, str]) -> list[str]:
  return [sys.executable, "run.py", "--config=configs/tiny.py", f"--workdir={workdir}", "--compile_cache=off",
          *(f"--config.{k}={v}" for k, v in config.items())]


def data_command(config: dict[str, str], batches: int = 20) -> list[str]:
  keys = {k: v for k, v in config.items() if k.startswith("data.") or k in ("batch_size", "seed")}
  return [sys.executable, "-m", "jbert.data", "--config=configs/tiny.py", "--stats", f"--batches={batches}",
          *(f"--config.{k}={v}" for k, v in keys.items())]


def logged_means(workdir: pathlib.Path) -> dict[str, float]:
  """Step-weighted means of the logged train/ rates over the windows after the first step, and the last loss."""
  lines = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  train = [l for l in lines if "train/tokens_per_sec" in l]
  steps = [l["step"] for l in train]
  weights = [b - a for a, b in zip([1, *steps], steps)]
  out = {key: sum(w * l[f"train/{key}"] for w, l in zip(weights, train)) / sum(weights)
         for key in ("tokens_per_sec", "padding_fraction", "mfu", "steps_per_sec")}
  out["final_loss"] = train[-1]["train/loss"]
  return out


def cpu() -> dict[str, str]:
  try:
    info = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
  except (OSError, subprocess.CalledProcessError):
    return {}
  fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
  wanted = ("avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile")
  flags_present = [f for f in wanted if f in fields.get("Flags", "").split()]
  return {"model": fields.get("Model name", "").strip(), "cpus": fields.get("CPU(s)", "").strip(),
          "flags": " ".join(flags_present)}


def main(argv):
  del argv
  out = pathlib.Path(_OUT.value or "/tmp/jbert_pretrain_packing")
  out.mkdir(parents=True, exist_ok=True)
  documents = short_documents(pathlib.Path(_TEXT.value).read_text(encoding="utf-8"), _SEED.value)
  corpus = out / "short_documents.txt"
  write_corpus(documents, corpus)
  results = {"cpu": cpu(), "documents": len(documents), "seq": _SEQ.value, "batch": _BATCH.value,
             "steps": _STEPS.value}
  env = {**os.environ, "JBERT_COMPILE_CACHE": "off", "JAX_PLATFORMS": "cpu"}
  for mode in _MODES.value:
    config = settings(str(corpus), _VOCAB.value, _SEQ.value, _BATCH.value, _STEPS.value, MODES[mode], _SEED.value)
    workdir = out / mode
    subprocess.run(["rm", "-rf", str(workdir)], check=True)
    command = run_command(str(workdir), config)
    load = os.getloadavg()[0]
    began = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - began
    if done.returncode:
      raise SystemExit(f"{mode}: {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    stats = subprocess.run(data_command(config), cwd=REPO, env=env, capture_output=True, text=True, check=True)
    data = json.loads(stats.stdout.strip().splitlines()[-1])
    results[mode] = {**logged_means(workdir), "wall_s": wall, "load_before": load,
                     "command": " ".join(command[1:]).replace(str(REPO) + "/", ""),
                     "data_padding_fraction": data["padding_fraction"],
                     "sequences_per_row": data["sequences_per_row"],
                     "mean_sequence_tokens": data["mean_sequence_tokens"]}
    print(f"{mode}: {results[mode]['tokens_per_sec']:.0f} real tokens/s, padding "
          f"{results[mode]['padding_fraction']:.3f}, {results[mode]['sequences_per_row']:.2f} sequences/row, "
          f"{wall:.0f} s", flush=True)
  if "padded" in results and "packed" in results:
    results["real_tokens_per_s_ratio"] = results["packed"]["tokens_per_sec"] / results["padded"]["tokens_per_sec"]
  (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
