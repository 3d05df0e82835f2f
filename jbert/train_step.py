"""Train state, MLM+NSP losses and the pure train/eval steps.

The steps are plain functions of (state, batch); `jbert.train` jits them with explicit shardings. Losses are
normalised by totals over the WHOLE global batch (masked-token weight for MLM, sequences for NSP), computed before
any micro-batching, so k accumulated micro-batches produce the gradient of one k-times larger batch.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

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
  params_rng, dropout_rng = jax.random.split(rng)
  ids = jnp.zeros(input_shape, jnp.int32)
  params = model.init({"params": params_rng}, ids, deterministic=True)["params"]
  # Raw key data (uint32[2]) rather than a typed key, so Orbax stores it like any other array.
  return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                    rng=jax.random.key_data(dropout_rng))


# ----------------------------------------------------------------------------------------------------------
# Losses.
# ----------------------------------------------------------------------------------------------------------


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
  logits = logits.astype(jnp.float32)
  return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def pretraining_sums(model: nn.Module, params, batch: Batch, dropout_rng, *, deterministic: bool,
                     nsp: bool) -> dict[str, jax.Array]:
  """Un-normalised loss and accuracy sums of one (micro-)batch."""
  out = model.apply(
      {"params": params}, batch["input_ids"], token_type_ids=batch["token_type_ids"],
      attention_mask=batch["attention_mask"], masked_lm_positions=batch["masked_lm_positions"],
      deterministic=deterministic, rngs={"dropout": dropout_rng})
  weights = batch["masked_lm_weights"].astype(jnp.float32)                 # [B, P]
  mlm_nll = _cross_entropy(out.mlm_logits, batch["masked_lm_ids"])        # [B, P]
  mlm_hit = (jnp.argmax(out.mlm_logits, -1) == batch["masked_lm_ids"])    # [B, P]
  sums = {
      "mlm_nll": jnp.sum(mlm_nll * weights),
      "mlm_correct": jnp.sum(mlm_hit * weights),
      "mlm_weight": jnp.sum(weights),
      "sequences": jnp.asarray(batch["input_ids"].shape[0], jnp.float32),
  }
  if nsp:
    labels = batch["next_sentence_labels"].reshape(-1)                     # [B]
    sums["nsp_nll"] = jnp.sum(_cross_entropy(out.nsp_logits, labels))
    sums["nsp_correct"] = jnp.sum(jnp.argmax(out.nsp_logits, -1) == labels).astype(jnp.float32)
  return sums


def _loss_from_sums(sums, mlm_weight_total, sequences_total):
  # The 1e-5 mirrors the original BERT denominator and keeps an all-padding batch finite.
  loss = sums["mlm_nll"] / (mlm_weight_total + 1e-5)
  if "nsp_nll" in sums:
    loss = loss + sums["nsp_nll"] / sequences_total
  return loss


def _metrics_from_sums(sums) -> dict[str, jax.Array]:
  mlm_loss = sums["mlm_nll"] / (sums["mlm_weight"] + 1e-5)
  metrics = {"mlm_loss": mlm_loss, "mlm_accuracy": sums["mlm_correct"] / jnp.maximum(sums["mlm_weight"], 1.0)}
  loss = mlm_loss
  if "nsp_nll" in sums:
    metrics["nsp_loss"] = sums["nsp_nll"] / sums["sequences"]
    metrics["nsp_accuracy"] = sums["nsp_correct"] / sums["sequences"]
    loss = loss + metrics["nsp_loss"]
  metrics["loss"] = loss
  return metrics


# ----------------------------------------------------------------------------------------------------------
# Train step.
# ----------------------------------------------------------------------------------------------------------


def _micro_batches(batch: Batch, k: int) -> Batch:
  """[B, ...] -> [k, B/k, ...] such that micro-batch i takes rows i, i+k, i+2k, ...

  Strided rows keep every device's share of each micro-batch on that device: the batch is sharded in
  contiguous row blocks, and a block of B/D rows splits evenly into k strided micro-rows.
  """
  def split(x):
    return jnp.swapaxes(x.reshape((x.shape[0] // k, k) + x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def train_step(state: TrainState, batch: Batch, *, model: nn.Module, tx: optax.GradientTransformation,
               schedule: Callable[[jax.Array], jax.Array], grad_accum_steps: int = 1,
               nsp: bool = True) -> tuple[TrainState, dict[str, jax.Array]]:
  """One optimiser update on a global batch, optionally accumulated over `grad_accum_steps` micro-batches."""
  step_rng = jax.random.fold_in(jax.random.wrap_key_data(state.rng), state.step)
  mlm_weight_total = jnp.sum(batch["masked_lm_weights"].astype(jnp.float32))
  sequences_total = jnp.asarray(batch["input_ids"].shape[0], jnp.float32)

  def loss_fn(params, micro, rng):
    sums = pretraining_sums(model, params, micro, rng, deterministic=False, nsp=nsp)
    return _loss_from_sums(sums, mlm_weight_total, sequences_total), sums

  grad_fn = jax.grad(loss_fn, has_aux=True)
  if grad_accum_steps == 1:
    grads, sums = grad_fn(state.params, batch, step_rng)
  else:
    def body(carry, xs):
      grads_acc, sums_acc = carry
      index, micro = xs
      grads, sums = grad_fn(state.params, micro, jax.random.fold_in(step_rng, index))
      return (jax.tree.map(jnp.add, grads_acc, grads), jax.tree.map(jnp.add, sums_acc, sums)), None

    zero_grads = jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state.params)
    micro = _micro_batches(batch, grad_accum_steps)
    first = jax.tree.map(lambda x: x[0], micro)
    zero_sums = jax.tree.map(jnp.zeros_like, jax.eval_shape(
        lambda: pretraining_sums(model, state.params, first, step_rng, deterministic=True, nsp=nsp)))
    (grads, sums), _ = jax.lax.scan(body, (zero_grads, zero_sums), (jnp.arange(grad_accum_steps), micro))

  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = _metrics_from_sums(sums)
  metrics["grad_norm"] = optax.tree.norm(grads)
  metrics["learning_rate"] = schedule(state.step)
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, metrics


def eval_step(params, batch: Batch, *, model: nn.Module, nsp: bool = True) -> dict[str, jax.Array]:
  """Sums over one eval batch (no dropout); `summarise_eval` turns accumulated sums into metrics."""
  return pretraining_sums(model, params, batch, jax.random.key(0), deterministic=True, nsp=nsp)


def summarise_eval(sums: dict[str, Any]) -> dict[str, float]:
  return {k: float(v) for k, v in _metrics_from_sums(sums).items()}


def make_steps(model, tx, schedule, *, grad_accum_steps: int, nsp: bool):
  """Binds the static pieces; the caller jits with shardings."""
  return (functools.partial(train_step, model=model, tx=tx, schedule=schedule,
                            grad_accum_steps=grad_accum_steps, nsp=nsp),
          functools.partial(eval_step, model=model, nsp=nsp))
