"""bench/step_parts.py without training a model: the step's halves timed apart, their matmul share of the peak and
the grouping of XLA's operation events."""
import types

import numpy as np
import pytest

from jbert.model import BertConfig
from jbert.runtime import flops
from jbert.train import programs
import script_module

bench = script_module.load("bench/step_parts.py")


class FakeSteps:
  """A split step whose gradient takes 30 ms and whose update takes 10 ms of a clock it advances."""
  split = True

  def __init__(self, clock):
    self.clock = clock

  def grad(self, state, batch):
    self.clock[0] += 0.03
    return {"g": np.ones(2)}, {}

  def update(self, state, grads, metrics):
    self.clock[0] += 0.01
    return state + 1, metrics


def test_the_halves_are_timed_apart_and_the_trainers_step_comes_back(monkeypatch):
  clock = [100.0]
  monkeypatch.setattr(bench, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
  record, captured = [], {}
  original = programs.Steps.train
  batch = {"input_ids": np.zeros((2, 4), np.int32), "attention_mask": np.array([[1, 1, 1, 0], [1, 1, 0, 0]])}
  with bench.timed_halves(record, captured):
    assert programs.Steps.train is not original
    state, _ = programs.Steps.train(FakeSteps(clock), 0, batch)
    state, _ = programs.Steps.train(FakeSteps(clock), state, batch)
  assert programs.Steps.train is original and state == 2
  assert [(shape, round(gradient, 6), round(update, 6), tokens) for shape, gradient, update, tokens in record] == [
      ((2, 4), 0.03, 0.01, 5), ((2, 4), 0.03, 0.01, 5)]
  assert list(captured) == [(2, 4)] and captured[(2, 4)][1] == 0  # the first batch of the shape, its state
  with bench.timed_halves(record):  # no copies of the state unless the profile asks for them
    programs.Steps.train(FakeSteps(clock), 0, batch)
  assert len(record) == 3


def test_a_failing_run_still_puts_the_trainers_step_back():
  original = programs.Steps.train
  with pytest.raises(RuntimeError):
    with bench.timed_halves([], {}):
      raise RuntimeError("the run failed")
  assert programs.Steps.train is original


def test_each_shape_leaves_out_its_first_step_and_rates_its_gradient_against_the_peak():
  config = BertConfig(vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=128)
  record = [((8, 64), 5.0, 1.0, 400), ((8, 64), 0.2, 0.04, 420), ((8, 64), 0.4, 0.06, 430),
            ((8, 64), 0.3, 0.05, 440), ((10, 64), 7.0, 0.05, 500)]
  out = bench.summarise(record, config, peak=1e9)
  assert list(out) == ["8x64"]  # 10x64's only step was its compile
  matmul = flops.train_flops_per_step(config, batch_size=8, seq_len=64, num_masked=0)
  assert out["8x64"] == {"steps": 3, "gradient_s": 0.3, "update_s": 0.05, "real_tokens": 430.0, "slots": 512,
                         "matmul_gflop": round(matmul / 1e9, 2), "gradient_of_peak": round(matmul / 0.3 / 1e9, 3)}
  # No MLM decoder in a classifier's step: 3 x (encoder, attention, pooler) of every slot.
  assert matmul == 3 * (2 * 2 * 512 * (4 * 64 * 64 + 2 * 64 * 128) + 2 * 2 * 2 * 8 * 64 * 64 * 64
                        + 2 * 8 * 64 * 64 + 2 * 8 * 64 * 2)


def test_operation_events_are_summed_per_call_into_matmuls_and_the_rest():
  events = [{"ph": "X", "name": n, "dur": d} for n, d in [
      ("ynn_fusion.3", 4000), ("ynn_fusion", 2000), ("dot.7", 1000), ("xnn_fusion.1", 1000),
      ("onednn_fusion", 500), ("wrapped_broadcast.18", 3000), ("multiply_erf_fusion.2", 1000),
      ("multiply_erf_fusion", 1000), ("dot_general_transpose_fusion", 500),
      ("ThunkExecutor::Execute", 90000), ("$trainer.py:1 f", 90000), ("end: ynn_fusion", 50)]]
  events.append({"ph": "M", "name": "thread_name", "dur": 0})
  assert bench.op_times(events, calls=2) == {
      "matmul_ms": 4.25, "other_ms": 2.75,
      "other_largest": {"wrapped_broadcast": 1.5, "multiply_erf_fusion": 1.0, "dot_general_transpose_fusion": 0.25}}
