"""A batch computed a few rows a call (`Runner(step_tokens=...)`, jbert.serve on a CPU): the same outputs as the
whole batch at once, packed or not, from programs of the step's shape under the function's own key; one device
only."""
import numpy as np
import pytest

from jbert.inference import runner as runner_lib
from jbert.inference import steps
from inference.test_runner import _features, _mesh, _params, hidden_fn


def test_a_step_takes_the_rows_its_tokens_hold():
  for length, step_tokens, want in ((16, 64, 4), (16, 40, 2), (16, 15, 1), (256, 512, 2), (32, 512, 16)):
    assert steps.rows_a_step(length, step_tokens) == want, (length, step_tokens)


def test_split_then_join_is_the_batch_and_padding_rows_are_not_computed():
  mask = np.ones((12, 16), np.int32)
  mask[7:] = 0  # a partial batch: 7 rows padded to 12
  batch = {"input_ids": np.arange(12 * 16).reshape(12, 16), "attention_mask": mask,
           "cls_positions": np.arange(12 * 2).reshape(12, 2)}
  parts = steps.split(batch, 64)
  assert [p["input_ids"].shape for p in parts] == [(4, 16), (3, 16)]  # the last step takes the 3 rows left
  joined = steps.join(parts, 12)
  for k, v in batch.items():
    np.testing.assert_array_equal(joined[k][:7], v[:7])
    np.testing.assert_array_equal(joined[k][7:], 0)  # what no input reads
  whole = {**batch, "attention_mask": np.ones_like(mask)}
  one = steps.split(whole, 1000)
  assert len(one) == 1 and steps.join(one, 12) is one[0]  # one step: nothing copied
  assert [p["input_ids"].shape for p in steps.split(batch, 1000)] == [(7, 16)]


def test_a_stepped_runner_lays_short_inputs_in_the_rows_that_leave_fewest_tokens():
  """32 inputs of 17-24 tokens: 6 rows of 128 (768 tokens) rather than one a row of 32 (1,024, a third padding)."""
  runner = runner_lib.Runner(hidden_fn, _params(), max_length=128, buckets=(32, 128), batch_size=32, mesh=_mesh(1),
                             packing=True, step_tokens=512)
  lengths = list(np.random.default_rng(0).integers(17, 25, 32))
  assert {(p.row_length, p.placement.rows) for p in runner._plan(lengths)} == {(128, 6)}  # pylint: disable=protected-access
  assert [p.row_length for p in runner._plan([9])] == [32]  # pylint: disable=protected-access  (a lone query)
  assert list(runner.row_counts(32)) == list(range(1, 17)) and list(runner.row_counts(128)) == [1, 2, 3, 4]


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
