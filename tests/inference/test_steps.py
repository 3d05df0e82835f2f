"""A batch computed a few rows a call (`Runner(step_tokens=...)`, jbert.serve on a CPU): the same outputs as the
whole batch at once, packed or not, from programs of the step's shape under the function's own key; one device
only."""
import numpy as np
import pytest

from jbert.inference import runner as runner_lib
from jbert.inference import steps
from inference.test_runner import _features, _mesh, _params, hidden_fn


def test_rows_a_step_is_the_largest_divisor_within_the_tokens():
  for rows, length, step_tokens, want in ((12, 16, 64, 4), (12, 16, 40, 2), (12, 16, 15, 1), (12, 16, 1000, 12),
                                          (32, 256, 512, 2), (7, 16, 64, 1)):
    assert steps.rows_a_step(rows, length, step_tokens) == want, (rows, length, step_tokens)


def test_split_then_join_is_the_batch_and_steps_of_padding_rows_are_not_computed():
  mask = np.ones((12, 16), np.int32)
  mask[6:] = 0  # a partial batch: 6 rows padded to 12
  batch = {"input_ids": np.arange(12 * 16).reshape(12, 16), "attention_mask": mask,
           "cls_positions": np.arange(12 * 2).reshape(12, 2)}
  parts = steps.split(batch, 64)
  assert [p is None for p in parts] == [False, False, True]  # rows 8-11 are padding only
  assert [p["input_ids"].shape for p in parts[:2]] == [(4, 16)] * 2
  joined = steps.join(parts)
  for k, v in batch.items():
    np.testing.assert_array_equal(joined[k][:8], v[:8])
    np.testing.assert_array_equal(joined[k][8:], 0)  # what no input reads
  whole = {**batch, "attention_mask": np.ones_like(mask)}
  assert steps.join([whole]) is whole  # one step: nothing copied
  assert len(steps.split(whole, 1000)) == 1


def test_outputs_equal_the_whole_batchs_from_programs_of_the_steps_shape():
  """Unpacked rows here; packed ones through jbert.serve, whose answers equal jbert.embed's (tests/serve)."""
  params = _params()
  features = _features(45, seed=4)
  traced = []

  def recording_fn(params, batch):
    traced.append(batch["input_ids"].shape)
    return hidden_fn(params, batch)

  kw = dict(max_length=40, batch_size=16, mesh=_mesh(1))
  whole = runner_lib.Runner(hidden_fn, params, key="steps-whole", **kw)
  stepped = runner_lib.Runner(recording_fn, params, key="steps-stepped", step_tokens=48, **kw)
  got, want = stepped.run(features), whole.run(features)
  assert traced and all(rows * length <= 48 or rows == 1 for rows, length in traced), traced
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
