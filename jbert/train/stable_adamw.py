"""StableAdamW (Wortsman et al. 2023), `optim.name='stable_adamw'`: the optimiser ModernBERT pretrains with.

AdamW whose step on each tensor is divided by max(1, RMS), RMS = sqrt(mean(g^2 / max(v_hat, eps^2))) over the
tensor (Adafactor's update clipping, applied as a per-tensor learning rate): a tensor whose gradient outgrows its
second-moment estimate, the start of a loss spike, takes a smaller step, which replaces gradient clipping
(ModernBERT clips nothing). As optimi's StableAdamW (the implementation ModernBERT trained with): bias-corrected
moments (optimi's debiased betas are the same m_hat and v_hat), eps outside the square root, v_hat of this step
in RMS, and the decay scaled by the same per-tensor factor as the Adam step. Its state is optax's
`ScaleByAdamState`, as AdamW's, so the moments take the parameters' shardings.

Weight decay is decoupled as everywhere in jbert: param -= lr * weight_decay * param. optimi's `decouple_lr`
(ModernBERT's 1e-5) is per step, independent of the peak: it is jbert's weight_decay times the peak learning rate
(configs/modernbert.py sets weight_decay = 1e-5 / learning_rate).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from jbert.train import optim_registry


def scale_by_stable_adam(b1: float, b2: float, eps: float, weight_decay: float,
                         mask: Any) -> optax.GradientTransformation:
  """Gradients -> (m_hat / (sqrt(v_hat) + eps) + weight_decay * param [where mask]) / max(1, RMS) per tensor."""
  def init_fn(params):
    return optax.ScaleByAdamState(count=jnp.zeros([], jnp.int32), mu=optax.tree.zeros_like(params),
                                  nu=optax.tree.zeros_like(params))

  def update_fn(updates, state, params=None):
    if weight_decay and params is None:
      raise ValueError("stable_adamw's weight decay needs the parameters: call update(grads, state, params).")
    count = optax.safe_increment(state.count)
    mu = optax.tree.update_moment(updates, state.mu, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
    mu_hat = optax.tree.bias_correction(mu, b1, count)
    nu_hat = optax.tree.bias_correction(nu, b2, count)
    if params is None:  # no decay: any tree of the gradients' structure stands in for the parameters
      params, decays = updates, jax.tree.map(lambda _: False, updates)
    else:
      decays = mask(params) if callable(mask) else mask

    def step(g, m, v, p, decayed):
      g32, v32 = g.astype(jnp.float32), v.astype(jnp.float32)
      rms = jnp.sqrt(jnp.mean(jnp.square(g32) / jnp.maximum(v32, eps * eps)))
      direction = m / (jnp.sqrt(v) + eps)
      if weight_decay and decayed:
        direction = direction + weight_decay * p
      return (direction / jnp.maximum(1.0, rms).astype(direction.dtype)).astype(g.dtype)

    out = jax.tree.map(step, updates, mu_hat, nu_hat, params, decays)
    return out, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformation(init_fn, update_fn)


@optim_registry.register_optimizer("stable_adamw")
def make(cfg: ml_collections.ConfigDict, mask: Any) -> list[optax.GradientTransformation]:
  if not cfg.bias_correction:
    raise ValueError("optim.bias_correction=False is BERT's uncorrected Adam; stable_adamw always corrects its "
                     "moments (its RMS compares g^2 with v_hat): drop the override or use optim.name='adamw'.")
  return [scale_by_stable_adam(float(cfg.b1), float(cfg.b2), float(cfg.eps), float(cfg.weight_decay), mask)]
