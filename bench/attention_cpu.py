r"""Attention on XLA:CPU: jbert's kernels against `jax.nn.dot_product_attention`, and a MiniLM-sized forward against
transformers' BertModel, timed on the same threads; prints JSON.

  python bench/attention_cpu.py [--batch=8 --length=256 --model=384,6,12,1536 --repeats=5]

Attention alone: packed rows of four sequences (segment ids) of a MiniLM layer's heads, q, k, v [B, T, N, D] in
float32; `jax.nn.dot_product_attention` (XLA's formula: probabilities normalised before the second matmul) against
jbert's `xla` kernel (the sum divides the context after it), forward, and forward + backward (training without
attention dropout, the `fast` recipe, runs the xla kernel on a CPU). Then the whole
encoder, random weights, [B, T] of random ids: jbert's BertModel (attention_impl xla) against transformers' BertModel
(sdpa) with `torch.set_num_threads(2)` (XLA:CPU's pool has a thread a core here). Each number is the fastest of
`--repeats` calls after a first one (the compile), in milliseconds per row; every pair's outputs are compared.
"""
from __future__ import annotations

import json
import math
import tempfile
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

_BATCH = flags.DEFINE_integer("batch", 8, "Rows a call.")
_LENGTH = flags.DEFINE_integer("length", 256, "Tokens a row.")
_MODEL = flags.DEFINE_list("model", ["384", "6", "12", "1536"], "hidden, layers, heads, intermediate.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed calls after the first; the fastest is reported.")


def fastest_ms(fn, *args) -> float:
  jax.block_until_ready(fn(*args))
  times = []
  for _ in range(_REPEATS.value):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - start)
  return 1000 * min(times)


def attention_parts(batch: int, length: int, heads: int, head_dim: int) -> dict:
  from jbert.model import attention  # pylint: disable=import-outside-toplevel
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((batch, length, heads, head_dim)), jnp.float32) for _ in range(3))
  segments = jnp.asarray(np.repeat(np.arange(1, 5), -(-length // 4))[:length][None].repeat(batch, 0), jnp.int32)
  mask = jnp.ones((batch, length), bool)
  allowed = attention.allowed_keys(mask, segments)  # [B, 1, T, S]
  reference = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=allowed))
  ours = jax.jit(lambda q, k, v: attention.fused_attention("xla", q, k, v, mask, segments, "cpu"))
  loss = lambda f: jax.jit(jax.grad(lambda q, k, v: (f(q, k, v) ** 2).sum(), argnums=(0, 1, 2)))
  train_reference, train_ours = loss(reference), loss(ours)
  grads = [np.stack([np.asarray(g) for g in f(q, k, v)]) for f in (train_reference, train_ours)]
  return {
      "forward_ms_per_row": {"jax.nn.dot_product_attention": fastest_ms(reference, q, k, v) / batch,
                             "jbert_xla": fastest_ms(ours, q, k, v) / batch},
      "forward_max_abs_diff": float(jnp.abs(reference(q, k, v) - ours(q, k, v)).max()),
      "train_ms_per_row": {"jax.nn.dot_product_attention": fastest_ms(train_reference, q, k, v) / batch,
                           "jbert_xla": fastest_ms(train_ours, q, k, v) / batch},
      "train_grad_max_rel_diff": float(np.abs(grads[0] - grads[1]).max() / np.abs(grads[0]).max()),
  }


def encoder(batch: int, length: int, hidden: int, layers: int, heads: int, intermediate: int) -> dict:
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from jbert import model as jbert_model  # pylint: disable=import-outside-toplevel
  from jbert import weights  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  torch.set_num_threads(2)
  config = transformers.BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=heads, intermediate_size=intermediate,
                                   attn_implementation="sdpa")
  reference = transformers.BertModel(config, add_pooling_layer=False).eval()
  ids = np.random.default_rng(0).integers(5, 30000, (batch, length))
  with tempfile.TemporaryDirectory() as folder:
    reference.save_pretrained(folder)
    ours_config, params = weights.load_pretrained(folder, jbert_model.BertModel, attention_impl="xla",
                                                  dtype="float32")
  module = jbert_model.BertModel(ours_config)
  forward = jax.jit(lambda p, i: module.apply({"params": p}, i, attention_mask=jnp.ones_like(i)).last_hidden_state)
  ids_jax = jnp.asarray(ids, jnp.int32)
  with torch.inference_mode():
    ids_torch = torch.tensor(ids)
    expected = reference(ids_torch).last_hidden_state.numpy()
    reference(ids_torch)
    times = []
    for _ in range(_REPEATS.value):
      start = time.perf_counter()
      reference(ids_torch)
      times.append(time.perf_counter() - start)
  return {"ms_per_row": {"jbert": fastest_ms(forward, params, ids_jax) / batch,
                         "transformers_sdpa": 1000 * min(times) / batch},
          "max_abs_diff": float(np.abs(np.asarray(forward(params, ids_jax)) - expected).max())}


def main(argv):
  del argv
  hidden, layers, heads, intermediate = (int(x) for x in _MODEL.value)
  result = {"batch": _BATCH.value, "length": _LENGTH.value, "model": [hidden, layers, heads, intermediate],
            "attention": attention_parts(_BATCH.value, _LENGTH.value, heads, hidden // heads),
            "encoder": encoder(_BATCH.value, _LENGTH.value, hidden, layers, heads, intermediate)}
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
