r"""The CRF's forward algorithm three ways, Viterbi decoding, and pytorch-crf at the same shape.

  python bench/crf.py [--batch=32 --length=128 --tags=9 --timed=40 --rounds=4]

Emissions [B, T, C] are random normal, the transitions uniform(-0.1, 0.1) (pytorch-crf's init), the mask NER-like:
each row has a random length of at least half of T and marks about 70% of those positions (the first sub-tokens of
words), the first always. Timed, each on its own jitted program, in alternating blocks (bench/timing.py):

  forward     log Z [B] (`jbert.model.crf.log_partition`): `lax.scan` over T; the balanced log-semiring product
              tree (`parallel=True`); `lax.associative_scan` over the same [K, K] matrices (every prefix, of which
              only the last is needed)
  train       mean negative log-likelihood and its gradient with respect to the emissions and the three parameters
  viterbi     `viterbi_decode` (scan with backpointers)
  torch       pytorch-crf 0.7.2 (`torchcrf.CRF`), when installed: the mean negative log-likelihood forward + backward
              and `decode` on the same numbers, with the mask compacted to a prefix (pytorch-crf needs one)

Prints milliseconds per call (median and range) and, last, one JSON object.
"""
from __future__ import annotations

import json
import pathlib
import statistics
import sys

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from jbert.model import crf  # noqa: E402
import timing  # noqa: E402

_BATCH = flags.DEFINE_integer("batch", 32, "Rows B.")
_LENGTH = flags.DEFINE_integer("length", 128, "Positions T.")
_TAGS = flags.DEFINE_integer("tags", 9, "Tags C (CoNLL-2003's IOB2 set has 9).")
_TIMED = flags.DEFINE_integer("timed", 40, "Timed calls per variant.")
_ROUNDS = flags.DEFINE_integer("rounds", 4, "Alternating blocks.")


def associative_log_partition(emissions, mask, potentials):
  """log Z by `lax.associative_scan` over the positions' log-semiring matrices (the same matrices as the tree)."""
  trans, end = crf._augmented(potentials, None, crf.NEG)  # pylint: disable=protected-access
  e, m = crf._steps(emissions), jnp.swapaxes(mask.astype(bool), 0, 1)  # pylint: disable=protected-access
  k = trans.shape[0]
  identity = jnp.where(jnp.eye(k, dtype=bool), 0.0, crf.NEG).astype(jnp.float32)
  mats = jnp.where(m[:, :, None, None], trans[None, None] + e[:, :, None, :], identity)  # [T, B, K, K]
  prefix = jax.lax.associative_scan(crf._log_matmul, mats, axis=0)  # pylint: disable=protected-access
  return jax.nn.logsumexp(prefix[-1, :, k - 1] + end, axis=-1)


class Call:
  def __init__(self, fn, *args):
    self.fn, self.args = fn, args

  def run(self):
    jax.block_until_ready(self.fn(*self.args))


def inputs(b, t, c):
  rng = np.random.default_rng(0)
  emissions = rng.normal(size=(b, t, c)).astype(np.float32)
  tags = rng.integers(0, c, size=(b, t)).astype(np.int32)
  lengths = rng.integers(t // 2, t + 1, size=b)
  mask = (np.arange(t)[None] < lengths[:, None]) & (rng.random((b, t)) < 0.7)
  mask[:, 0] = True
  potentials = crf.Potentials(*(rng.uniform(-0.1, 0.1, size=s).astype(np.float32) for s in ((c, c), (c,), (c,))))
  return emissions, tags, mask, potentials


def jax_calls(emissions, tags, mask, potentials):
  forward = {
      "forward scan": lambda e, m, p: crf.log_partition(e, m, p),
      "forward tree": lambda e, m, p: crf.log_partition(e, m, p, parallel=True),
      "forward associative_scan": associative_log_partition,
  }
  calls = {name: Call(jax.jit(fn), emissions, mask, potentials) for name, fn in forward.items()}
  for name, parallel in (("train scan", False), ("train tree", True)):
    loss = lambda e, p, t, m, parallel=parallel: -jnp.mean(crf.log_likelihood(e, t, m, p, parallel=parallel))
    calls[name] = Call(jax.jit(jax.value_and_grad(loss, argnums=(0, 1))), emissions, potentials, tags, mask)
  calls["viterbi"] = Call(jax.jit(crf.viterbi_decode), emissions, mask, potentials)
  return calls


def torch_calls(emissions, tags, mask, potentials):
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import torchcrf  # pylint: disable=g-import-not-at-top
  except ImportError:
    return {}
  order = np.argsort(~mask, axis=1, kind="stable")  # pytorch-crf runs over a prefix: the marked positions first
  e = torch.tensor(np.take_along_axis(emissions, order[..., None], 1))
  t = torch.tensor(np.take_along_axis(tags, order, 1), dtype=torch.long)
  m = torch.tensor(np.take_along_axis(mask, order, 1))
  layer = torchcrf.CRF(emissions.shape[-1], batch_first=True)
  with torch.no_grad():
    for dst, src in ((layer.transitions, potentials.transitions), (layer.start_transitions, potentials.start),
                     (layer.end_transitions, potentials.end)):
      dst.copy_(torch.tensor(src))
  e.requires_grad_(True)

  class Train:
    def run(self):
      loss = -layer(e, t, m, reduction="mean")
      loss.backward()

  class Decode:
    def run(self):
      with torch.no_grad():
        layer.decode(e, m)

  return {"torch train": Train(), "torch viterbi": Decode()}


def main(argv):
  del argv
  args = inputs(_BATCH.value, _LENGTH.value, _TAGS.value)
  runners = {**jax_calls(*args), **torch_calls(*args)}
  z = {name: np.asarray(runners[name].fn(*runners[name].args)) for name in runners if name.startswith("forward")}
  agree = max(float(np.max(np.abs(v - z["forward scan"]))) for v in z.values())
  times = timing.alternating_blocks(runners, "run", _TIMED.value, _ROUNDS.value, warmup=2)
  result = {"batch": _BATCH.value, "length": _LENGTH.value, "tags": _TAGS.value, "backend": jax.default_backend(),
            "forward_max_abs_difference": agree, "ms": {}}
  print(f"B={_BATCH.value} T={_LENGTH.value} C={_TAGS.value} on {jax.default_backend()}; log Z of the three forward "
        f"forms agree to {agree:.2e}")
  for name, seconds in times.items():
    ms = [s * 1e3 for s in seconds]
    result["ms"][name] = round(statistics.median(ms), 3)
    print(f"  {name:26s} {statistics.median(ms):9.3f} ms  ({min(ms):.3f}-{max(ms):.3f})")
  print(json.dumps(result))


if __name__ == "__main__":
  app.run(main)
