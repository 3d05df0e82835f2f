"""Train state and the pure train and predict steps, for any task (`jbert.tasks.Task`).

The steps are plain functions of (state, batch); `jbert.train.trainer` jits them with explicit shardings. A task's
loss entries are sums with denominators (`jbert.tasks.base.Weighted`); each micro-batch's objectives are divided by
the denominators of the WHOLE global batch, so k accumulated micro-batches produce the gradient of one k-times
larger batch.

Every step reports `nonfinite` (1 when its loss, gradient norm or updated parameters hold a NaN or inf). The
loop reads it before it logs or saves that step's state, so a checkpoint never holds non-finite weights. The
check is one fused reduction over the parameters; keeping the old state with a select would instead read and
write the parameters and both Adam moments once more every step.

A step is `grad_step` then `update_step`. `train_step` is both in one program; with length-bucketed batches the
trainer jits them apart instead, so the update (its program depends only on the parameters) compiles once and
each bucket length compiles the gradient alone: on CPU that halves the compile time per bucket.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from jbert.tasks import base as tasks_base

Batch = dict[str, jax.Array]


@flax.struct.dataclass
class TrainState:
  """Everything a resumed run needs besides the data iterator. `rng` never changes: per-step keys are folded
  from it and the step, so a restored run draws exactly the dropout masks the uninterrupted run would have."""
  step: jax.Array
  params: Any
  opt_state: Any
  rng: jax.Array

  def as_dict(self) -> dict[str, Any]:
    return {"step": self.step, "params": self.params, "opt_state": self.opt_state, "rng": self.rng}

  @classmethod
  def from_dict(cls, d: dict[str, Any]) -> "TrainState":
    return cls(step=d["step"], params=d["params"], opt_state=d["opt_state"], rng=d["rng"])


def init_state(model: nn.Module, tx: optax.GradientTransformation, rng: jax.Array, input_shape) -> TrainState:
  """Boxed (logically partitioned) state; `jax.eval_shape` of this gives the shardings, `nn.meta.unbox` of a
  jitted call gives the real state."""
  params_rng, _ = jax.random.split(rng)
  ids = jnp.zeros(input_shape, jnp.int32)
  params = model.init({"params": params_rng}, ids, deterministic=True)["params"]
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    rng=dropout_key_data(rng))


def dropout_key_data(rng: jax.Array) -> jax.Array:
  """The state's `rng` as `init_state` derives it from the run's key: raw key data (uint32[2]) rather than a
  typed key, so Orbax stores it like any other array."""
  return jax.random.key_data(jax.random.split(rng)[1])


def _micro_batches(batch: Batch, k: int) -> Batch:
  """[B, ...] -> [k, B/k, ...] such that micro-batch i takes rows i, i+k, i+2k, ...

  Strided rows keep every device's share of each micro-batch on that device: the batch is sharded in
  contiguous row blocks, and a block of B/D rows splits evenly into k strided micro-rows.
  """
  def split(x):
    return jnp.swapaxes(x.reshape((x.shape[0] // k, k) + x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def _all_finite(tree) -> jax.Array:
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)]))


def global_denominators(task, model: nn.Module, params, batch: Batch, rng) -> dict[str, jax.Array]:
  """The denominators of the task's loss entries over the whole global `batch`: `task.loss` on zero outputs of the
  model's output shapes (`jax.eval_shape`: nothing runs), of which only the denominators, which depend on the batch
  alone, are used, so XLA computes nothing else."""
  shapes = jax.eval_shape(lambda p, b, r: task.apply(model, p, b, r, deterministic=True), params, batch, rng)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
  return {name: entry.denominator for name, entry in task.loss(zeros, batch).items()}


def grad_step(state: TrainState, batch: Batch, *, model: nn.Module, task,
              grad_accum_steps: int = 1) -> tuple[Any, dict[str, jax.Array]]:
  """The gradient of a global batch's loss, optionally accumulated over `grad_accum_steps` micro-batches, and
  the task's reported metrics. The only half of a step whose program depends on the batch's shape.

  Each micro-batch's objectives are divided by the global batch's denominators, so the accumulated gradient is
  the whole batch's (`jbert.tasks.base.Weighted`)."""
  step_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
  denominators = None  # one micro-batch: the batch's own
  if grad_accum_steps > 1:
    denominators = global_denominators(task, model, state.params, batch, step_rng)

  def loss_fn(params, micro, rng):
    entries = task.loss(task.apply(model, params, micro, rng, deterministic=False), micro)
    return tasks_base.training_loss(task, entries, denominators), entries

  grad_fn = jax.grad(loss_fn, has_aux=True)
  if grad_accum_steps == 1:
    grads, entries = grad_fn(state.params, batch, step_rng)
  else:
    def body(carry, xs):
      grads_acc, entries_acc = carry
      index, micro = xs
      grads, entries = grad_fn(state.params, micro, jax.random.fold_in(step_rng, index))
      return (jax.tree.map(jnp.add, grads_acc, grads), jax.tree.map(jnp.add, entries_acc, entries)), None

    zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
    micro = _micro_batches(batch, grad_accum_steps)
    first = jax.tree.map(lambda x: x[0], micro)
    zero_entries = jax.tree.map(jnp.zeros_like, jax.eval_shape(
        lambda: task.loss(task.apply(model, state.params, first, step_rng, deterministic=True), first)))
    (grads, entries), _ = jax.lax.scan(body, (zero_grads, zero_entries), (jnp.arange(grad_accum_steps), micro))

  metrics = tasks_base.reported(task, entries)
  # The attended tokens of the global batch: tokens/s, MFU and the padding fraction count them.
  metrics["real_tokens"] = jnp.sum(batch["attention_mask"] != 0, dtype=jnp.int32)
  return grads, metrics


def update_step(state: TrainState, grads, metrics: dict[str, jax.Array], *, tx: optax.GradientTransformation,
                schedule: Callable[[jax.Array], jax.Array]) -> tuple[TrainState, dict[str, jax.Array]]:
  """The optimiser update from `grad_step`'s gradients; its program depends on the parameters' shapes only."""
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics)
  metrics["grad_norm"] = optax.tree.norm(grads)
  metrics["learning_rate"] = schedule(state.step)
  finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"]) & _all_finite(params)
  metrics["nonfinite"] = (~finite).astype(jnp.int32)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics


def train_step(state: TrainState, batch: Batch, *, model: nn.Module, task, tx: optax.GradientTransformation,
               schedule: Callable[[jax.Array], jax.Array],
               grad_accum_steps: int = 1) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimiser update on a global batch: `grad_step` then `update_step`, in one program."""
  grads, metrics = grad_step(state, batch, model=model, task=task, grad_accum_steps=grad_accum_steps)
  return update_step(state, grads, metrics, tx=tx, schedule=schedule)


def predict_step(params, batch: Batch, *, model: nn.Module, task) -> dict[str, jax.Array]:
  """Per-row outputs of one evaluation batch (no dropout), as the task defines them."""
  outputs = task.apply(model, params, batch, jax.random.key(0), deterministic=True)
  return task.predictions(outputs, batch)


class StepFns(NamedTuple):
  """The steps with their static pieces bound; the caller jits them with shardings."""
  train: Callable  # (state, batch) -> (state, metrics): grad and update in one program
  grad: Callable  # (state, batch) -> (grads, metrics)
  update: Callable  # (state, grads, metrics) -> (state, metrics)
  predict: Callable  # (params, batch) -> per-row outputs


def make_steps(model, task, tx, schedule, *, grad_accum_steps: int) -> StepFns:
  return StepFns(
      functools.partial(train_step, model=model, task=task, tx=tx, schedule=schedule,
                        grad_accum_steps=grad_accum_steps),
      functools.partial(grad_step, model=model, task=task, grad_accum_steps=grad_accum_steps),
      functools.partial(update_step, tx=tx, schedule=schedule),
      functools.partial(predict_step, model=model, task=task))
