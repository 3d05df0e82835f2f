r"""BERT pretraining step time on this host: jbert (JAX) beside transformers' PyTorch BertForPreTraining.

  python bench/train_step.py [--preset=base --batch=8 --seq=128 --steps=6 --rounds=2 --skip_torch --skip_compile]

One step is forward, backward and an AdamW update (global-norm clipping at 1.0, weight decay 0.01 except on
biases and LayerNorm) on one fixed batch of `batch` x `seq` tokens with `masked` MLM positions per row and NSP
labels, dropout on. Both frameworks run float32 from the same initial weights with the same number of threads,
in blocks of steps that alternate between them, so that load from other processes hits both alike. jbert
gathers the masked positions before the MLM head; transformers decodes all `seq` positions (its -100 labels
only mask the loss), as users run it. MFU divides jbert's model FLOPs (`jbert.runtime.flops`) by its step time and the measured float32
matmul peak of the host. The compile times are lowering plus XLA compilation of the jitted train step with
`scan_layers=True`, for two depths of the preset's width. The last line is a JSON object.
"""
from __future__ import annotations

import functools
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any

from absl import app
from absl import flags
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

# `python bench/train_step.py` from a checkout, without installing jbert.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import timing  # noqa: E402  (bench/)
import torch_optim  # noqa: E402  (bench/)
from jbert.runtime import flops  # noqa: E402
from jbert.train import optim  # noqa: E402
from jbert.train import step as step_lib  # noqa: E402
from jbert.model import BertConfig, BertForPreTraining  # noqa: E402
from jbert.tasks import Pretraining  # noqa: E402
from jbert.weights import hf_names  # noqa: E402

_PRESET = flags.DEFINE_string("preset", "base", "BertConfig preset.")
_BATCH = flags.DEFINE_integer("batch", 8, "Sequences per step.")
_SEQ = flags.DEFINE_integer("seq", 128, "Tokens per sequence.")
_MASKED = flags.DEFINE_integer("masked", 20, "Masked LM positions per sequence.")
_STEPS = flags.DEFINE_integer("steps", 6, "Timed steps per framework.")
_WARMUP = flags.DEFINE_integer("warmup", 3, "Untimed steps per framework first (compilation, allocation).")
_SKIP_TORCH = flags.DEFINE_bool("skip_torch", False, "Time jbert only.")
_SKIP_COMPILE = flags.DEFINE_bool("skip_compile", False, "Skip the 12- vs 24-layer compile-time comparison.")
_SCAN = flags.DEFINE_bool("scan_layers", False, "scan_layers of the timed jbert model.")
_ATTENTION = flags.DEFINE_enum("attention_impl", "xla", ["xla", "einsum"],
                               "attention_impl of the timed jbert model (dropout on the probabilities "
                               "takes the einsum path either way).")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Blocks of timed steps per framework, alternating between them.")
_XLA_FLAGS = flags.DEFINE_string("xla_flags", "", "Appended to XLA_FLAGS, e.g. --xla_cpu_use_onednn=true.")

_COMPILE_LAYERS = (12, 24)
# BERT's special token ids (bert-base-uncased vocab); only their values matter here.
_CLS, _SEP, _MASK, _FIRST_WORD = 101, 102, 103, 1000


def make_batch(config: BertConfig, batch: int, seq: int, masked: int, seed: int = 0) -> dict[str, np.ndarray]:
  """A full-length sentence-pair batch in the contract's format, `masked` positions per row replaced by
  [MASK]."""
  if not 0 < masked <= seq - 3:
    raise ValueError(f"masked={masked} must lie in [1, seq - 3 = {seq - 3}]: [CLS] and two [SEP] are never "
                     "masked; lower --masked or raise --seq.")
  rng = np.random.default_rng(seed)
  ids = rng.integers(_FIRST_WORD, config.vocab_size, size=(batch, seq))
  split = seq // 2
  ids[:, 0], ids[:, split], ids[:, -1] = _CLS, _SEP, _SEP
  candidates = np.setdiff1d(np.arange(seq), [0, split, seq - 1])
  positions = np.stack([np.sort(rng.choice(candidates, masked, replace=False)) for _ in range(batch)])
  labels = np.take_along_axis(ids, positions, 1)
  np.put_along_axis(ids, positions, _MASK, 1)
  return {
      "input_ids": ids.astype(np.int32),
      "token_type_ids": np.broadcast_to(np.arange(seq) > split, (batch, seq)).astype(np.int32),
      "attention_mask": np.ones((batch, seq), np.int32),
      "masked_lm_positions": positions.astype(np.int32),
      "masked_lm_ids": labels.astype(np.int32),
      "masked_lm_weights": np.ones((batch, masked), np.int32),
      "next_sentence_labels": rng.integers(0, 2, size=batch).astype(np.int32),
  }


def _optim_config():
  # A constant learning rate, so that both frameworks take the same updates.
  cfg = optim.default_config()
  cfg.warmup_steps, cfg.end_learning_rate = 0, cfg.learning_rate
  return cfg


def _init_and_step(config: BertConfig):
  """(init(rng) -> unboxed TrainState, the jitted train step with the state donated), as the trainer runs it."""
  model = BertForPreTraining(config)
  cfg = _optim_config()
  tx = optim.make_optimizer(cfg, total_steps=1)
  task = Pretraining(nsp=True, max_predictions=_MASKED.value if flags.FLAGS.is_parsed() else 20)
  step = jax.jit(functools.partial(step_lib.train_step, model=model, task=task, tx=tx,
                                   schedule=optim.make_schedule(cfg, total_steps=1)), donate_argnums=0)
  return lambda rng: nn.meta.unbox(step_lib.init_state(model, tx, rng, (1, 8))), step


class _Jbert:
  """jbert's state and step on one batch."""

  def __init__(self, config: BertConfig, batch: dict[str, np.ndarray], seed: int):
    init, self._step = _init_and_step(config)
    self.state = jax.jit(init)(jax.random.key(seed))
    self.batch = jax.device_put(batch)

  def step(self) -> float:
    self.state, metrics = self._step(self.state, self.batch)
    return float(jax.block_until_ready(metrics)["loss"])


class _Torch:
  """transformers' BertForPreTraining + torch.optim.AdamW with the same decay exclusions and clipping."""

  def __init__(self, config: BertConfig, params, batch: dict[str, np.ndarray]):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    self._torch = torch
    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
    self.model = transformers.BertForPreTraining(hf_config).train()
    state_dict = {k: torch.from_numpy(np.array(v)) for k, v in hf_names.params_to_hf(params, config).items()}
    self.model.load_state_dict(state_dict)
    # The decoder weight must stay tied to the word embeddings after loading.
    assert self.model.cls.predictions.decoder.weight is self.model.bert.embeddings.word_embeddings.weight
    self.attn_implementation = self.model.config._attn_implementation  # pylint: disable=protected-access
    cfg = _optim_config()
    self.optimizer = torch_optim.adamw_from_config(self.model, cfg)
    self.clip = cfg.grad_clip_norm
    labels = np.full(batch["input_ids"].shape, -100, np.int64)
    np.put_along_axis(labels, batch["masked_lm_positions"], batch["masked_lm_ids"], 1)
    self.inputs = {
        "input_ids": torch.from_numpy(batch["input_ids"].astype(np.int64)),
        "token_type_ids": torch.from_numpy(batch["token_type_ids"].astype(np.int64)),
        "attention_mask": torch.from_numpy(batch["attention_mask"].astype(np.int64)),
        "labels": torch.from_numpy(labels),
        "next_sentence_label": torch.from_numpy(batch["next_sentence_labels"].astype(np.int64)),
    }

  def step(self) -> float:
    self.optimizer.zero_grad(set_to_none=True)
    loss = self.model(**self.inputs).loss
    loss.backward()
    self._torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
    self.optimizer.step()
    return loss.item()


def _timed(step) -> tuple[float, float]:
  start = time.perf_counter()
  loss = step()
  return time.perf_counter() - start, loss


def compile_seconds(config: BertConfig, num_layers: int, batch: dict[str, np.ndarray]) -> float:
  """Lowering plus compilation of the train step for `num_layers` scanned layers of `config`'s width."""
  init, step = _init_and_step(config.replace(num_hidden_layers=num_layers, scan_layers=True))
  state = jax.eval_shape(init, jax.random.key(0))
  batch = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), batch)
  start = time.perf_counter()
  step.lower(state, batch).compile()
  return time.perf_counter() - start


def _split(steps: int, rounds: int) -> list[int]:
  """`steps` timed steps over at most `rounds` blocks per framework, as evenly as possible."""
  rounds = max(1, min(rounds, steps))
  return [steps // rounds + (r < steps % rounds) for r in range(rounds)]


def run(config: BertConfig, *, batch: int, seq: int, masked: int, steps: int, warmup: int = 3,
        torch: bool = True, compile_layers: tuple[int, ...] = _COMPILE_LAYERS,
        peak_sizes: tuple[int, ...] = (1024, 2048), seed: int = 0, rounds: int = 2) -> dict[str, Any]:
  """Times both frameworks (medians over `steps`) and returns the benchmark's JSON fields.

  `compile_layers=()` skips the compile-time comparison; `torch=False` times jbert only. Each framework runs
  `warmup + steps + rounds - 1` steps (losses of all of them are returned).
  """
  threads = len(os.sched_getaffinity(0))
  results: dict[str, Any] = {"threads": threads}
  data = make_batch(config, batch, seq, masked, seed)
  if compile_layers:
    compile_seconds(config, 1, data)  # Untimed: the process's first compilation also initialises XLA.
  for layers in compile_layers:
    results[f"compile_s_{layers}_layers"] = compile_seconds(config, layers, data)
  if len(compile_layers) == 2:
    results["compile_ratio"] = (results[f"compile_s_{compile_layers[1]}_layers"]
                                / results[f"compile_s_{compile_layers[0]}_layers"])
  # Measured before torch starts its OpenMP threads, whose spinning would lower the peak (and inflate MFU).
  peak = max(flops.measure_matmul_peak(jnp.float32, n=n, repeats=10) for n in peak_sizes)

  jbert = _Jbert(config, data, seed)
  runners = {"jbert": jbert}
  if torch:
    import torch as torch_lib  # pylint: disable=g-import-not-at-top
    torch_lib.set_num_threads(threads)
    runners["torch"] = _Torch(config, jbert.state.params, data)
    results["torch_attn_implementation"] = runners["torch"].attn_implementation
  # Blocks of steps, alternating between frameworks over `rounds`, so slow drift in the machine's load hits both.
  # Steps are not interleaved one by one: a step right after the other framework's ran ~25% slower (seen for
  # jbert after torch, even after a 1 s pause), which is no one's steady state. After a switch, one untimed step.
  measured = timing.blocks(runners, "step", steps, rounds, warmup)
  losses, times = measured.returned, measured.seconds

  model_flops = flops.train_flops_per_step(config, batch_size=batch, seq_len=seq, num_masked=masked)
  for name in runners:
    results[f"{name}_step_s"] = statistics.median(times[name])
    results[f"{name}_step_s_all"] = times[name]
    results[f"{name}_losses"] = losses[name]
  results["peak_flops"] = peak
  results["model_flops_per_step"] = model_flops
  results["mfu"] = flops.mfu(model_flops, results["jbert_step_s"], peak)
  if torch:
    results["speedup_vs_torch"] = results["torch_step_s"] / results["jbert_step_s"]
  return results


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  # XLA reads its flags when the backend starts, at the first JAX operation below.
  os.environ["XLA_FLAGS"] = " ".join(f for f in (os.environ.get("XLA_FLAGS", ""), _XLA_FLAGS.value) if f)
  jax.config.update("jax_enable_compilation_cache", False)  # Compile times must be real compilations.
  config = BertConfig.from_preset(_PRESET.value, scan_layers=_SCAN.value, attention_impl=_ATTENTION.value)
  b, t, p = _BATCH.value, _SEQ.value, _MASKED.value
  r = run(config, batch=b, seq=t, masked=p, steps=_STEPS.value, warmup=_WARMUP.value,
          torch=not _SKIP_TORCH.value, compile_layers=() if _SKIP_COMPILE.value else _COMPILE_LAYERS,
          rounds=_ROUNDS.value)
  r.update(preset=_PRESET.value, batch=b, seq=t, masked=p, scan_layers=_SCAN.value,
           attention_impl=_ATTENTION.value, xla_flags=os.environ["XLA_FLAGS"], jax=jax.__version__,
           note=f"jbert runs the MLM head on the {p} gathered positions; transformers decodes all {t}.")
  print(f"{_PRESET.value} pretraining step (fwd + bwd + AdamW), batch {b} x {t}, {p} masked positions + NSP, "
        f"float32, {r['threads']} threads, {_ROUNDS.value} alternating blocks of timed steps per framework")
  print(f"  measured peak matmul {r['peak_flops'] / 1e9:.1f} GFLOP/s; jbert model FLOPs per step "
        f"{r['model_flops_per_step'] / 1e9:.1f} G")
  print(f"  jbert  {r['jbert_step_s']:.3f} s/step (median of {_STEPS.value}), MFU {r['mfu']:.3f}; "
        f"scan_layers={_SCAN.value}, attention_impl={_ATTENTION.value}, XLA_FLAGS={r['xla_flags']!r}")
  if "torch_step_s" in r:
    torch_flops = flops.train_flops_per_step(config, batch_size=b, seq_len=t)
    r["torch_flops_per_step"] = torch_flops
    print(f"  torch  {r['torch_step_s']:.3f} s/step ({r['torch_attn_implementation']} attention; its MLM "
          f"decoder runs on all {t} positions: {torch_flops / 1e9:.1f} G model FLOPs, "
          f"{torch_flops / r['torch_step_s'] / r['peak_flops']:.3f} of peak)")
    print(f"  jbert speedup {r['speedup_vs_torch']:.2f}x")
  if "compile_ratio" in r:
    print(f"  lowering + compile with scan_layers: 12 layers {r['compile_s_12_layers']:.1f} s, "
          f"24 layers {r['compile_s_24_layers']:.1f} s, ratio {r['compile_ratio']:.2f}")
  print(json.dumps(r))


if __name__ == "__main__":
  app.run(main)
