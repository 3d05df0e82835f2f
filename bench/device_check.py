r"""One command for a borrowed GPU: jbert's numbers on that device beside transformers/PyTorch, in under 8 minutes.

  python3 bench/device_check.py              # on the GPU machine, from the checkout, with .whl/ carried beside it
  python3 bench/device_check.py --dry_run    # every code path on this CPU with a tiny model (the suite runs it)

The machine's image has jax (+ its CUDA plugin), flax, optax, orbax, torch, transformers and sentence-transformers;
what else jbert imports travels in `.whl/` (`bench/device_wheels.sh` fills it) and is unpacked into `.whl/site`
on first use, no network needed. Parts, each within its share of `--budget_s` (a part that runs out is cut and
named in the result; the others still run):

  parity     a random BERT-base as a Hugging Face folder; jbert's fp32 last hidden states against transformers' on
             the device (TF32 off on both: JAX at "highest" matmul precision), padded rows, and packed rows
             (several sequences per row, segment ids) against each sequence alone: `parity_max_abs_diff`,
             `parity_packed_max_abs_diff`
  pretrain   BERT-base pretraining steps (MLM + NSP, AdamW, bf16 compute, fp32 master weights, the `fast` recipe:
             no attention dropout, so the platform's fused kernel runs: cuDNN on GPU) at sequence 128 and 512, the
             batch the largest power of two the memory estimate allows (halved on out-of-memory): rows of one
             sequence each (padded), and the same sequences packed several to a row; `jbert_seq_per_s`,
             `torch_seq_per_s` (transformers' BertForPreTraining: bf16 autocast, SDPA, fused AdamW, padded rows),
             `mfu` against the chip's dense bf16 peak (`jbert.runtime.flops`), compile seconds
  finetune   BertForSequenceClassification steps, batch 32 x 128, jbert with the recipe's attention dropout
             (einsum attention) and without it (fused), against transformers with it
  embed      `jbert.embed` (bf16) against sentence-transformers' `encode` (bf16) of the same folder, mean pooling

PyTorch runs first in a process of its own (bench/device_torch.py), so JAX's preallocation never starves it.
Each part's JSON goes to stderr as it ends (and to `$OUT/device_check.jsonl` when $OUT is set), and the last line
of stdout is one JSON object with everything.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import zipfile

REPO = pathlib.Path(__file__).resolve().parents[1]
# What jbert's modules on this check's paths import beyond the device image's packages (bench/device_wheels.sh).
CARRIED = ("ml_collections", "grain", "sentencex", "tensorboardX", "sentencepiece")


def bootstrap(wheels: pathlib.Path = REPO / ".whl") -> list[str]:
  """Makes the carried wheels importable: unpacked once into `.whl/site` (no pip, no network), put on sys.path.
  Returns the modules that are still missing."""
  sys.path.insert(0, str(REPO))
  missing = [m for m in CARRIED if importlib.util.find_spec(m) is None]
  if missing and wheels.is_dir():
    site = wheels / "site"
    if not site.is_dir():
      for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
          z.extractall(site)
    sys.path.insert(1, str(site))
    importlib.invalidate_caches()
  return [m for m in CARRIED if importlib.util.find_spec(m) is None]


class Budget:
  """Seconds left of the whole check, and each part's share of them."""

  def __init__(self, seconds: float, log):
    self.end, self.log, self.result = time.perf_counter() + seconds, log, {}

  def left(self) -> float:
    return self.end - time.perf_counter()

  @contextlib.contextmanager
  def part(self, name: str, share: float):
    """Runs the block if at least 10 s are left; records its seconds, or its error in one line."""
    start = time.perf_counter()
    entry = self.result.setdefault(name, {})
    if self.left() < 10:
      entry["skipped"] = "time budget"
      yield None
      return
    deadline = start + min(share, self.left())
    try:
      yield deadline
    except Exception as e:  # pylint: disable=broad-except  (a part's failure must not lose the other parts)
      entry["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
    entry["seconds"] = round(time.perf_counter() - start, 1)
    self.log({name: entry})


def settings(dry_run: bool) -> dict:
  """Sizes of every part: BERT-base on the device; on CPU a tiny BERT, and one length (the second would only
  compile the same code again)."""
  if dry_run:
    return {"model": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                          vocab_size=1200, max_position_embeddings=64),
            "lengths": {"128": 32}, "batch": {"128": 8}, "masked": {"128": 5},
            "parity": (4, 32), "finetune": (4, 32), "embed": (48, 16, 32), "seconds": 0.5, "max_steps": 2,
            "budget_s": 110, "device": "cpu"}
  return {"model": {}, "lengths": {"128": 128, "512": 512}, "batch": None, "masked": {"128": 20, "512": 80},
          "parity": (8, 128), "finetune": (32, 128), "embed": (20_000, 256, 128), "seconds": 6.0, "max_steps": 30,
          "budget_s": 450, "device": "cuda"}


def batch_for_memory(seq: int, memory_bytes: float) -> int:
  """The largest power of two of BERT-base rows whose step fits ~70% of the device: per row ~0.11 GiB at
  sequence 128 (XLA's TPU compile of the same step: 6.8 GiB of temporaries for 64 rows), scaled with the length."""
  per_row = 0.11 * 2**30 * seq / 128
  rows = max(1, int(0.7 * memory_bytes / per_row))
  return 1 << (rows.bit_length() - 1)


def sequence_lengths(rng, count: int, seq: int):
  """Lengths of `count` sequences, uniform over [seq / 8, seq]: about 44% of padded rows is padding."""
  return rng.integers(max(seq // 8, 4), seq + 1, count)


def row_lengths(seq: int, count: int):
  """The lengths both frameworks' batches of `seq` tokens take (the first `batch` of them for padded rows)."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  return sequence_lengths(np.random.default_rng(seq), count, seq)


def pack(lengths, seq: int) -> list[list[int]]:
  """First-fit rows of sequence indices whose lengths sum to at most `seq`."""
  rows, room = [], []
  for i, n in enumerate(lengths):
    j = next((j for j, r in enumerate(room) if r >= n), None)
    if j is None:
      rows.append([i])
      room.append(seq - n)
    else:
      rows[j].append(i)
      room[j] -= n
  return rows


def main(argv) -> int:
  dry_run = "--dry_run" in argv
  budget_s = next((float(a.split("=", 1)[1]) for a in argv if a.startswith("--budget_s=")), None)
  sizes = settings(dry_run)
  out_dir = os.environ.get("OUT")
  lines = open(os.path.join(out_dir, "device_check.jsonl"), "a", encoding="utf-8") if out_dir else None

  def log(entry):
    text = json.dumps(entry, default=str)
    print(text, file=sys.stderr, flush=True)
    if lines:
      lines.write(text + "\n")
      lines.flush()

  start = time.perf_counter()
  budget = Budget(budget_s or sizes["budget_s"], log)
  missing = bootstrap()
  if missing:
    print(json.dumps({"error": f"missing {', '.join(missing)}: run bench/device_wheels.sh where pip can reach "
                      "PyPI and carry .whl/ with the checkout"}))
    return 2
  if dry_run:
    os.environ["JAX_PLATFORMS"] = "cpu"
  else:
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9")
  import device_parts  # pylint: disable=g-import-not-at-top  (bench/, after the wheels are importable)
  with tempfile.TemporaryDirectory() as tmp:
    work = device_parts.Work(pathlib.Path(tmp), sizes, dry_run)
    with budget.part("torch", share=0.4 * budget.left()) as deadline:
      if deadline:
        budget.result["torch"].update(work.run_torch(deadline - time.perf_counter()))
    for name, share in (("parity", 0.12), ("pretrain", 0.6), ("finetune", 0.5), ("embed", 1.0)):
      with budget.part(name, share * budget.left()) as deadline:
        if deadline:
          budget.result[name].update(getattr(work, name)(deadline))
    summary = work.summary(budget.result)
  summary["wall_s"] = round(time.perf_counter() - start, 1)
  print(json.dumps(summary, default=str), flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
