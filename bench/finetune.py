r"""Sequence-classification fine-tuning on this host: jbert (JAX) beside transformers' PyTorch
BertForSequenceClassification, for the train step and for evaluation throughput.

  python bench/finetune.py [--preset=base --batch=32 --seq=128 --steps=4 --rounds=2 --eval_batches=4]

The train step is forward, backward and an AdamW update (global-norm clipping at 1.0, weight decay 0.01 except on
biases and LayerNorm, constant learning rate) on one fixed batch, dropout on, float32, from the same initial
weights with the same number of threads; it is the step `jbert.train.trainer` runs for `configs/finetune.py:sst2`.
Evaluation is the predict step (no dropout, no gradients) on batches of the same size. Both are timed in blocks
that alternate between the frameworks over `rounds`, one untimed step after each switch; medians are reported
with every timing. The last line is a JSON object.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import pathlib
import statistics
import sys

from absl import app
from absl import flags
import jax
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from configs import finetune  # noqa: E402
import jbert_step  # noqa: E402  (bench/, the script's own folder)
import timing  # noqa: E402
import torch_optim  # noqa: E402
from jbert import tasks  # noqa: E402
from jbert.train import step as step_lib  # noqa: E402
from jbert.model import BertConfig  # noqa: E402
from jbert.weights import hf_names  # noqa: E402

_PRESET = flags.DEFINE_string("preset", "base", "BertConfig preset.")
_SIZE = flags.DEFINE_list("size", None, "hidden,layers,heads,intermediate overriding the preset's (MiniLM-L6: "
                          "384,6,12,1536).")
_BATCH = flags.DEFINE_integer("batch", 32, "Sequences per step.")
_SEQ = flags.DEFINE_integer("seq", 128, "Tokens per sequence.")
_STEPS = flags.DEFINE_integer("steps", 4, "Timed train steps per framework.")
_EVAL_BATCHES = flags.DEFINE_integer("eval_batches", 4, "Timed evaluation batches per framework.")
_ROUNDS = flags.DEFINE_integer("rounds", 2, "Alternating blocks per framework.")


def make_batch(config: BertConfig, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
  """Pairs of random words, lengths between seq/2 and seq, two labels."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(seq // 2, seq + 1, batch)
  ids = rng.integers(1000, config.vocab_size, (batch, seq)).astype(np.int32)
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  types = ((np.arange(seq)[None] >= lengths[:, None] // 2) & (mask == 1)).astype(np.int32)
  ids[:, 0], ids = 101, ids * mask
  return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask,
          "label": rng.integers(0, 2, batch).astype(np.int32)}


class _Jbert:

  def __init__(self, config: BertConfig, batch):
    cfg = finetune.get_config("sst2")
    task = tasks.build_task(cfg)
    model = task.model(config)
    self._train, _, self.state = jbert_step.constant_lr_train_step(cfg, task, model, (1, 8))
    self._predict = jax.jit(functools.partial(step_lib.predict_step, model=model, task=task))
    self.batch = jax.device_put(batch)
    self.inputs = jax.device_put({k: v for k, v in batch.items() if k != "label"})

  def train(self) -> float:
    self.state, metrics = self._train(self.state, self.batch)
    return float(jax.block_until_ready(metrics)["loss"])

  def predict(self) -> float:
    return float(jax.block_until_ready(self._predict(self.state.params, self.inputs)["logits"])[0, 0])


class _Torch:

  def __init__(self, config: BertConfig, params, batch):
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # pylint: disable=g-import-not-at-top
    from jbert.model import BertForSequenceClassification  # pylint: disable=g-import-not-at-top
    self._torch = torch
    hf_config = transformers.BertConfig(**{k: v for k, v in config.to_dict().items() if k != "model_type"},
                                        num_labels=2)
    self.model = transformers.BertForSequenceClassification(hf_config).train()
    state = hf_names.params_to_hf(jax.device_get(params), config, BertForSequenceClassification)
    self.model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
    cfg = finetune.get_config("sst2").optim
    self.optimizer = torch_optim.adamw_from_config(self.model, cfg)
    self.inputs = {k: torch.from_numpy(v.astype(np.int64)) for k, v in batch.items() if k != "label"}
    self.labels = torch.from_numpy(batch["label"].astype(np.int64))

  def train(self) -> float:
    self.model.train()
    self.optimizer.zero_grad(set_to_none=True)
    loss = self.model(**self.inputs, labels=self.labels).loss
    loss.backward()
    self._torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
    self.optimizer.step()
    return loss.item()

  def predict(self) -> float:
    self.model.eval()
    with self._torch.no_grad():
      return float(self.model(**self.inputs).logits[0, 0])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  import torch  # pylint: disable=g-import-not-at-top
  threads = len(os.sched_getaffinity(0))
  torch.set_num_threads(threads)
  config = BertConfig.from_preset(_PRESET.value)
  if _SIZE.value:
    hidden, layers, heads, intermediate = (int(v) for v in _SIZE.value)
    config = dataclasses.replace(config, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                                 intermediate_size=intermediate)
  b, t = _BATCH.value, _SEQ.value
  batch = make_batch(config, b, t)
  jbert = _Jbert(config, batch)
  runners = {"jbert": jbert, "torch": _Torch(config, jbert.state.params, batch)}
  rounds = max(1, min(_ROUNDS.value, _STEPS.value, _EVAL_BATCHES.value))
  train_times = timing.alternating_blocks(runners, "train", _STEPS.value, rounds, warmup=2)
  eval_times = timing.alternating_blocks(runners, "predict", _EVAL_BATCHES.value, rounds, warmup=2)
  r = {"preset": _PRESET.value, "batch": b, "seq": t, "threads": threads, "load_avg_1m": os.getloadavg()[0]}
  for name in runners:
    r[f"{name}_step_s"] = statistics.median(train_times[name])
    r[f"{name}_step_s_all"] = train_times[name]
    r[f"{name}_eval_seq_s"] = b / statistics.median(eval_times[name])
    r[f"{name}_eval_s_all"] = eval_times[name]
  r["speedup_vs_torch"] = r["torch_step_s"] / r["jbert_step_s"]
  r["eval_speedup_vs_torch"] = r["jbert_eval_seq_s"] / r["torch_eval_seq_s"]
  print(f"{_PRESET.value} sequence classification, batch {b} x {t}, float32, {threads} threads, "
        f"{rounds} alternating blocks; 1-minute load average {r['load_avg_1m']:.1f}")
  print(f"  train step (fwd + bwd + AdamW, dropout on): jbert {r['jbert_step_s']:.3f} s, torch "
        f"{r['torch_step_s']:.3f} s (medians) -> {r['speedup_vs_torch']:.2f}x")
  print(f"  evaluation: jbert {r['jbert_eval_seq_s']:.1f} seq/s, torch {r['torch_eval_seq_s']:.1f} seq/s -> "
        f"{r['eval_speedup_vs_torch']:.2f}x")
  print(json.dumps(r))


if __name__ == "__main__":
  app.run(main)
