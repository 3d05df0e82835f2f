"""Warmup-stable-decay (trapezoidal) learning rate, `optim.schedule='wsd'`: ModernBERT's (Warner et al. 2024).

Linear warmup from 0 to the peak over `warmup_steps`, the peak held, then over the last `optim.decay_steps` steps a
decay to `end_learning_rate`: linear (Xing et al. 2018's trapezoid, as AnswerDotAI/ModernBERT's
WarmupStableDecayScheduler) or `1-sqrt` (Hägele et al. 2024: peak - (peak - end) * sqrt(fraction of the decay
done), what ModernBERT's last context-extension phase decays with). `decay_steps=0` holds the peak to the end, as
ModernBERT's 1,024-token phase does: its run is continued, not annealed, by the long-context phase.
"""
from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import optax

from jbert.train import optim_registry

SHAPES = ("linear", "1-sqrt")

KEYS = {
    "decay_steps": 0,         # wsd: the last steps, decaying to end_learning_rate; 0: the peak held to the end
    "decay_shape": "linear",  # wsd: linear | 1-sqrt (lr = peak - (peak - end) * sqrt(fraction of the decay done))
}


@optim_registry.register_schedule("wsd", keys=KEYS)
def make(cfg: ml_collections.ConfigDict, total_steps: int) -> optax.Schedule:
  peak, end = float(cfg.learning_rate), float(cfg.end_learning_rate)
  warmup, total, decay = int(cfg.warmup_steps), int(total_steps), cfg.decay_steps
  if cfg.decay_shape not in SHAPES:
    raise ValueError(f"optim.decay_shape={cfg.decay_shape!r} is not a shape of the wsd schedule; use one of "
                     f"{', '.join(SHAPES)}.")
  if isinstance(decay, bool) or not isinstance(decay, int) or decay < 0 or decay > max(total - warmup, 0):
    raise ValueError(f"optim.decay_steps={decay!r} must be an int in [0, total_steps - warmup_steps = "
                     f"{max(total - warmup, 0)}]: the decay follows the warmup within total_steps={total}.")
  decay_start = total - decay

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    warm = peak * step / max(warmup, 1)
    done = jnp.clip((step - decay_start) / max(decay, 1), 0.0, 1.0)
    left = 1.0 - (done if cfg.decay_shape == "linear" else jnp.sqrt(done))
    # Without a decay there is no end to reach: the peak holds past total_steps too.
    stable_or_decay = jnp.where((step < decay_start) | (decay == 0), peak, end + (peak - end) * left)
    return jnp.where(step < warmup, warm, stable_or_decay)

  return schedule
