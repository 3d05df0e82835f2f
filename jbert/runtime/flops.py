"""Model FLOPs of BERT pretraining, per-device peak FLOP/s, model FLOPs utilisation (MFU), and the real
(non-padding) tokens that training's tokens/s and MFU count (`RealTokens`).

Only matmuls count (2 FLOPs per multiply-add); embeddings lookups, LayerNorm, softmax, GELU and biases are
left out, as is the recomputation of remat: MFU measures useful model work, not what the hardware executed.
"""
from __future__ import annotations

import functools
import logging
import time
from typing import Any

import jax
import jax.numpy as jnp

log = logging.getLogger(__name__)

# Dense bf16 peak FLOP/s of one JAX device, by `device.device_kind`. TPU v2/v3 expose each of a chip's two
# TensorCores as a device (half the chip's peak); v4 and later expose one device per chip (megacore).
_TPU_PEAKS = {
    "TPU v2": 22.5e12,
    "TPU v3": 61.5e12,
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5": 459e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
}
# NVIDIA datasheet dense bf16 tensor-core peaks; the first substring of the device kind that matches wins.
_GPU_PEAKS = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("H200", 989e12),
    ("A100", 312e12),
)
CPU_LABEL = "measured CPU matmul peak"


def forward_flops_by_part(bert_config: Any, *, batch_size: int, seq_len: int, num_masked: int | None = None,
                          nsp: bool = True) -> dict[str, int]:
  """Matmul FLOPs of one forward pass of BertForPreTraining, by part.

  With B = batch_size, T = seq_len, L layers, width H, MLP width F, vocabulary V and M = B * num_masked MLM
  positions (B * T when num_masked is None; 0 for the task heads, whose own matmuls are negligible):

    encoder_dense  L * 2BT * (4H² + 2HF)     Q, K, V, out projections and the two MLP matmuls (3HF gated:
                                             ModernBERT's GeGLU wi gives an input and a gate)
    attention      Σ_l 2 * 2BTK_lH           scores QKᵀ and the probability-weighted sum of V, all heads, over
                                             K_l = T keys per query (min(T, 2w + 1) on a layer whose window
                                             is w tokens each side: a sliding window costs O(T·w), not O(T²))
    mlm            2M * (H² + HV)            transform dense and the decoder tied to the word embeddings
    pooler, nsp    2B * H², 2B * 2H          only with nsp (the pooled [CLS] feeds only the NSP classifier)
  """
  b, t = batch_size, seq_len
  h, f, v, layers = (bert_config.hidden_size, bert_config.intermediate_size, bert_config.vocab_size,
                     bert_config.num_hidden_layers)
  m = b * (t if num_masked is None else num_masked)
  mlp = 3 if getattr(bert_config, "gated_mlp", False) else 2
  keys = sum(_keys_per_query(bert_config, index, t) for index in range(layers))
  return {
      "encoder_dense": layers * 2 * b * t * (4 * h * h + mlp * h * f),
      "attention": 2 * 2 * b * t * keys * h,
      "mlm": 2 * m * (h * h + h * v),
      "pooler": 2 * b * h * h if nsp else 0,
      "nsp": 2 * b * h * 2 if nsp else 0,
  }


def _keys_per_query(bert_config: Any, index: int, seq_len: int) -> int:
  window = bert_config.layer_window(index) if hasattr(bert_config, "layer_window") else None
  return seq_len if window is None else min(seq_len, 2 * window + 1)


def forward_flops(bert_config: Any, *, batch_size: int, seq_len: int, num_masked: int | None = None,
                  nsp: bool = True) -> int:
  """Total of `forward_flops_by_part`."""
  return sum(forward_flops_by_part(bert_config, batch_size=batch_size, seq_len=seq_len, num_masked=num_masked,
                                   nsp=nsp).values())


def train_flops_per_step(bert_config: Any, *, batch_size: int, seq_len: int, num_masked: int | None = None,
                         nsp: bool = True) -> int:
  """Model FLOPs of one optimiser step on `batch_size` sequences: 3 x forward.

  The backward pass costs two matmuls per forward matmul (gradients of activations and of weights).
  `batch_size` is the global batch; gradient accumulation does not change the count.
  """
  return 3 * forward_flops(bert_config, batch_size=batch_size, seq_len=seq_len, num_masked=num_masked,
                           nsp=nsp)


def measure_matmul_peak(dtype: Any = jnp.float32, n: int = 1024, repeats: int = 5,
                        device: jax.Device | None = None) -> float:
  """FLOP/s of the fastest of `repeats` jitted [n, n] @ [n, n] matmuls on `device`; cached per process."""
  device = device or jax.local_devices()[0]
  return _measure(device, jnp.dtype(dtype).name, n, repeats)


@functools.lru_cache(maxsize=None)
def _measure(device: jax.Device, dtype: str, n: int, repeats: int) -> float:
  return _matmul_flops(device, dtype, n, repeats)


def _matmul_flops(device: jax.Device, dtype: str, n: int, repeats: int) -> float:
  # Outside any mesh: the trainer measures again inside its own, under which jax.random's array and jit's
  # program would span every device of every process (device_put and jit then refuse the one device).
  with jax.set_mesh(None):
    x = jax.device_put(jax.random.normal(jax.random.key(0), (n, n), dtype), device)
    matmul = jax.jit(jnp.matmul)
    matmul(x, x).block_until_ready()  # compile (once per process: jit's cache)
    best = float("inf")
    for _ in range(repeats):
      start = time.perf_counter()
      matmul(x, x).block_until_ready()
      best = min(best, time.perf_counter() - start)
  return 2 * n**3 / best


def peak_flops_per_device(device: jax.Device | None = None) -> tuple[float, str]:
  """(peak FLOP/s of one device, where the number comes from).

  TPUs and NVIDIA GPUs: the bf16 datasheet peak. CPU: a measured float32 matmul peak of the host divided by
  the process's CPU devices, which share the host's cores (8 with
  `--xla_force_host_platform_device_count=8`), so that `peak * device_count` is the host's peak. Other
  accelerators: a measured bf16 matmul peak, with a warning.
  """
  device = device or jax.local_devices()[0]
  kind = device.device_kind
  if device.platform == "cpu":
    cpu_devices = len(jax.local_devices(backend="cpu"))
    return measure_matmul_peak(jnp.float32, device=device) / cpu_devices, CPU_LABEL
  if kind in _TPU_PEAKS:
    return _TPU_PEAKS[kind], f"{kind} bf16 peak"
  for name, peak in _GPU_PEAKS:
    if name in kind:
      return peak, f"{name} bf16 peak"
  log.warning("no peak FLOP/s on record for device kind %r; MFU uses a measured bf16 matmul peak.", kind)
  return measure_matmul_peak(jnp.bfloat16, n=8192, device=device), f"measured {kind} bf16 matmul peak"


class Peak:
  """The per-device peak that MFU divides by, as training goes on (`peak_flops_per_device` at the start).

  A datasheet peak is fixed. A CPU's is measured, and on a host shared with other processes a measurement taken
  while they ran is low (1024² float32 matmuls gave 16.7 to 34.2 GFLOP/s within a minute on a loaded 2-core
  host, docs/pretraining.md), which put MFU above 100% whenever the steps then ran in a quieter moment.
  `refresh()`, called where a progress line is due (the devices idle), measures again at most every `every_s`
  (two matmuls, ~0.1 s) and keeps the highest: a host that reached a rate once can reach it.
  """

  def __init__(self, device: jax.Device | None = None, *, every_s: float = 60.0, clock=time.monotonic,
               measure=None):
    self.device = device or jax.local_devices()[0]
    self.value, self.label = peak_flops_per_device(self.device)
    self.measured = self.label == CPU_LABEL
    cpu_devices = len(jax.local_devices(backend="cpu")) if self.measured else 1
    self._measure = measure or (lambda: _matmul_flops(self.device, "float32", 1024, 2) / cpu_devices)
    self._every_s, self._clock = every_s, clock
    self._last = clock()

  def refresh(self) -> tuple[float, float]:
    """(the peak now, seconds this call spent measuring: the caller leaves them out of its step rate)."""
    if not self.measured or self._clock() - self._last < self._every_s:
      return self.value, 0.0
    start = time.perf_counter()
    self.value = max(self.value, self._measure())
    self._last = self._clock()
    return self.value, time.perf_counter() - start


def mfu(flops_per_step: float, step_time_s: float, peak: float) -> float:
  """Model FLOPs utilisation: `flops_per_step / step_time_s / peak`, with `peak` over the same devices."""
  if step_time_s <= 0 or peak <= 0:
    raise ValueError(f"mfu needs a positive step time and peak, got step_time_s={step_time_s}, peak={peak}.")
  return flops_per_step / step_time_s / peak


class RealTokens:
  """The real (attended) tokens of the steps since the last `window`: tokens/s, MFU and the padding fraction
  count them, not padding. Each step's count is the train step's `real_tokens` over the global batch, kept on the
  device until the log line reads it; the model FLOPs of a step are `step_flops(key)` (key: the trainer's global
  (rows, length), bucketed or packed) scaled to its real tokens."""

  def __init__(self, step_flops):
    self._step_flops, self._flops_at = step_flops, {}
    self.reset()

  def reset(self):
    self._steps = []

  def add(self, real_tokens, padded_tokens: int, key) -> None:
    self._steps.append((real_tokens, padded_tokens, key))

  def window(self) -> tuple[float, float, float]:
    """(real tokens per step, padding fraction, model FLOPs per step) over the steps since the last window."""
    steps, self._steps = self._steps, []
    if not steps:
      return 0.0, 0.0, 0.0
    real = [float(r) for r in jax.device_get([r for r, _, _ in steps])]
    padded = sum(p for _, p, _ in steps)
    for length in {n for _, _, n in steps} - self._flops_at.keys():
      self._flops_at[length] = self._step_flops(length)
    flops = sum(self._flops_at[n] * r / p for r, (_, p, n) in zip(real, steps))
    return sum(real) / len(steps), 1.0 - sum(real) / padded, flops / len(steps)
