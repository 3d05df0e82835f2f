r"""Sentence embeddings on this host: jbert (`jbert.embed`'s Embedder) beside sentence-transformers (PyTorch).

  python bench/inference.py [--sentences=20000 --models=minilm_6x384,bert_base --batch_size=32 --blocks=4]
                            [--rounds=1 --text=botchan.txt --vocab=bert-base-uncased-vocab.txt]   (../shared/data)
                            [--nopacking]

The corpus is botchan.txt split into sentences (sentencex), repeated up to `--sentences` and shuffled, so every
block holds the same mix of short and long sentences. For each model a random BERT of that size is saved as a
sentence-transformers folder (mean pooling, `--max_length`); both frameworks load that folder and embed the same
sentences with the same batch size in float32; jbert makes one XLA:CPU device per core first, as its commands do.
The sentences are cut into `--blocks` blocks, one embedding call each. A first pass over the blocks is timed on
its own (`*_first_pass_s`): jbert compiles each new shape there, once per process: packed (the default, as
`jbert.embed`), rows of `--max_length` tokens, `--batch_size` rows a batch, one or two shapes a call; with
`--nopacking` each (batch, bucket length) shape of the length-sorted sentences. Then
`--rounds` timed passes, alternating the frameworks block by block (who goes first alternates too), so load from
other processes hits both alike; rates are sentences over the summed block times and the per-block rates give the
spread. The embeddings of the first pass are compared (`max_abs_diff`). The last line is a JSON object: one entry
per model, and `jbert_sent_s, torch_sent_s, speedup_vs_torch` over all models together.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import sys
import tempfile

from absl import app
from absl import flags
import numpy as np

# `python bench/inference.py` from a checkout, without installing jbert.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import timing  # noqa: E402  (bench/)
from jbert.inference import Embedder, load_model, runner  # noqa: E402

_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
MODELS = {  # name: (layers, hidden, heads)
    "minilm_6x384": (6, 384, 12),
    "bert_base": (12, 768, 12),
    "tiny_2x64": (2, 64, 4),  # Not timed by default: a quick check that the script works end to end.
}
DEFAULT_MODELS = ["minilm_6x384", "bert_base"]

_TEXT = flags.DEFINE_string("text", str(_DATA / "botchan.txt"), "Plain-text corpus, split into sentences.")
_VOCAB = flags.DEFINE_string("vocab", str(_DATA / "bert-base-uncased-vocab.txt"), "WordPiece vocab.txt.")
_SENTENCES = flags.DEFINE_integer("sentences", 20000, "Timed sentences per framework and model.")
_BLOCKS = flags.DEFINE_integer("blocks", 4, "Blocks (calls) the sentences are embedded in, alternating frameworks.")
_ROUNDS = flags.DEFINE_integer("rounds", 1, "Timed passes over the blocks after the first pass.")
_BATCH = flags.DEFINE_integer("batch_size", 32, "Sentences per batch, both frameworks.")
_MAX_LENGTH = flags.DEFINE_integer("max_length", 256, "max_seq_length of the sentence-transformers folders.")
_MODELS = flags.DEFINE_list("models", DEFAULT_MODELS, f"Models to time: {', '.join(MODELS)}.")
_SEED = flags.DEFINE_integer("seed", 0, "Weights and sentence order.")
_PACKING = flags.DEFINE_bool("packing", True, "jbert packs the sentences (its default); --nopacking buckets them.")


def sentences(path: str, count: int, seed: int) -> list[str]:
  """`count` sentences of the corpus (repeated as needed), shuffled."""
  from sentencex import segment  # pylint: disable=g-import-not-at-top
  with open(path, encoding="utf-8") as f:
    text = " ".join(f.read().split())
  found = [s.strip() for s in segment("en", text) if s.strip()]
  if not found:
    raise app.UsageError(f"{path} holds no sentences.")
  picked = [found[i % len(found)] for i in range(count)]
  np.random.default_rng(seed).shuffle(picked)
  return picked


def write_model(folder: str, vocab: str, layers: int, hidden: int, heads: int, max_length: int, seed: int) -> None:
  """A random BERT of this size saved as a sentence-transformers folder with mean pooling."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from sentence_transformers import SentenceTransformer, models  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  tokenizer = transformers.BertTokenizer(vocab=vocab)
  config = transformers.BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, intermediate_size=4 * hidden)
  source = os.path.join(folder, "source")
  transformers.BertModel(config).save_pretrained(source)
  tokenizer.save_pretrained(source)
  transformer = models.Transformer(source, max_seq_length=max_length)
  pooling = models.Pooling(hidden, pooling_mode="mean")
  SentenceTransformer(modules=[transformer, pooling], device="cpu").save(os.path.join(folder, "st"))


def bench_model(name: str, texts: list[str]) -> dict[str, float]:
  import torch  # pylint: disable=g-import-not-at-top
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  layers, hidden, heads = MODELS[name]
  with tempfile.TemporaryDirectory(prefix=f"jbert-bench-{name}-") as folder:
    write_model(folder, _VOCAB.value, layers, hidden, heads, _MAX_LENGTH.value, _SEED.value)
    st_model = SentenceTransformer(os.path.join(folder, "st"), device="cpu")
    embedder = Embedder(load_model(os.path.join(folder, "st")), batch_size=_BATCH.value, packing=_PACKING.value)
  batch = _BATCH.value
  frameworks = {
      "jbert": lambda xs: embedder(xs, progress=False),
      "torch": lambda xs: st_model.encode(xs, batch_size=batch, convert_to_numpy=True, show_progress_bar=False),
  }
  blocks = [[texts[j] for j in rows] for rows in np.array_split(np.arange(len(texts)), _BLOCKS.value)]
  first = {k: 0.0 for k in frameworks}  # The first pass: jbert compiles each new shape in it.
  diff = 0.0
  for block in blocks:
    outs = {}
    for k, fn in frameworks.items():
      seconds, outs[k] = timing.timed(fn, block)
      first[k] += seconds
    diff = max(diff, float(np.abs(outs["jbert"] - outs["torch"]).max()))
  seconds = {k: [] for k in frameworks}
  for r in range(_ROUNDS.value):
    for i, block in enumerate(blocks):
      for k in (("jbert", "torch") if (i + r) % 2 == 0 else ("torch", "jbert")):
        seconds[k].append(timing.timed(frameworks[k], block)[0])
      print(f"{name} round {r + 1}/{_ROUNDS.value} block {i + 1}/{len(blocks)}: " + ", ".join(
          f"{k} {len(block) / s[-1]:.1f} sent/s" for k, s in seconds.items()), flush=True)
  timed_sentences = len(texts) * _ROUNDS.value
  rates = {k: timed_sentences / sum(s) for k, s in seconds.items()}
  totals = {f"{k}_timed_s": sum(s) for k, s in seconds.items()}
  per_block = {k: [len(b) / t for b, t in zip(blocks * _ROUNDS.value, s)] for k, s in seconds.items()}
  return {
      "jbert_sent_s": rates["jbert"], "torch_sent_s": rates["torch"],
      "speedup_vs_torch": rates["jbert"] / rates["torch"],
      "jbert_block_median_sent_s": statistics.median(per_block["jbert"]),
      "torch_block_median_sent_s": statistics.median(per_block["torch"]),
      "jbert_block_range_sent_s": [min(per_block["jbert"]), max(per_block["jbert"])],
      "torch_block_range_sent_s": [min(per_block["torch"]), max(per_block["torch"])],
      "jbert_first_pass_s": first["jbert"], "torch_first_pass_s": first["torch"],
      "first_pass_speedup_vs_torch": first["torch"] / first["jbert"], "max_abs_diff": diff,
      "torch_threads": torch.get_num_threads(), "sentences": timed_sentences, **totals,
  }


def main(argv):
  del argv
  devices = runner.use_every_core()  # As `python -m jbert.embed` does.
  for path in (_TEXT.value, _VOCAB.value):
    if not os.path.exists(path):
      raise app.UsageError(f"{path} does not exist; pass --text and --vocab (botchan.txt and "
                           "bert-base-uncased-vocab.txt live in ../shared/data).")
  unknown = sorted(set(_MODELS.value) - set(MODELS))
  if unknown:
    raise app.UsageError(f"Unknown --models {unknown}; choose from {', '.join(MODELS)}.")
  texts = sentences(_TEXT.value, _SENTENCES.value, _SEED.value)
  print(f"{len(texts):,} sentences in {_BLOCKS.value} blocks x {_ROUNDS.value} timed rounds, batch {_BATCH.value}, "
        f"max_length {_MAX_LENGTH.value}, jbert {'packed' if _PACKING.value else 'length-bucketed'}, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores, jbert on {devices or 1} XLA:CPU devices", flush=True)
  results = {}
  for name in _MODELS.value:
    results[name] = bench_model(name, texts)
    r = results[name]
    print(f"{name}: jbert {r['jbert_sent_s']:.1f} sent/s, sentence-transformers {r['torch_sent_s']:.1f} sent/s, "
          f"speedup {r['speedup_vs_torch']:.2f}x; first pass (jbert compiling) {r['jbert_first_pass_s']:.1f} s "
          f"vs {r['torch_first_pass_s']:.1f} s, {r['first_pass_speedup_vs_torch']:.2f}x; max |diff| "
          f"{r['max_abs_diff']:.1e}", flush=True)
  # Top level: all models together (sentences over summed time), as the one-number summary.
  models = [results[name] for name in _MODELS.value]
  rate = {k: sum(m["sentences"] for m in models) / sum(m[f"{k}_timed_s"] for m in models) for k in ("jbert", "torch")}
  results.update(jbert_sent_s=rate["jbert"], torch_sent_s=rate["torch"], speedup_vs_torch=rate["jbert"] / rate["torch"],
                 load_average_end=os.getloadavg()[0])
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
