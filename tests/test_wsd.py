"""The warmup-stable-decay schedule (jbert/train/wsd.py) against the formula written out step by step."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jbert.train import optim


def _cfg(**overrides):
  cfg = optim.default_config()
  cfg.update(dict(schedule="wsd", **overrides))
  return cfg


def _reference(step, *, peak, end, warmup, total, decay, shape):
  """AnswerDotAI/ModernBERT's WarmupStableDecayScheduler (linear) and Hägele et al.'s 1-sqrt cooldown, per step."""
  if step < warmup:
    return peak * step / warmup
  if step < total - decay:
    return peak
  done = min((step - (total - decay)) / decay, 1.0)
  return end + (peak - end) * (1 - (done if shape == "linear" else math.sqrt(done)))


@pytest.mark.parametrize("shape", ["linear", "1-sqrt"])
@pytest.mark.parametrize("end", [0.0, 0.1])
def test_wsd_equals_the_formula_at_every_step(shape, end):
  kw = dict(peak=2.0, end=end, warmup=10, total=100, decay=30, shape=shape)
  schedule = optim.make_schedule(_cfg(learning_rate=2.0, end_learning_rate=end, warmup_steps=10, decay_steps=30,
                                      decay_shape=shape), total_steps=100)
  steps = np.arange(0, 111)
  got = np.asarray(jax.jit(jax.vmap(schedule))(jnp.asarray(steps, jnp.int32)))
  want = [_reference(int(s), **kw) for s in steps]
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  # The trapezoid's corners: the peak from warmup to the decay's start, end_learning_rate from total_steps on.
  assert got[10] == got[70] == pytest.approx(2.0) and got[100] == got[110] == pytest.approx(end)
  if shape == "1-sqrt":  # 1-sqrt falls faster than the line at first: a quarter of the way, half the drop
    assert got[70 + 30 // 4] < _reference(77, **dict(kw, shape="linear"))


def test_no_decay_holds_the_peak_to_the_end_without_warmup():
  schedule = optim.make_schedule(_cfg(learning_rate=8e-4, warmup_steps=0, decay_steps=0), total_steps=50)
  np.testing.assert_allclose([float(schedule(s)) for s in (0, 25, 49, 50, 80)], [8e-4] * 5, rtol=1e-6)


@pytest.mark.parametrize("overrides, match", [
    ({"decay_steps": 95}, r"optim.decay_steps=95 must be an int in \[0, total_steps - warmup_steps = 90\]"),
    ({"decay_steps": -1}, r"optim.decay_steps=-1 must be an int"),
    ({"decay_shape": "cosine"}, r"optim.decay_shape='cosine' is not a shape of the wsd schedule; use one of "
                                r"linear, 1-sqrt"),
])
def test_bad_settings_are_named(overrides, match):
  with pytest.raises(ValueError, match=match):
    optim.make_schedule(_cfg(warmup_steps=10, **overrides), total_steps=100)
