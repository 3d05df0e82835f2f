"""The parts of bench/device_check.py (see there), each `part(deadline) -> dict`; JAX is imported here, after the
carried wheels are importable and after PyTorch's process has exited."""
from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
import time

import ml_collections
import numpy as np

import device_shapes
import jbert_step
from jbert.model import BertConfig

_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
_CLS, _SEP, _MASK, _FIRST_WORD = 2, 3, 4, 5


class Work:
  """The model folder, inputs and results the parts share."""

  def __init__(self, tmp: pathlib.Path, sizes: dict, dry_run: bool):
    self.tmp, self.sizes, self.dry_run = tmp, sizes, dry_run
    self.folder = tmp / "bert"
    self.config = BertConfig.from_preset("base", **sizes["model"])
    rng = np.random.default_rng(0)
    self.words = sorted({"".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(3, 9)))
                         for _ in range(self.config.vocab_size)})[:self.config.vocab_size - len(_SPECIALS)]
    n, seq = sizes["parity"]
    lengths = device_shapes.sequence_lengths(rng, n, seq)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int64)
    ids = rng.integers(_FIRST_WORD, len(self.words) + len(_SPECIALS), (n, seq)) * mask
    ids[:, 0] = _CLS
    self.parity_inputs = {"input_ids": ids, "token_type_ids": (np.arange(seq)[None] >= lengths[:, None] // 2) * mask,
                          "attention_mask": mask}
    count, per_text, _ = sizes["embed"]
    self.texts = [" ".join(rng.choice(self.words, rng.integers(3, per_text))) for _ in range(count)]
    self.torch: dict = {}

  # -- PyTorch, in a process of its own --

  def run_torch(self, seconds: float) -> dict:
    """Writes the model folder and times PyTorch (bench/device_torch.py); the batches it chose (by the device's
    memory, halved on out-of-memory) are where jbert starts. `seconds` may be infinite (the dry run)."""
    bounded = math.isfinite(seconds)
    spec = {"folder": str(self.folder), "device": self.sizes["device"],
            "budget_s": max(seconds - 30, 10) if bounded else None,
            "config": {k: v for k, v in self.config.to_dict().items() if k != "model_type"},
            "vocab": _SPECIALS + self.words, "seconds": self.sizes["seconds"], "max_steps": self.sizes["max_steps"],
            "parity_inputs": {k: v.tolist() for k, v in self.parity_inputs.items()},
            "parity_out": str(self.tmp / "torch_hidden.npy"), "embed_out": str(self.tmp / "torch_embed.npy"),
            "pretrain": {f"pretrain_{s}": {"seq": self.sizes["lengths"][s],
                                           "batch": self.sizes["batch"] and self.sizes["batch"][s]}
                         for s in self.sizes["lengths"]},
            "finetune": {"seq": self.sizes["finetune"][1], "batch": self.sizes["finetune"][0]},
            "embed": {"texts": self.texts, "batch": self.sizes["embed"][1], "max_length": self.sizes["embed"][2]}}
    (self.tmp / "spec.json").write_text(json.dumps(spec))
    out = self.tmp / "torch.json"
    proc = subprocess.run([sys.executable, str(pathlib.Path(__file__).with_name("device_torch.py")),
                           f"--spec={self.tmp / 'spec.json'}", f"--out={out}"], timeout=seconds if bounded else None,
                          capture_output=True, text=True, check=False)
    if proc.returncode:
      raise RuntimeError(f"device_torch.py exited {proc.returncode}: {proc.stderr[-1500:]}")
    self.torch = json.loads(out.read_text())
    return self.torch

  def _start_batch(self, key: str) -> int:
    if self.sizes["batch"]:
      return self.sizes["batch"][key]
    if "batch_start" in self.torch.get(f"pretrain_{key}", {}):
      return self.torch[f"pretrain_{key}"]["batch_start"]
    import jax  # pylint: disable=g-import-not-at-top
    limit = jax.devices()[0].memory_stats()["bytes_limit"]  # JAX's pool: 90% of the device (device_check)
    return device_shapes.batch_for_memory(int(key), limit / 0.9)

  # -- JAX --

  def parity(self, deadline: float) -> dict:
    import jax  # pylint: disable=g-import-not-at-top
    from jbert import weights  # pylint: disable=g-import-not-at-top
    from jbert.model import BertModel  # pylint: disable=g-import-not-at-top
    config, params = weights.load_pretrained(self.folder, BertModel, dtype="float32")
    reference = np.load(self.tmp / "torch_hidden.npy")
    inputs = {k: v.astype(np.int32) for k, v in self.parity_inputs.items()}
    real = inputs["attention_mask"].astype(bool)
    seq = real.shape[1]
    packed = _packed_rows(inputs, device_shapes.pack(real.sum(1), seq), seq)
    with jax.default_matmul_precision("highest"):
      apply = jax.jit(lambda p, b: BertModel(config).apply({"params": p}, **b).last_hidden_state)
      padded_out = np.asarray(apply(params, inputs))
      packed_out = np.asarray(apply(params, {k: v for k, v in packed.items() if k != "spans"}))
    packed_diff = max(float(np.abs(packed_out[r, a:b] - reference[i, :b - a]).max())
                      for i, (r, a, b) in packed["spans"].items())
    return {"parity_max_abs_diff": float(np.abs(padded_out - reference)[real].max()),
            "parity_packed_max_abs_diff": packed_diff, "rows": int(real.shape[0]), "seq": seq,
            "packed_rows": int(packed["input_ids"].shape[0]), "device": str(jax.devices()[0].device_kind)}

  def pretrain(self, deadline: float) -> dict:
    import jax  # pylint: disable=g-import-not-at-top
    from jbert.runtime import flops  # pylint: disable=g-import-not-at-top
    from jbert.tasks import Pretraining  # pylint: disable=g-import-not-at-top
    peak, peak_source = flops.peak_flops_per_device(jax.devices()[0])
    config = self.config.replace(dtype="bfloat16", attention_probs_dropout_prob=0.0, scan_layers=True)
    out = {"peak_flops": peak, "peak_source": peak_source, "attention_impl": config.attention_impl}
    for key in self.sizes["lengths"]:
      for packing in (False, True):
        name = f"{key}_{'packed' if packing else 'padded'}"
        if time.perf_counter() > deadline:
          out[name] = {"skipped": "time budget"}
          continue
        seq, masked = self.sizes["lengths"][key], self.sizes["masked"][key]
        task = _PackedPretraining(max_predictions=masked) if packing else Pretraining(max_predictions=masked)
        batch, run_config, fallback = self._start_batch(key), config, None
        while True:
          try:
            lengths = device_shapes.row_lengths(seq, 4 * self._start_batch(key))
            data, sequences = _pretrain_batch(lengths, batch, seq, masked, packing, self.config)
            result = _time_steps(run_config, task, data, self.sizes, deadline)
            break
          except Exception as e:  # pylint: disable=broad-except  (jaxlib's error type moves between releases)
            if "RESOURCE_EXHAUSTED" in str(e) and batch > 1:
              batch //= 2
            elif run_config.attention_impl != "xla":  # a kernel that fails here must not cost the numbers
              fallback = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
              run_config = run_config.replace(attention_impl="xla")
            else:
              raise
        if fallback:
          result["kernel_error"] = fallback
        model_flops = flops.train_flops_per_step(config, batch_size=batch, seq_len=seq, num_masked=masked)
        real = int(data["attention_mask"].sum())
        result.update(batch=batch, sequences=sequences, seq_per_s=sequences * result["steps_per_s"],
                      padding_fraction=1 - real / data["attention_mask"].size,
                      real_tokens_per_s=real * result["steps_per_s"],
                      mfu=model_flops * result["steps_per_s"] / peak)
        out[name] = result
    return out

  def finetune(self, deadline: float) -> dict:
    from configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
    from jbert import tasks  # pylint: disable=g-import-not-at-top
    cfg = finetune_config.get_config("sst2")
    task = tasks.build_task(cfg)
    batch_size, seq = self.sizes["finetune"]
    lengths = device_shapes.row_lengths(seq, batch_size)
    mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
    rng = np.random.default_rng(1)
    data = {"input_ids": rng.integers(_FIRST_WORD, self.config.vocab_size, (batch_size, seq)).astype(np.int32) * mask,
            "token_type_ids": np.zeros((batch_size, seq), np.int32), "attention_mask": mask,
            "label": rng.integers(0, 2, batch_size).astype(np.int32)}
    out = {"batch": batch_size, "seq": seq}
    for name, dropout in (("recipe", 0.1), ("fast", 0.0)):
      if time.perf_counter() > deadline:
        out[name] = {"skipped": "time budget"}
        continue
      config = self.config.replace(dtype="bfloat16", attention_probs_dropout_prob=dropout)
      try:
        out[name] = _time_steps(config, task, data, self.sizes, deadline, cfg=cfg)
      except Exception as e:  # pylint: disable=broad-except  (as in pretrain: XLA's kernel if the fused one fails)
        if config.attention_impl == "xla":
          raise
        out[name] = _time_steps(config.replace(attention_impl="xla"), task, data, self.sizes, deadline, cfg=cfg)
        out[name]["kernel_error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
    return out

  def embed(self, deadline: float) -> dict:
    import jbert  # pylint: disable=g-import-not-at-top
    _, batch, max_length = self.sizes["embed"]
    kwargs = dict(pooling="mean", dtype="bfloat16", batch_size=batch, max_length=max_length, progress=False)
    start = time.perf_counter()
    fallback = None
    try:
      jbert.embed(self.texts, str(self.folder), **kwargs)  # its programs compile: one per length bucket
    except Exception as e:  # pylint: disable=broad-except  (bf16 takes cuDNN's kernel; fp32 XLA's)
      fallback = f"{type(e).__name__}: {' '.join(str(e).split())[:300]}"
      kwargs["dtype"] = "float32"
      start = time.perf_counter()
      jbert.embed(self.texts, str(self.folder), **kwargs)
    first = time.perf_counter() - start
    start = time.perf_counter()
    got = jbert.embed(self.texts, str(self.folder), **kwargs)
    seconds = time.perf_counter() - start
    out = {"sentences": len(self.texts), "first_call_s": first, "seconds": seconds, "dtype": kwargs["dtype"],
           "sentences_per_s": len(self.texts) / seconds, **({"kernel_error": fallback} if fallback else {})}
    reference = self.tmp / "torch_embed.npy"
    if reference.exists():  # bf16 on both sides: agreement to bf16's precision, not fp32's
      want = np.load(reference)
      cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
      out.update(max_abs_diff_vs_sentence_transformers=float(np.abs(got - want).max()), min_cosine=float(cos.min()))
    return out


class _PackedPretraining:
  """Pretraining whose model also reads the batch's segment ids (several sequences per row)."""

  def __new__(cls, **kwargs):
    from jbert.tasks import Pretraining  # pylint: disable=g-import-not-at-top

    class Packed(Pretraining):
      def extra_inputs(self, batch):
        return {**super().extra_inputs(batch), "segment_ids": batch["segment_ids"]}

    return Packed(**kwargs)


def _packed_rows(inputs: dict, rows: list[list[int]], seq: int) -> dict:
  """The sequences of padded `inputs` laid end to end in `rows`, with segment ids and `spans`: sequence index ->
  its (row, start, end)."""
  real = inputs["attention_mask"].astype(bool)
  out = {k: np.zeros((len(rows), seq), np.int32) for k in ("input_ids", "token_type_ids", "attention_mask",
                                                           "segment_ids")}
  spans = {}
  for r, members in enumerate(rows):
    start = 0
    for k, i in enumerate(members):
      n = int(real[i].sum())
      for key in ("input_ids", "token_type_ids", "attention_mask"):
        out[key][r, start:start + n] = inputs[key][i, :n]
      out["segment_ids"][r, start:start + n] = k + 1
      spans[i] = (r, start, start + n)
      start += n
  out["spans"] = spans
  return out


def _pretrain_batch(lengths, batch: int, seq: int, masked: int, packing: bool, config: BertConfig):
  """A pretraining batch of `batch` rows: one sequence each (padded), or as many as first-fit packs (packed);
  `masked` MLM positions per row among its real tokens. Returns (batch, sequences in it)."""
  rng = np.random.default_rng(seq)
  rows = [r for r in device_shapes.pack(lengths, seq)][:batch] if packing else [[i] for i in range(batch)]
  ids = rng.integers(_FIRST_WORD, config.vocab_size, (len(lengths), seq)).astype(np.int32)
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  ids[:, 0] = _CLS
  single = {"input_ids": ids * mask, "token_type_ids": (np.arange(seq)[None] >= lengths[:, None] // 2) * mask,
            "attention_mask": mask}
  data = _packed_rows(single, rows, seq)
  data.pop("spans")
  if not packing:
    data.pop("segment_ids")
  real = data["attention_mask"].astype(bool)
  positions = np.stack([np.sort(rng.choice(np.flatnonzero(r)[1:], masked, replace=False)) for r in real])
  data.update(masked_lm_positions=positions.astype(np.int32),
              masked_lm_ids=np.take_along_axis(data["input_ids"], positions, 1).astype(np.int32),
              masked_lm_weights=np.ones((len(rows), masked), np.int32),
              next_sentence_labels=rng.integers(0, 2, len(rows)).astype(np.int32))
  np.put_along_axis(data["input_ids"], positions, _MASK, 1)
  return data, sum(len(r) for r in rows)


def _time_steps(config: BertConfig, task, data: dict, sizes: dict, deadline: float, cfg=None) -> dict:
  """Compile seconds and steps/s of jbert's train step (constant learning rate) for `task` on `data`."""
  import jax  # pylint: disable=g-import-not-at-top
  from jbert.train import optim  # pylint: disable=g-import-not-at-top
  if cfg is None:
    cfg = ml_collections.ConfigDict({"optim": optim.default_config()})
  train, _, state = jbert_step.constant_lr_train_step(cfg, task, task.model(config), (1, 8))
  batch = jax.device_put(data)
  start = time.perf_counter()
  train = train.lower(state, batch).compile()
  compile_s = time.perf_counter() - start
  for _ in range(2):
    state, metrics = train(state, batch)
  jax.block_until_ready(metrics)
  start, steps = time.perf_counter(), 0
  while steps < sizes["max_steps"] and (steps < 2 or time.perf_counter() - start < sizes["seconds"]):
    if time.perf_counter() > deadline and steps >= 2:
      break
    state, metrics = train(state, batch)
    jax.block_until_ready(metrics)
    steps += 1
  rate = steps / (time.perf_counter() - start)
  from jbert.model import attention  # pylint: disable=g-import-not-at-top
  kernel = attention.kernel(config, attention.current_platform(), data["input_ids"].shape[1], training=True)
  return {"compile_s": compile_s, "steps_per_s": rate, "timed_steps": steps, "loss": float(metrics["loss"]),
          "attention_impl": config.attention_impl, "attention": kernel}
