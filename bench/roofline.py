r"""How fast any framework can run BERT on this host: the float32 matmul peak and the time it bounds.

  python bench/roofline.py [--preset=base --batch=32 --seq=128 --repeats=3]
                           [--embeddings --sentences=2000 --text=botchan.txt --vocab=vocab.txt]  (../shared/data)

Nearly all of BERT's work is matmuls (`jbert.runtime.flops`: the dense layers and attention). This measures the best
float32 matmul rate of XLA (what jbert runs) and of PyTorch (oneDNN/MKL) on BERT's own largest product,
[B*T, H] @ [H, F], divides the model's matmul FLOPs by the faster of the two and so gives the shortest possible
time of a forward pass (evaluation, embeddings) and of a train step (3 x forward). It then times PyTorch's own
`BertModel` forward on the same shape and reports what fraction of that bound PyTorch reaches: a framework
`r` times faster than PyTorch would have to run at `r` times that fraction of the peak, which is impossible
once the product exceeds 1. With `--embeddings` it also bounds bench/inference.py: the sentences it embeds,
tokenized and batched as sentence-transformers batches them (sorted by length, each batch padded to its longest),
give the matmul FLOPs of each model there and so the most sentences per second any framework could reach doing
that work. The last line is a JSON object.
"""
from __future__ import annotations

import json
import os
import pathlib
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import timing  # noqa: E402  (bench/)
from bench import inference  # noqa: E402  (its --sentences, --text, --vocab, --batch_size, --max_length)
from jbert.runtime import flops  # noqa: E402
from jbert.model import BertConfig  # noqa: E402

_PRESET = flags.DEFINE_string("preset", "base", "BertConfig preset.")
_BATCH = flags.DEFINE_integer("batch", 32, "Sequences per batch.")
_SEQ = flags.DEFINE_integer("seq", 128, "Tokens per sequence.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed repeats of the PyTorch forward (the best is kept).")
_MATMUL_REPEATS = 10  # A matmul takes ~0.1 s; on a busy host the best of 2 once read half the peak.
_EMBEDDINGS = flags.DEFINE_bool("embeddings", False, "Also bound bench/inference.py's models on its sentences.")


def embedding_bounds(peak: float) -> dict[str, float]:
  """Sentences/s at `peak` FLOP/s for each bench/inference.py model, on sentence-transformers' batches."""
  from tokenizers import BertWordPieceTokenizer  # pylint: disable=g-import-not-at-top
  texts = inference.sentences(inference._TEXT.value, inference._SENTENCES.value, inference._SEED.value)
  tokenizer = BertWordPieceTokenizer(inference._VOCAB.value, lowercase=True)
  lengths = sorted((min(len(e.ids), inference._MAX_LENGTH.value) for e in tokenizer.encode_batch(texts)),
                   reverse=True)
  size = inference._BATCH.value
  batches = [(len(lengths[i:i + size]), lengths[i]) for i in range(0, len(lengths), size)]  # (rows, longest)
  bounds = {}
  for name in inference.DEFAULT_MODELS:
    layers, hidden, _ = inference.MODELS[name]
    config = BertConfig(num_hidden_layers=layers, hidden_size=hidden, intermediate_size=4 * hidden)
    work = sum(flops.forward_flops(config, batch_size=b, seq_len=t, num_masked=0, nsp=False) for b, t in batches)
    bounds[f"{name}_bound_sent_s"] = len(texts) * peak / work
  bounds["padded_tokens"], bounds["tokens"] = sum(b * t for b, t in batches), sum(lengths)
  return bounds


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  threads = len(os.sched_getaffinity(0))
  torch.set_num_threads(threads)
  config = BertConfig.from_preset(_PRESET.value)
  b, t, h, f = _BATCH.value, _SEQ.value, config.hidden_size, config.intermediate_size
  rng = np.random.default_rng(0)
  x, w = rng.standard_normal((b * t, h), np.float32), rng.standard_normal((h, f), np.float32)
  matmul_flops = 2 * b * t * h * f
  jx, jw = jnp.asarray(x), jnp.asarray(w)
  jax_matmul = jax.jit(jnp.matmul)
  jax_peak = matmul_flops / timing.best_seconds(lambda: jax_matmul(jx, jw).block_until_ready(), _MATMUL_REPEATS, warmup=1)
  tx, tw = torch.from_numpy(x), torch.from_numpy(w)
  with torch.no_grad():
    torch_peak = matmul_flops / timing.best_seconds(lambda: tx @ tw, _MATMUL_REPEATS, warmup=1)
  peak = max(jax_peak, torch_peak)
  forward = flops.forward_flops(config, batch_size=b, seq_len=t, num_masked=0, nsp=False)
  forward_bound, train_bound = forward / peak, 3 * forward / peak

  hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
  model = transformers.BertModel(hf_config, add_pooling_layer=False).eval()
  ids = torch.from_numpy(rng.integers(1000, config.vocab_size, (b, t)))
  with torch.no_grad():
    torch_forward = timing.best_seconds(lambda: model(input_ids=ids), _REPEATS.value, warmup=1)
  fraction = forward_bound / torch_forward
  r = {"preset": _PRESET.value, "batch": b, "seq": t, "threads": threads, "load_avg_1m": os.getloadavg()[0],
       "jax_matmul_gflop_s": jax_peak / 1e9, "torch_matmul_gflop_s": torch_peak / 1e9,
       "forward_gflop": forward / 1e9, "forward_bound_s": forward_bound, "train_step_bound_s": train_bound,
       "torch_forward_s": torch_forward, "torch_fraction_of_bound": fraction,
       "max_speedup_vs_torch_forward": 1 / fraction}
  print(f"{_PRESET.value}, batch {b} x {t}, float32, {threads} threads; 1-minute load average "
        f"{r['load_avg_1m']:.1f}")
  print(f"  matmul [{b * t}, {h}] @ [{h}, {f}]: XLA {r['jax_matmul_gflop_s']:.0f} GFLOP/s, PyTorch "
        f"{r['torch_matmul_gflop_s']:.0f} GFLOP/s")
  print(f"  model matmuls: {r['forward_gflop']:.0f} GFLOP per forward -> at least {forward_bound:.2f} s per "
        f"forward, {train_bound:.2f} s per train step")
  print(f"  PyTorch BertModel forward: {torch_forward:.2f} s = {fraction:.0%} of the peak; no framework can be "
        f"more than {1 / fraction:.2f}x faster on this forward")
  if _EMBEDDINGS.value:
    r.update(embedding_bounds(peak))
    print(f"  bench/inference.py's {inference._SENTENCES.value} sentences, {r['tokens']:,} tokens padded to "
          f"{r['padded_tokens']:,} in batches of {inference._BATCH.value}: at most " + ", ".join(
              f"{r[f'{m}_bound_sent_s']:.1f} sentences/s ({m})" for m in inference.DEFAULT_MODELS))
  print(json.dumps(r))


if __name__ == "__main__":
  app.run(main)
