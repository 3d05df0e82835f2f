"""A batch computed a few rows at a time inside its program (`Runner(step_tokens=...)`, jbert.serve on a CPU): the
same outputs as the whole batch at once, packed or not, other programs under other keys, one device only."""
import jax
import numpy as np
import pytest

from jbert.inference import runner as runner_lib
from jbert.inference import steps
from inference.test_runner import _features, _mesh, _params, hidden_fn


def test_rows_a_step_is_the_largest_divisor_within_the_tokens():
  seen = []

  def fn(params, batch):
    del params
    seen.append(batch["input_ids"].shape)
    return {"sum": batch["input_ids"].sum(axis=1), "tokens": batch["input_ids"] * 2}

  ids = np.arange(12 * 16, dtype=np.int32).reshape(12, 16)
  for step_tokens, rows in ((64, 4), (40, 2), (15, 1), (1000, 12)):
    seen.clear()
    out = jax.jit(lambda b, t=step_tokens: steps.in_steps(fn, t, None, b))({"input_ids": ids})
    assert seen == [(rows, 16)], step_tokens  # traced once, at the step's shape
    np.testing.assert_array_equal(out["sum"], ids.sum(axis=1))
    np.testing.assert_array_equal(out["tokens"], ids * 2)


def test_outputs_equal_the_whole_batchs():
  """Unpacked rows here; packed ones through jbert.serve, whose answers equal jbert.embed's (tests/serve)."""
  params = _params()
  features = _features(45, seed=4)
  kw = dict(max_length=40, batch_size=16, mesh=_mesh(1))
  whole = runner_lib.Runner(hidden_fn, params, key="steps-whole", **kw)
  stepped = runner_lib.Runner(hidden_fn, params, key="steps-whole", step_tokens=48, **kw)
  assert stepped.key != whole.key  # another program, cached and stored apart
  before = runner_lib.compiled_count()
  got, want = stepped.run(features), whole.run(features)
  assert runner_lib.compiled_count() - before > 1
  for a, b in zip(got, want):
    np.testing.assert_allclose(a["hidden"], b["hidden"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(a["pooled"], b["pooled"], atol=1e-5, rtol=0)


def test_no_tokens_is_refused():
  with pytest.raises(ValueError, match="step_tokens=0: a positive number of tokens"):
    runner_lib.Runner(hidden_fn, _params(), max_length=40, mesh=_mesh(1), step_tokens=0)


@pytest.mark.devices(8)
def test_more_than_one_device_is_refused():
  with pytest.raises(ValueError, match="on a one-device mesh only"):
    runner_lib.Runner(hidden_fn, _params(), max_length=40, mesh=_mesh(2), step_tokens=64)
