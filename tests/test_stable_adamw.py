"""StableAdamW (jbert/train/stable_adamw.py) against optimi's algorithm (the optimiser ModernBERT trained with)
written out in NumPy: debiased betas, the per-tensor RMS update clipping, fully decoupled weight decay."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jbert.train import optim


def _optimi_reference(params, grads_seq, lrs, *, b1, b2, eps, wd, max_lr, decayed):
  """optimi.StableAdamW(decouple_lr=True, max_lr=max_lr), one foreach step per gradient, as its source does it.
  Returns the parameters after each step and the RMS of every tensor at every step."""
  def debias(beta, step):
    return (beta ** step - beta) / (beta ** step - 1)

  p = {k: np.asarray(v, np.float64).copy() for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(v) for k, v in p.items()}
  history, rms_seen = [], []
  for step, (grads, lr) in enumerate(zip(grads_seq, lrs), start=1):
    b1_comp, b2_hat = 1 - debias(b1, step), debias(b2, step)
    rms_step = {}
    for k in p:
      g = np.asarray(grads[k], np.float64)
      m[k] += b1_comp * (g - m[k])  # torch lerp_
      v[k] = v[k] * b2_hat + (1 - b2_hat) * g * g
      rms = np.sqrt(np.mean(g * g / np.maximum(v[k], eps * eps)))
      neg_lr = -lr / max(1.0, rms)
      if decayed[k]:
        p[k] *= 1 + neg_lr / max_lr * wd
      p[k] += neg_lr * m[k] / (np.sqrt(v[k]) + eps)
      rms_step[k] = rms
    history.append({k: x.copy() for k, x in p.items()})
    rms_seen.append(rms_step)
  return history, rms_seen


def test_stable_adamw_with_wsd_matches_optimi_step_by_step():
  rng = np.random.default_rng(0)
  params = {"embeddings": {"word_embeddings": {"embedding": rng.normal(size=(6, 4))}},
            "layer": {"kernel": rng.normal(size=(4, 3)), "bias": rng.normal(size=(3,))},
            "norm": {"scale": 1 + 0.1 * rng.normal(size=(4,))}}
  params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
  grads_seq = [jax.tree.map(lambda x: jnp.asarray(0.1 * rng.normal(size=x.shape), jnp.float32), params)
               for _ in range(5)]
  grads_seq[3] = jax.tree.map(lambda g: 30.0 * g, grads_seq[3])  # a spike: g^2 >> v_hat, the update is clipped
  peak, paper_wd = 8e-4, 1e-5
  cfg = optim.default_config()
  cfg.update(dict(name="stable_adamw", schedule="wsd", learning_rate=peak, warmup_steps=2, decay_steps=2,
                  decay_shape="1-sqrt", b1=0.9, b2=0.98, eps=1e-6, weight_decay=paper_wd / peak,
                  grad_clip_norm=0.0, decay_embeddings=False))
  tx = optim.make_optimizer(cfg, total_steps=5)
  schedule = optim.make_schedule(cfg, total_steps=5)
  state, got = tx.init(params), []
  p = params
  for grads in grads_seq:
    updates, state = jax.jit(tx.update)(grads, state, p)
    p = optax.apply_updates(p, updates)
    got.append(p)
  flat = lambda tree: {"/".join(str(k.key) for k in path): np.asarray(x)
                       for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
  decayed = {k: k == "layer/kernel" for k in flat(params)}  # not the bias, the norm or the embedding table
  # The schedule's lr of each update (optax counts the steps taken before it: 0, 1, ...).
  lrs = [float(schedule(s)) for s in range(5)]
  assert lrs[0] == 0.0 and lrs[2] == pytest.approx(peak) and 0 < lrs[4] < lrs[3] == pytest.approx(peak)
  want, rms = _optimi_reference(flat(params), [flat(g) for g in grads_seq], lrs, b1=0.9, b2=0.98, eps=1e-6,
                                wd=paper_wd, max_lr=peak, decayed=decayed)
  assert min(rms[3].values()) > 1.5 and all(r <= 1.0 + 1e-9 for r in rms[0].values())  # the spike is clipped
  for step, (got_p, want_p) in enumerate(zip(got, want)):
    for name, value in flat(got_p).items():
      np.testing.assert_allclose(value, want_p[name], rtol=1e-5, atol=1e-7, err_msg=f"step {step + 1}: {name}")
  # Update clipping changed the spike's step: plain AdamW from the same state moves further.
  cfg_adamw = cfg.copy_and_resolve_references()
  cfg_adamw.name = "adamw"
  adamw = optim.make_optimizer(cfg_adamw, total_steps=5)
  s = adamw.init(params)
  q = params
  for grads in grads_seq[:4]:
    u, s = adamw.update(grads, s, q)
    q = optax.apply_updates(q, u)
  moved = lambda a, b: float(np.abs(flat(a)["layer/kernel"] - flat(b)["layer/kernel"]).max())
  assert moved(got[3], got[2]) < 0.8 * moved(q, got[2])


def test_stable_adamw_state_is_adams_and_refuses_uncorrected_moments():
  params = {"kernel": jnp.ones((2, 2))}
  cfg = optim.default_config()
  cfg.update(dict(name="stable_adamw", warmup_steps=0))
  state = optim.make_optimizer(cfg, total_steps=3).init(params)
  assert any(isinstance(s, optax.ScaleByAdamState) for s in state)  # the moments take the params' shardings
  cfg.bias_correction = False
  with pytest.raises(ValueError, match=r"optim.bias_correction=False is BERT's uncorrected Adam; stable_adamw "
                                       r"always corrects"):
    optim.make_optimizer(cfg, total_steps=3)
