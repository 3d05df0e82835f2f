r"""`jbert.embed` and `jbert.predict` end to end, packed (their default) and length-bucketed (`--nopacking`).

  python bench/packed_inference.py [--embed_sentences=20000 --predict_sentences=5000 --layers=6 --hidden=384]
                                   [--repeats=2 --text=botchan.txt --vocab=bert-base-uncased-vocab.txt]

What a user waits for: each command is run as a user runs it (`python -m jbert.embed ...`), from the interpreter's
start to its exit, every run with an empty compile cache (`JBERT_COMPILE_CACHE` set to a new folder), so compiling
is counted: packed rows compile one or two shapes a tier, the length-sorted buckets one per (batch, length). The
models are random BERTs of the given size (MiniLM-L6 by default): a sentence-transformers folder (mean pooling,
max_seq_length 256) for `jbert.embed` and a Hugging Face sequence classifier (2 labels, default max_length 128) for
`jbert.predict`; the inputs are botchan.txt's sentences (26 tokens on average). The modes alternate, `--repeats`
times each. Printed: each run's wall seconds, the medians, the speedup, and the largest difference between the
packed and bucketed outputs. The last line is a JSON object.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import inference  # noqa: E402  (bench/: the sentences and the sentence-transformers folder)

REPO = pathlib.Path(__file__).resolve().parents[1]
_EMBED_SENTENCES = flags.DEFINE_integer("embed_sentences", 20000, "Sentences jbert.embed embeds.")
_PREDICT_SENTENCES = flags.DEFINE_integer("predict_sentences", 5000, "Sentences jbert.predict classifies.")
_LAYERS = flags.DEFINE_integer("layers", 6, "Encoder layers of the random models.")
_HIDDEN = flags.DEFINE_integer("hidden", 384, "Hidden size (heads: hidden / 32).")
_REPEATS = flags.DEFINE_integer("repeats", 2, "Runs of each command in each mode.")


def classifier(folder: str, vocab: str, layers: int, hidden: int) -> str:
  """A random Hugging Face BertForSequenceClassification (2 labels) with its tokenizer."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  # `vocab=`: under transformers 5, `vocab_file=` builds a 5-piece tokenizer that reads every word as [UNK].
  tokenizer = transformers.BertTokenizerFast(vocab=vocab, do_lower_case=True)
  with open(vocab, encoding="utf-8") as f:
    if tokenizer.vocab_size != sum(1 for _ in f):
      raise SystemExit(f"the tokenizer read {tokenizer.vocab_size} pieces from {vocab}; the bench would time [UNK]s.")
  config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=hidden // 32, intermediate_size=4 * hidden, num_labels=2)
  transformers.BertForSequenceClassification(config).save_pretrained(folder)
  tokenizer.save_pretrained(folder)
  return folder


def run(command: list[str], cache_root: str) -> float:
  """Wall seconds of `python -m COMMAND` with an empty compile cache."""
  env = dict(os.environ, JBERT_COMPILE_CACHE=tempfile.mkdtemp(dir=cache_root))
  start = time.perf_counter()
  done = subprocess.run([sys.executable, "-m", *command], cwd=REPO, env=env, capture_output=True, text=True)
  seconds = time.perf_counter() - start
  if done.returncode:
    raise SystemExit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
  return seconds


def main(argv):
  del argv
  work = tempfile.mkdtemp(prefix="packed_inference.")
  texts = inference.sentences(inference._TEXT.value, _EMBED_SENTENCES.value, 0)  # pylint: disable=protected-access
  source = os.path.join(work, "sentences.txt")
  with open(source, "w", encoding="utf-8") as f:
    f.write("".join(" ".join(t.split()) + "\n" for t in texts))
  few = os.path.join(work, "few.txt")
  with open(few, "w", encoding="utf-8") as f:
    f.write("".join(" ".join(t.split()) + "\n" for t in texts[:_PREDICT_SENTENCES.value]))
  vocab = inference._VOCAB.value  # pylint: disable=protected-access
  inference.write_model(os.path.join(work, "embedder"), vocab, _LAYERS.value, _HIDDEN.value, _HIDDEN.value // 32,
                        256, 0)
  model = classifier(os.path.join(work, "classifier"), vocab, _LAYERS.value, _HIDDEN.value)
  commands = {
      "embed": (["jbert.embed", f"--model={work}/embedder/st", f"--input={source}", "--noprogress"], ".npy",
                len(texts)),
      "predict": (["jbert.predict", f"--model={model}", f"--input={few}"], ".jsonl", _PREDICT_SENTENCES.value)}
  print(f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; random BERT {_LAYERS.value}x{_HIDDEN.value}",
        flush=True)
  results = {}
  for name, (command, suffix, count) in commands.items():
    seconds = {"packed": [], "bucketed": []}
    outputs = {}
    for _ in range(_REPEATS.value):
      for mode, flag in (("packed", "--packing"), ("bucketed", "--nopacking")):
        outputs[mode] = os.path.join(work, f"{name}.{mode}{suffix}")
        seconds[mode].append(run([*command, f"--output={outputs[mode]}", flag], work))
        print(f"{name} {mode}: {seconds[mode][-1]:.1f} s for {count:,} inputs", flush=True)
    if suffix == ".npy":
      diff = float(np.abs(np.load(outputs["packed"]) - np.load(outputs["bucketed"])).max())
    else:
      rows = [[json.loads(line) for line in open(outputs[m], encoding="utf-8")] for m in ("packed", "bucketed")]
      diff = max(abs(a["probabilities"][k] - b["probabilities"][k]) for a, b in zip(*rows) for k in a["probabilities"])
    median = {m: statistics.median(s) for m, s in seconds.items()}
    results[name] = {"inputs": count, "packed_s": median["packed"], "bucketed_s": median["bucketed"],
                     "speedup": median["bucketed"] / median["packed"], "max_abs_diff": diff, "runs": seconds}
    print(f"{name}: packed {median['packed']:.1f} s, bucketed {median['bucketed']:.1f} s, "
          f"{results[name]['speedup']:.2f}x sooner; max |diff| {diff:.1e}", flush=True)
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
