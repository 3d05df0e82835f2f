r"""One command for a borrowed GPU: jbert's numbers on that device beside transformers/PyTorch, in under 8 minutes.

  python3 bench/device_check.py              # on the GPU machine, from the checkout, with .whl/ carried beside it
  python3 bench/device_check.py --dry_run    # every code path on this CPU with a tiny model (the suite runs it)
  python3 bench/device_check.py --budget_s=300   # a shorter device run (default 450 s)

The machine's image has jax (+ its CUDA plugin), flax, optax, orbax, torch, transformers and sentence-transformers;
what else jbert imports travels in `.whl/` (`bench/device_wheels.sh` fills it) and is unpacked into `.whl/site`
on first use, no network needed. Parts, each within its share of `--budget_s` (a part that runs out is cut and
named in the result; the others still run). The dry run has no budget: every part runs to the end, both lengths,
on its tiny model, since it stands for the device run's code paths, not its time:

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
of stdout is one JSON object with everything. A headline figure left empty (its part failed or was cut) is named
with its cause under `missing` and in one line on stderr, and the exit status is then 1: a null is not a result.
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import pathlib
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
  """Seconds left of the whole check, and each part's share of them; `seconds=None` is no limit (the dry run)."""

  def __init__(self, seconds: float | None, log):
    self.end = math.inf if seconds is None else time.perf_counter() + seconds
    self.log, self.result = log, {}

  def left(self) -> float:
    return self.end - time.perf_counter()

  @contextlib.contextmanager
  def part(self, name: str, share: float):
    """Runs the block if at least 10 s are left; records its seconds, or its error or cut, in one line."""
    start = time.perf_counter()
    entry = self.result.setdefault(name, {})
    if self.left() < 10:
      entry["skipped"] = "time budget"
      self.log({name: entry})
      yield None
      return
    deadline = start + min(share, self.left())
    try:
      yield deadline
    except Exception as e:  # pylint: disable=broad-except  (a part's failure must not lose the other parts)
      entry["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:500]}"
    entry["seconds"] = round(time.perf_counter() - start, 1)
    self.log({name: entry})


# The lengths of the pretraining figures: each is a key of `jbert_seq_per_s`, `torch_seq_per_s`, `mfu`, `compile_s`.
LENGTHS = ("128", "512")


def settings(dry_run: bool) -> dict:
  """Sizes of every part: BERT-base on the device; on CPU a tiny BERT, both lengths scaled down by 4 (so the "512"
  figures go through every line the device's do), and no time budget."""
  if dry_run:
    return {"model": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
                          vocab_size=1200, max_position_embeddings=128),
            "lengths": {"128": 32, "512": 128}, "batch": {"128": 8, "512": 4}, "masked": {"128": 5, "512": 20},
            "parity": (4, 32), "finetune": (4, 32), "embed": (48, 16, 32), "seconds": 0.5, "max_steps": 2,
            "budget_s": None, "device": "cpu"}
  return {"model": {}, "lengths": {"128": 128, "512": 512}, "batch": None, "masked": {"128": 20, "512": 80},
          "parity": (8, 128), "finetune": (32, 128), "embed": (20_000, 256, 128), "seconds": 6.0, "max_steps": 30,
          "budget_s": 450, "device": "cuda"}


def _figures():
  """(headline key path, where in the parts it is read), in the order the result shows them."""
  yield ("device",), ("parity", "device")
  yield ("parity_max_abs_diff",), ("parity", "parity_max_abs_diff")
  yield ("parity_packed_max_abs_diff",), ("parity", "parity_packed_max_abs_diff")
  rows = ("padded", "packed")
  yield from ((("jbert_seq_per_s", k, r), ("pretrain", f"{k}_{r}", "seq_per_s")) for k in LENGTHS for r in rows)
  yield from ((("torch_seq_per_s", k), ("torch", f"pretrain_{k}", "seq_per_s")) for k in LENGTHS)
  yield from ((("mfu", k, r), ("pretrain", f"{k}_{r}", "mfu")) for k in LENGTHS for r in rows)
  yield from ((("compile_s", k), ("pretrain", f"{k}_padded", "compile_s")) for k in LENGTHS)
  yield ("finetune_steps_per_s", "jbert"), ("finetune", "recipe", "steps_per_s")
  yield ("finetune_steps_per_s", "jbert_fast"), ("finetune", "fast", "steps_per_s")
  yield ("finetune_steps_per_s", "torch"), ("torch", "finetune", "steps_per_s")
  yield ("embed_sentences_per_s", "jbert"), ("embed", "sentences_per_s")
  yield ("embed_sentences_per_s", "sentence_transformers"), ("torch", "embed", "sentences_per_s")


def _read(parts: dict, where: tuple) -> tuple:
  """(the value at `where` in `parts` or None, why it is absent: the error or cut of the deepest entry on the way,
  else the first missing key)."""
  node, why, seen = parts, None, []
  for key in where:
    if not isinstance(node, dict) or key not in node:
      return None, why or f"{'.'.join(seen) or 'the result'} has no {key}"
    node = node[key]
    seen.append(key)
    if isinstance(node, dict) and ("error" in node or "skipped" in node):
      why = f"{'.'.join(seen)}: {node.get('error') or 'skipped, ' + str(node['skipped'])}"
  return node, why or f"{'.'.join(seen)} is null"


def summary(parts: dict, dry_run: bool) -> dict:
  """The one JSON object: the headline figures first, then `missing` (each empty figure and why), every part's
  details after."""
  out, missing = {}, {}
  for path, where in _figures():
    value, why = _read(parts, where)
    node = out
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = value
    if value is None:
      missing[".".join(path)] = why
  return {**out, "missing": missing, "dry_run": dry_run, "parts": parts}


def _missing_line(missing: dict) -> str:
  """One line: the empty figures grouped by their cause."""
  causes: dict[str, list[str]] = {}
  for name, why in missing.items():
    causes.setdefault(why, []).append(name)
  return (f"device_check: {len(missing)} figures empty: "
          + "; ".join(f"{', '.join(names)} ({why})" for why, names in causes.items())
          + ". What was measured is in the JSON above and each part's line.")


def _arguments(argv) -> tuple[bool, float | None]:
  """(dry run, budget seconds or None); a user error raises ValueError with the line to print."""
  dry_run, budget_s = False, None
  for arg in argv:
    if arg == "--dry_run":
      dry_run = True
    elif arg.startswith("--budget_s="):
      try:
        budget_s = float(arg.split("=", 1)[1])
      except ValueError:
        budget_s = math.nan
      if not budget_s > 0 or not math.isfinite(budget_s):
        raise ValueError(f"{arg}: pass a number of seconds above 0, e.g. --budget_s=450")
    else:
      raise ValueError(f"unknown argument {arg!r}: device_check takes --dry_run and --budget_s=SECONDS")
  if dry_run and budget_s is not None:
    raise ValueError("--budget_s is for the device run: --dry_run runs every part to the end; drop one of them")
  return dry_run, budget_s


def main(argv) -> int:
  try:
    dry_run, budget_s = _arguments(argv)
  except ValueError as e:
    print(f"device_check: {e}", file=sys.stderr)
    return 2
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
  result = summary(budget.result, dry_run)
  result["wall_s"] = round(time.perf_counter() - start, 1)
  print(json.dumps(result, default=str), flush=True)
  if result["missing"]:
    print(_missing_line(result["missing"]), file=sys.stderr, flush=True)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
