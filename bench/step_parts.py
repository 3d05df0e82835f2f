r"""Where a fine-tuning step's time goes: the trainer's gradient and update programs timed apart, their matmul rate
against the host's measured peak and, with --profile, XLA:CPU's own per-operation times of the gradient program.

  python bench/step_parts.py --out=/tmp/parts --learning_rate=5e-4 [--steps=60 --profile --model=384,6,12,1536]

The data and the model are bench/finetune_e2e.py's SST-2-like sentences and its randomly initialised MiniLM-sized
BERT (hidden 384, 6 layers, 12 heads, intermediate 1536), trained by `jbert.train.trainer.train_and_evaluate` with
the e2e bench's jbert settings (packed batches, as `run.py` defaults; batch 32). Each step is timed as two halves,
each waited for: the gradient program (per batch shape) and the update; each shape's first step (its compile, or the
wait for it) is left out, and the medians of the rest are reported. The matmul FLOPs of a gradient
(`jbert.runtime.flops`, forward and backward over every token slot, padding included) divided by its time give its
share of the measured float32 matmul peak, which bounds what any implementation could gain on it. --profile traces 5
calls of the most frequent shape's gradient with XLA's per-operation trace events on and sums them (all threads,
milliseconds a call) into matmuls (YNNPACK, XNNPACK or oneDNN fusions and `dot`s) and the rest, with the rest's
largest kinds. The last line is a JSON object.
"""
from __future__ import annotations

import collections
import contextlib
import gzip
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time

if "--profile" in sys.argv:  # XLA reads its flags when JAX starts: before the first import of jax
  os.environ["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""),
                                                 "--xla_cpu_enable_xprof_traceme=true") if f)

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import finetune_e2e as e2e  # noqa: E402  (bench/, the script's own folder)
from configs import finetune  # noqa: E402
from jbert.model import BertConfig  # noqa: E402
from jbert.runtime import flops  # noqa: E402
from jbert.train import programs  # noqa: E402
from jbert.train import trainer  # noqa: E402

# finetune_e2e's flags serve here too: --out, --text, --vocab, --sst2_rows (training, evaluation rows), --sst2_seq,
# --model, --learning_rate, --seed.
_STEPS = flags.DEFINE_integer("steps", 60, "Optimiser steps to run (batch 32).")
_PROFILE = flags.DEFINE_boolean("profile", False, "Also trace the gradient program's operations.")

MATMUL = re.compile(r"^(ynn|xnn|onednn)_fusion|^dot(\.|$)")
_SKIP = ("$", "ThunkExecutor", "SlinkyThreadPool", "PjitFunction", "CommonPjRt", "ParseArguments", "Allocate",
         "Handle inputs", "end: ")


@contextlib.contextmanager
def timed_halves(record: list, captured: dict | None = None):
  """`programs.Steps.train` timing its gradient and update apart (each waited for) into `record` as (shape,
  gradient s, update s, real tokens); the first batch of each shape and the state before it go to `captured`, when
  given (--profile: a host copy of the whole state, not worth making otherwise)."""
  original = programs.Steps.train

  def train(self, state, batch):
    jax.block_until_ready(batch)
    shape = tuple(batch["input_ids"].shape)
    if captured is not None and shape not in captured and self.split:
      captured[shape] = (self, jax.tree.map(np.asarray, state), jax.tree.map(np.asarray, batch))
    start = time.perf_counter()
    if self.split:
      grads, metrics = self.grad(state, batch)
      jax.block_until_ready(grads)
      middle = time.perf_counter()
      out = self.update(state, grads, metrics)
    else:
      middle, out = None, self.fused(state, batch)
    jax.block_until_ready(out)
    end = time.perf_counter()
    tokens = int(np.sum(np.asarray(batch["attention_mask"]) != 0))
    record.append((shape, (middle or end) - start, end - (middle or end), tokens))
    return out

  programs.Steps.train = train
  try:
    yield
  finally:
    programs.Steps.train = original


def summarise(record: list, bert_config: BertConfig, peak: float) -> dict:
  """Per batch shape: steps, median gradient and update seconds, real tokens, and the gradient's share of `peak`.
  A shape's first step (its compile, or a wait for one) is left out."""
  out = {}
  for shape in dict.fromkeys(r[0] for r in record):
    rows = [r for r in record if r[0] == shape][1:]
    if not rows:
      continue
    n_rows, length = shape[0], shape[-1]
    gradient = float(np.median([r[1] for r in rows]))
    matmul = flops.train_flops_per_step(bert_config, batch_size=n_rows, seq_len=length, num_masked=0)
    out["x".join(map(str, shape))] = {
        "steps": len(rows), "gradient_s": round(gradient, 4),
        "update_s": round(float(np.median([r[2] for r in rows])), 4),
        "real_tokens": float(np.median([r[3] for r in rows])), "slots": n_rows * length,
        "matmul_gflop": round(matmul / 1e9, 2), "gradient_of_peak": round(matmul / gradient / peak, 3)}
  return out


def op_times(trace_events: list, calls: int) -> dict:
  """XLA:CPU operation events (all threads) summed per call in ms: matmuls, the rest, and the rest's 8 largest kinds
  (numbered instances of a fusion kind together)."""
  kinds: collections.Counter = collections.Counter()
  for event in trace_events:
    name = event.get("name", "")
    if event.get("ph") == "X" and not name.startswith(_SKIP):
      kinds[re.sub(r"\.\d+$", "", name)] += event["dur"] / 1e3 / calls
  matmul = sum(v for k, v in kinds.items() if MATMUL.match(k))
  rest = {k: v for k, v in kinds.items() if not MATMUL.match(k)}
  return {"matmul_ms": round(matmul, 2), "other_ms": round(sum(rest.values()), 2),
          "other_largest": {k: round(v, 2) for k, v in collections.Counter(rest).most_common(8)}}


def profile(step, state, batch, calls: int = 5) -> dict:
  """`op_times` of `calls` traced gradients of `step` on (state, batch), after 2 untraced ones."""
  for _ in range(2):
    jax.block_until_ready(step.grad(state, batch))
  with tempfile.TemporaryDirectory() as directory:
    jax.profiler.start_trace(directory)
    for _ in range(calls):
      jax.block_until_ready(step.grad(state, batch))
    jax.profiler.stop_trace()
    trace = next(pathlib.Path(directory).rglob("*.trace.json.gz"))
    events = json.load(gzip.open(trace))["traceEvents"]
  return op_times(events, calls)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if not e2e._OUT.value:
    raise app.UsageError("--out=DIR is required.")
  root = pathlib.Path(e2e._OUT.value).resolve()
  root.mkdir(parents=True, exist_ok=True)
  hidden, layers, heads, intermediate = (int(x) for x in e2e._MODEL.value)
  seq, seed, (train_rows, eval_rows) = e2e._SST2_SEQ.value, e2e._SEED.value, e2e._SST2_ROWS.value
  model = str(e2e.make_model(root / "model", e2e._VOCAB.value, hidden, layers, heads, intermediate, seed))
  words = e2e.source_words(pathlib.Path(e2e._TEXT.value).read_text(encoding="utf-8"))
  (root / "data").mkdir(exist_ok=True)
  e2e.write_csv(root / "data" / "train.csv", e2e.sst2_rows(words, int(train_rows), seed, seq // 2 - 4))
  e2e.write_csv(root / "data" / "dev.csv", e2e.sst2_rows(words, int(eval_rows), seed + 1, seq // 2 - 4))
  config = finetune.get_config("local")
  config.update_from_flattened_dict(e2e.jbert_settings(model, e2e.task_files("sst2", root / "data"), seq, 1.0,
                                                        e2e._LR.value, seed, bucketing=True))
  config.total_steps = _STEPS.value
  shutil.rmtree(root / "run", ignore_errors=True)  # an earlier run's workdir would resume, or be complete
  record, captured = [], ({} if _PROFILE.value else None)
  with timed_halves(record, captured):
    trainer.train_and_evaluate(config, str(root / "run"))
  vocab = json.loads((root / "model" / "config.json").read_text())["vocab_size"]
  bert_config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                           num_attention_heads=heads, intermediate_size=intermediate)
  peak, _ = flops.peak_flops_per_device()
  report = {"model": dict(hidden=hidden, layers=layers, heads=heads, intermediate=intermediate),
            "seq": seq, "peak_gflops": round(peak / 1e9, 1), "threads": len(os.sched_getaffinity(0)),
            "shapes": summarise(record, bert_config, peak)}
  if captured:
    shape = collections.Counter(r[0] for r in record).most_common(1)[0][0]
    step, state, batch = captured[shape]
    report["profile"] = {"shape": "x".join(map(str, shape)), **profile(step, jax.device_put(state),
                                                                         jax.device_put(batch))}
  print(json.dumps(report))


if __name__ == "__main__":
  app.run(main)
