"""The jitted steps with their shardings: what the trainer's loop runs and what `tpu/aot_compile.py` compiles for
TPU, and (`Steps.compile_ahead`) the programs of a length-bucketed run compiled before the loop meets them."""
from __future__ import annotations

import concurrent.futures
import dataclasses
from typing import Any, Callable, Iterable

import flax.linen as nn
import jax

from jbert import tasks as tasks_lib
from jbert.model import BertConfig
from jbert.runtime import ahead as ahead_lib
from jbert.runtime import sharding
from jbert.train import optim
from jbert.train import step as step_lib


@dataclasses.dataclass(frozen=True)
class Steps:
  """`abstract`/`shardings`: TrainStates of ShapeDtypeStructs/NamedShardings. `train(state, batch)` donates the
  state and returns (state, metrics); `predict(params, batch)` returns per-row outputs sharded like the batch.

  With several batch shapes (`split`, length buckets) `train` runs two programs, `grad` (state, batch) ->
  (grads, metrics), compiled per shape, then `update` (state, grads, metrics) -> (state, metrics), compiled
  once; with one shape, `fused` does both in one program."""
  model: nn.Module
  tx: Any
  abstract: step_lib.TrainState
  shardings: step_lib.TrainState
  data_sharding: jax.sharding.NamedSharding
  mesh: jax.sharding.Mesh
  rules: tuple
  split: bool
  fused: Any
  grad: Any
  update: Any
  predict: Any

  def train(self, state, batch):
    if not self.split:
      return self.fused(state, batch)
    grads, metrics = self.grad(state, batch)
    return self.update(state, grads, metrics)

  def abstract_state(self) -> step_lib.TrainState:
    """The state as ShapeDtypeStructs with their shardings: what lowering needs."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), self.abstract,
                        self.shardings)

  def _context(self):
    """What lowering reads from the thread: the mesh and the logical axis rules, re-entered in a worker."""
    return ahead_lib.nested(lambda: jax.set_mesh(self.mesh), lambda: nn.logical_axis_rules(self.rules))

  def compile_ahead(self, shapes: Iterable[tuple[int, int]], batch_spec: Callable[[tuple[int, int]], dict],
                    pool: concurrent.futures.Executor) -> "Steps":
    """These steps with the gradient program of each of `shapes` ((global rows, length): the order they will be
    met in) and the update program compiling in `pool` (`jbert.runtime.ahead`); the loop waits only for a program
    it needs that is not ready yet. `batch_spec(shape)`: the global batch's shapes and dtypes at that shape."""
    if not self.split:
      return self
    grad = ahead_lib.Ahead(self.grad, lambda state, batch: (batch["input_ids"].shape[0], batch["input_ids"].shape[-1]),
                           self._context(), pool)
    update = ahead_lib.Ahead(self.update, lambda *args: "update", self._context(), pool)
    state = self.abstract_state()
    shapes = [tuple(s) for s in dict.fromkeys(shapes)]
    for i, shape in enumerate(shapes):
      batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=self.data_sharding)
               for k, v in batch_spec(shape).items()}
      grad.submit(shape, state, batch)
      if i == min(1, len(shapes) - 1):
        # The update's inputs are the first gradient program's outputs; queued after the second gradient, so
        # that no worker waits idle for the first.
        update.submit_lazy("update", lambda: (state, *grad.program(shapes[0]).out_info))
    return dataclasses.replace(self, grad=grad, update=update)

  def compile_predict_ahead(self, batches: Iterable[dict[str, jax.ShapeDtypeStruct]],
                            pool: concurrent.futures.Executor) -> "Steps":
    """These steps with the predict program of each of `batches` (global evaluation batches' shapes) compiling
    in `pool`, after the programs queued there before: ready when the evaluation comes."""
    predict = ahead_lib.Ahead(self.predict, lambda params, batch: _shapes(batch), self._context(), pool)
    params = self.abstract_state().params
    for batch in batches:
      predict.submit(_shapes(batch), params, {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=self.data_sharding)
                                              for k, v in batch.items()})
    return dataclasses.replace(self, predict=predict)


def _shapes(batch) -> tuple:
  return tuple((k, tuple(v.shape)) for k, v in sorted(batch.items()))


def build_steps(config, task: tasks_lib.Task, bert_config: BertConfig, mesh, rules) -> Steps:
  """Model, optimiser, state layout and jitted steps; nothing is allocated or compiled. Call or lower the steps
  under `jax.set_mesh(mesh)` and `nn.logical_axis_rules(rules)`: activation constraints read them when tracing."""
  model = task.model(bert_config)
  schedule = optim.make_schedule(config.optim, config.total_steps)
  tx = optim.make_optimizer(config.optim, config.total_steps)
  key = jax.random.key(0)  # only its shape is used; made outside the mesh, which may be compile-only (AOT)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract, shardings = sharding.abstract_and_shardings(
        lambda r: step_lib.init_state(model, tx, r, task.head.dummy_shape), mesh, rules, key)
  fns = step_lib.make_steps(model, task, tx, schedule, grad_accum_steps=config.optim.grad_accum_steps)
  data_sharding, replicated = sharding.batch_sharding(mesh), sharding.replicated(mesh)
  fused = jax.jit(fns.train, in_shardings=(shardings, data_sharding), out_shardings=(shardings, replicated),
                  donate_argnums=0)
  grad = jax.jit(fns.grad, in_shardings=(shardings, data_sharding), out_shardings=(shardings.params, replicated))
  update = jax.jit(fns.update, in_shardings=(shardings, shardings.params, replicated),
                   out_shardings=(shardings, replicated), donate_argnums=0)
  predict = jax.jit(fns.predict, in_shardings=(shardings.params, data_sharding), out_shardings=data_sharding)
  # Buckets meet several lengths, packed batches up to two row counts: one update program serves them all.
  split = len(task.buckets() or ()) > 1 or task.packed_slots() is not None
  return Steps(model, tx, abstract, shardings, data_sharding, mesh, tuple(rules), split, fused, grad, update,
               predict)
