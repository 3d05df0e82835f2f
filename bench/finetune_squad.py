r"""SQuAD fine-tuning on this host, jbert (JAX) beside transformers' PyTorch BertForQuestionAnswering: the step time,
or (with --model) the exact match and F1 the same recipe reaches, over seeds.

  python bench/finetune_squad.py [--preset=base --batch=32 --seq=384 --steps=4 --warmup=2 --rounds=2]
  python bench/finetune_squad.py --model=DIR --train_file=train-v1.1.json --eval_file=dev-v1.1.json \
      --out=/tmp/squad_bench [--seeds=0,1,2 --epochs=2 --batch=32 --seq=384 --train_questions=N]

Step time: one step is what `run.py --config=configs/finetune.py:squad` runs: forward, backward and an AdamW update
(global-norm clipping at 1.0, weight decay 0.01 except on biases and LayerNorm, the recipe's lr 3e-5 held
constant) of the start/end span loss on one fixed batch of `batch` windows of `seq` tokens ([CLS] question
[SEP] context [SEP], answers inside the context), dropout on, float32. jbert's step is the trainer's own
(`jbert.train.step.train_step` with the `QuestionAnswering` task); transformers' is its model's loss with
`torch.optim.AdamW` and `clip_grad_norm_`. Both start from the same weights, use the same threads, and run in
blocks of steps that alternate between them over `rounds`, so that load from other processes hits both alike.

Quality (`--model`, a Hugging Face BERT folder with its tokenizer): `run.py`'s SQuAD 1.1 fine-tuning and the same
recipe in transformers (`bench/squad_quality.py`: the same windows, optimiser, schedule and answer search), once
per seed, EM and F1 as mean ± standard deviation over the seeds, the difference and Welch's t. A gap the seeds'
spread can hide needs a budget where the model really learns: with a pretrained model (e.g. all-MiniLM-L6-v2 or
bert-base-uncased) a few thousand training questions and 2 epochs reach F1 > 70.
The last line is a JSON object.
"""
from __future__ import annotations

import json
import os
import pathlib
import statistics
import sys
from typing import Any

from absl import app
from absl import flags
import jax
import numpy as np

# `python bench/finetune_squad.py` from a checkout, without installing jbert.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import timing  # noqa: E402  (bench/)
import torch_optim  # noqa: E402  (bench/)
from configs import finetune  # noqa: E402
import jbert_step  # noqa: E402  (bench/, the script's own folder)
from jbert import tasks  # noqa: E402
from jbert.model import BertConfig, BertForQuestionAnswering  # noqa: E402
from jbert.weights import hf_names  # noqa: E402

_PRESET = flags.DEFINE_string("preset", "base", "BertConfig preset.")
_BATCH = flags.DEFINE_integer("batch", 32, "Windows per step.")
_SEQ = flags.DEFINE_integer("seq", 384, "Tokens per window.")
_QUESTION = flags.DEFINE_integer("question", 16, "Question tokens per window.")
_STEPS = flags.DEFINE_integer("steps", 4, "Timed steps per framework.")
_WARMUP = flags.DEFINE_integer("warmup", 2, "Untimed steps per framework first (compilation, allocation).")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Blocks of timed steps per framework, alternating between them.")
_SKIP_TORCH = flags.DEFINE_bool("skip_torch", False, "Time jbert only.")
_MODEL = flags.DEFINE_string("model", None, "Quality: the Hugging Face BERT folder (with tokenizer) to fine-tune.")
_TRAIN_FILE = flags.DEFINE_string("train_file", None, "Quality: SQuAD 1.1 training JSON.")
_EVAL_FILE = flags.DEFINE_string("eval_file", None, "Quality: SQuAD 1.1 evaluation JSON.")
_OUT = flags.DEFINE_string("out", None, "Quality: folder for the data, the runs and their results.json.")
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2"], "Quality: one fine-tuning per seed and system.")
_EPOCHS = flags.DEFINE_float("epochs", 2.0, "Quality: passes over the training windows.")
_LEARNING_RATE = flags.DEFINE_float("learning_rate", 3e-5, "Quality: peak learning rate.")
_DOC_STRIDE = flags.DEFINE_integer("doc_stride", 128, "Quality: tokens between window starts (run_squad.py's).")
_MAX_QUERY = flags.DEFINE_integer("max_query_length", 64, "Quality: question tokens kept.")
_TRAIN_QUESTIONS = flags.DEFINE_integer("train_questions", None, "Quality: the first N training questions.")
_EVAL_QUESTIONS = flags.DEFINE_integer("eval_questions", None, "Quality: the first N evaluation questions.")
_SYSTEMS = flags.DEFINE_list("systems", ["jbert", "torch"], "Quality: jbert and/or torch.")

# BERT's special token ids (bert-base-uncased vocab); only their values matter here.
_CLS, _SEP, _FIRST_WORD = 101, 102, 1000


def make_batch(config: BertConfig, batch: int, seq: int, question: int, seed: int = 0) -> dict[str, np.ndarray]:
  """Full-length windows `[CLS] question [SEP] context [SEP]` with an answer span inside each context."""
  if not 1 <= question <= seq - 4:
    raise ValueError(f"question={question} must lie in [1, seq - 4 = {seq - 4}] to leave a context token; lower "
                     "--question or raise --seq.")
  rng = np.random.default_rng(seed)
  ids = rng.integers(_FIRST_WORD, config.vocab_size, size=(batch, seq))
  ids[:, 0], ids[:, question + 1], ids[:, -1] = _CLS, _SEP, _SEP
  first, last = question + 2, seq - 2  # the context's tokens
  start = rng.integers(first, last + 1, size=batch)
  end = np.minimum(start + rng.integers(0, 5, size=batch), last)
  return {
      "input_ids": ids.astype(np.int32),
      "token_type_ids": np.broadcast_to(np.arange(seq) >= first, (batch, seq)).astype(np.int32),
      "attention_mask": np.ones((batch, seq), np.int32),
      "start_positions": start.astype(np.int32),
      "end_positions": end.astype(np.int32),
  }


def _finetune_config(seq: int):
  """configs/finetune.py:squad at `seq` tokens (`jbert_step` holds its learning rate constant)."""
  config = finetune.get_config("squad")
  with config.unlocked():
    config.data.max_seq_length = seq
    config.task.max_query_length = min(config.task.max_query_length, seq - 4)
  return config


class _Jbert:
  """The trainer's QA train step (state donated) on one batch."""

  def __init__(self, config: BertConfig, batch: dict[str, np.ndarray], seed: int):
    cfg = _finetune_config(batch["input_ids"].shape[1])
    task = tasks.build_task(cfg)
    model = task.model(config)
    self._step, _, self.state = jbert_step.constant_lr_train_step(cfg, task, model, task.head.dummy_shape, seed)
    self.batch = jax.device_put(batch)
    self.optim = cfg.optim

  def step(self) -> float:
    self.state, metrics = self._step(self.state, self.batch)
    return float(jax.block_until_ready(metrics)["loss"])


class _Torch:
  """transformers' BertForQuestionAnswering + torch.optim.AdamW with the same decay exclusions and clipping."""

  def __init__(self, config: BertConfig, params, batch: dict[str, np.ndarray], optim_cfg):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    self._torch = torch
    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
    self.model = transformers.BertForQuestionAnswering(hf_config).train()
    state = hf_names.params_to_hf(jax.device_get(params), config, BertForQuestionAnswering)
    self.model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    self.attn_implementation = self.model.config._attn_implementation  # pylint: disable=protected-access
    self.optimizer = torch_optim.adamw_from_config(self.model, optim_cfg)
    self.clip = optim_cfg.grad_clip_norm
    self.inputs = {k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items()}

  def step(self) -> float:
    self.optimizer.zero_grad(set_to_none=True)
    loss = self.model(**self.inputs).loss
    loss.backward()
    self._torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
    self.optimizer.step()
    return loss.item()


def _split(steps: int, rounds: int) -> list[int]:
  """`steps` timed steps over at most `rounds` blocks per framework, as evenly as possible."""
  rounds = max(1, min(rounds, steps))
  return [steps // rounds + (r < steps % rounds) for r in range(rounds)]


def run(config: BertConfig, *, batch: int, seq: int, question: int = 16, steps: int = 4, warmup: int = 2,
        rounds: int = 2, torch: bool = True, seed: int = 0) -> dict[str, Any]:
  """Times both frameworks and returns the benchmark's JSON fields: per-step times, their medians and spread
  (max / min of the timed steps), median CPU seconds per step (all threads; on a shared host the wall time also
  holds the waits for a core), the losses of every step, and jbert's speedup over torch."""
  threads = len(os.sched_getaffinity(0))
  data = make_batch(config, batch, seq, question, seed)
  jbert = _Jbert(config, data, seed)
  runners = {"jbert": jbert}
  results: dict[str, Any] = {"threads": threads}
  if torch:
    import torch as torch_lib  # pylint: disable=g-import-not-at-top
    torch_lib.set_num_threads(threads)
    runners["torch"] = _Torch(config, jbert.state.params, data, jbert.optim)
    results["torch_attn_implementation"] = runners["torch"].attn_implementation
  measured = timing.blocks(runners, "step", steps, rounds, warmup)
  losses, times, cpu = measured.returned, measured.seconds, measured.cpu_seconds
  for name in runners:
    results[f"{name}_step_s"] = statistics.median(times[name])
    results[f"{name}_step_s_all"] = times[name]
    results[f"{name}_spread"] = max(times[name]) / min(times[name])
    results[f"{name}_cpu_s"] = statistics.median(cpu[name])
    results[f"{name}_losses"] = losses[name]
  if torch:
    results["speedup_vs_torch"] = results["torch_step_s"] / results["jbert_step_s"]
    results["cpu_ratio_vs_torch"] = results["torch_cpu_s"] / results["jbert_cpu_s"]
  return results


def quality() -> dict[str, Any]:
  """--model: EM/F1 over seeds of both systems, printed as mean ± std; the JSON fields."""
  import squad_quality  # pylint: disable=g-import-not-at-top  (bench/; imports the trainer)
  missing = [f"--{f.name}" for f in (_TRAIN_FILE, _EVAL_FILE, _OUT) if not f.value]
  if missing:
    raise app.UsageError(f"--model needs {', '.join(missing)}.")
  recipe = squad_quality.Recipe(
      model=_MODEL.value, train_file=_TRAIN_FILE.value, eval_file=_EVAL_FILE.value, out=_OUT.value,
      seeds=tuple(int(s) for s in _SEEDS.value), train_questions=_TRAIN_QUESTIONS.value,
      eval_questions=_EVAL_QUESTIONS.value, batch=_BATCH.value, epochs=_EPOCHS.value,
      learning_rate=_LEARNING_RATE.value, max_seq_length=_SEQ.value, doc_stride=_DOC_STRIDE.value,
      max_query_length=_MAX_QUERY.value)
  r = squad_quality.run(recipe, _SYSTEMS.value)
  print(f"SQuAD 1.1 fine-tuning of {_MODEL.value}: {r['train_questions']:,} questions -> {r['train_windows']:,} "
        f"windows ({_SEQ.value} tokens, doc_stride {_DOC_STRIDE.value}), {r['steps']:,} steps of {_BATCH.value}, "
        f"lr {_LEARNING_RATE.value:g}; {r['eval_questions']:,} evaluation questions; seeds {_SEEDS.value}")
  for system in _SYSTEMS.value:
    s = r[system]
    seeds = ", ".join(f"{x['exact_match']:.1f}/{x['f1']:.1f}" for x in s["per_seed"])
    print(f"  {system:5}  EM {s['exact_match_mean']:.2f} ± {s['exact_match_std']:.2f}  F1 {s['f1_mean']:.2f} ± "
          f"{s['f1_std']:.2f}  (EM/F1 per seed: {seeds})")
  if "f1_difference" in r:
    t = r["f1_welch_t"]
    print(f"  F1 jbert - torch: {r['f1_difference']:+.2f} (Welch t {'n/a' if t is None else f'{t:.2f}'}); EM "
          f"{r['exact_match_difference']:+.2f}")
  return r


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  if _MODEL.value:
    print(json.dumps(quality()))
    return
  config = BertConfig.from_preset(_PRESET.value, scan_layers=False)
  b, t = _BATCH.value, _SEQ.value
  r = run(config, batch=b, seq=t, question=_QUESTION.value, steps=_STEPS.value, warmup=_WARMUP.value,
          rounds=_ROUNDS.value, torch=not _SKIP_TORCH.value)
  r.update(preset=_PRESET.value, batch=b, seq=t, question=_QUESTION.value, rounds=_ROUNDS.value,
           jax=jax.__version__)
  print(f"{_PRESET.value} SQuAD step (fwd + bwd + AdamW, start/end loss), batch {b} x {t}, float32, dropout on, "
        f"{r['threads']} threads, {_ROUNDS.value} alternating blocks of timed steps per framework")
  print(f"  jbert  {r['jbert_step_s']:.3f} s/step (median of {_STEPS.value}, max/min {r['jbert_spread']:.2f}; "
        f"{r['jbert_cpu_s']:.1f} CPU s)")
  if "torch_step_s" in r:
    print(f"  torch  {r['torch_step_s']:.3f} s/step (median of {_STEPS.value}, max/min {r['torch_spread']:.2f}; "
          f"{r['torch_cpu_s']:.1f} CPU s; {r['torch_attn_implementation']} attention)")
    print(f"  jbert speedup {r['speedup_vs_torch']:.2f}x (CPU seconds {r['cpu_ratio_vs_torch']:.2f}x)")
  print(json.dumps(r))


if __name__ == "__main__":
  app.run(main)
