"""Evaluation batching: fixed shapes, every example exactly once over all processes."""
import numpy as np
import pytest

from jbert.data.finetune.batching import eval_batches, num_eval_batches


def _features(n):
  return {
      "input_ids": np.arange(n * 3, dtype=np.int32).reshape(n, 3),
      "example_id": np.arange(100, 100 + n, dtype=np.int32),
  }


@pytest.mark.parametrize("n,batch_size,process_count", [
    (10, 4, 1), (10, 4, 3), (10, 2, 4), (8, 4, 2), (3, 4, 4), (1, 2, 3), (0, 4, 2)])
def test_processes_cover_every_example_once(n, batch_size, process_count):
  features = _features(n)
  seen, batches_per_process = [], []
  for process_index in range(process_count):
    batches = list(eval_batches(features, batch_size, process_index, process_count))
    batches_per_process.append(len(batches))
    for batch in batches:
      assert batch["input_ids"].shape == (batch_size, 3) and batch["input_ids"].dtype == np.int32
      assert batch["mask"].shape == (batch_size,) and batch["mask"].dtype == np.int32
      # Rows keep their features together, padding rows included.
      np.testing.assert_array_equal(batch["input_ids"][:, 0], (batch["example_id"] - 100) * 3)
      seen += batch["example_id"][batch["mask"] == 1].tolist()
  assert sorted(seen) == list(range(100, 100 + n))
  assert batches_per_process == [num_eval_batches(n, batch_size, process_count)] * process_count


def test_known_layout_two_processes():
  # 5 examples over 2 processes: shares [0, 3) and [3, 5), 2 batches of 2 each.
  p0 = list(eval_batches(_features(5), 2, 0, 2))
  p1 = list(eval_batches(_features(5), 2, 1, 2))
  assert [b["example_id"].tolist() for b in p0] == [[100, 101], [102, 102]]
  assert [b["mask"].tolist() for b in p0] == [[1, 1], [1, 0]]
  assert [b["example_id"].tolist() for b in p1] == [[103, 104], [104, 104]]
  assert [b["mask"].tolist() for b in p1] == [[1, 1], [0, 0]]


def test_object_arrays_pass_through():
  features = _features(3) | {"qid": np.array(["a", "b", "c"], dtype=object)}
  (batch,) = eval_batches(features, 4)
  assert batch["qid"].tolist() == ["a", "b", "c", "c"]
  assert batch["mask"].tolist() == [1, 1, 1, 0]


@pytest.mark.parametrize("kwargs,message", [
    ({"batch_size": 0}, "batch_size must be >= 1"),
    ({"batch_size": 2, "process_index": 2, "process_count": 2}, r"process_index 2 is outside \[0, 2\)"),
])
def test_bad_arguments(kwargs, message):
  with pytest.raises(ValueError, match=message):
    next(eval_batches(_features(4), **kwargs))


def test_ragged_features_and_mask_key_are_rejected():
  with pytest.raises(ValueError, match="share their leading dimension"):
    next(eval_batches({"a": np.zeros(3), "b": np.zeros(4)}, 2))
  with pytest.raises(ValueError, match="already hold a 'mask'"):
    next(eval_batches({"mask": np.zeros(3)}, 2))
