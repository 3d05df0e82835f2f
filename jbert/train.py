"""MLM+NSP pretraining: `train_and_evaluate(config, workdir)`, one code path from 1 CPU to a pod.

Reads top-down: validate → mesh → model/optimiser → state (resume, init_from or fresh) → data → jitted steps →
loop (log, evaluate, checkpoint, stop on preemption or a non-finite loss).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import signal
from typing import Any

import flax.linen as nn
import jax
import ml_collections
import numpy as np

from jbert import checkpoint as ckpt_lib
from jbert import flops as flops_lib
from jbert import metrics as metrics_lib
from jbert import optim
from jbert import sharding
from jbert import train_step as step_lib
from jbert.data import loader as data_loader
from jbert.model import BertConfig, BertForPreTraining

log = logging.getLogger("jbert")


class TrainingError(RuntimeError):
  """The run cannot go on; the message says why and what to do."""


# ----------------------------------------------------------------------------------------------------------
# Configuration → model config, mesh and data layout, all checked before anything compiles.
# ----------------------------------------------------------------------------------------------------------


def bert_config_from(model_cfg: ml_collections.ConfigDict, vocab_size: int) -> BertConfig:
  """The preset named by `model.preset`, with every non-None key of `model` overriding it."""
  fields = {k: v for k, v in model_cfg.items() if k != "preset" and v is not None}
  if fields.get("vocab_size", vocab_size) < vocab_size:
    raise ValueError(f"config.model.vocab_size={fields['vocab_size']} is smaller than the tokenizer's vocabulary "
                     f"({vocab_size}); set it to None to use the tokenizer's size.")
  fields.setdefault("vocab_size", vocab_size)
  return BertConfig.from_preset(model_cfg.preset, **fields)


@dataclasses.dataclass(frozen=True)
class Layout:
  """Where each process's rows come from: `num_shards` data shards, a contiguous block per process."""
  num_shards: int
  shards: tuple[int, ...]
  rows_per_shard: int


def data_layout(config, mesh) -> Layout:
  batch, procs = config.batch_size, jax.process_count()
  dp = sharding.data_parallel_size(mesh)
  if batch % dp:
    raise ValueError(f"batch_size={batch} (global) is not divisible by the data-parallel size "
                     f"mesh.data×mesh.fsdp={dp}; use a multiple of {dp}.")
  accum = config.optim.grad_accum_steps
  if (batch // dp) % accum:
    raise ValueError(f"the per-device batch {batch // dp} is not divisible by optim.grad_accum_steps={accum}.")
  num_shards = config.data.num_shards or procs
  if num_shards % procs or batch % num_shards:
    raise ValueError(f"data.num_shards={num_shards} must be a multiple of the {procs} processes and divide "
                     f"batch_size={batch}.")
  per_proc = num_shards // procs
  first = jax.process_index() * per_proc
  return Layout(num_shards, tuple(range(first, first + per_proc)), batch // num_shards)


def validate(config, bert_config: BertConfig, mesh) -> Layout:
  tensor = mesh.shape["tensor"]
  if bert_config.num_attention_heads % tensor:
    raise ValueError(f"num_attention_heads={bert_config.num_attention_heads} is not divisible by "
                     f"mesh.tensor={tensor}; choose mesh.tensor among the divisors of the head count.")
  if config.data.max_seq_length > bert_config.max_position_embeddings:
    raise ValueError(f"data.max_seq_length={config.data.max_seq_length} exceeds max_position_embeddings="
                     f"{bert_config.max_position_embeddings}.")
  return data_layout(config, mesh)


# ----------------------------------------------------------------------------------------------------------
# State: shardings from `jax.eval_shape`, then resume → init_from → fresh.
# ----------------------------------------------------------------------------------------------------------


def initial_state(config, ckpt, model, tx, bert_config, mesh, shardings, abstract, layout):
  """Where the run's state comes from, in this order:

  1. the latest complete checkpoint in WORKDIR/checkpoints (resume; data iterators restored too);
  2. `config.init_from`: parameters only, through `jbert.load_pretrained` (jbert, HF or TF1 checkpoints), with
     a fresh optimiser and step 0;
  3. fresh initialisation from `config.seed`.
  Orbax only lists finalised steps, so a partially written checkpoint is never restored.
  Returns (state, data_states or None, source description).
  """
  step = ckpt.latest_step()
  if step is not None:
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract.as_dict(), shardings.as_dict())
    restored, data_states = ckpt.restore(step, target, shards=layout.shards)
    return step_lib.TrainState.from_dict(restored), data_states, f"resumed from checkpoint step {step}"

  init = jax.jit(lambda r: nn.meta.unbox(step_lib.init_state(model, tx, r, (1, 8))), out_shardings=shardings)
  state = init(jax.random.key(config.seed))
  if not config.init_from:
    return state, None, "fresh initialisation"

  from jbert import weights  # pylint: disable=g-import-not-at-top  (TF/torch only when needed)
  runtime = {k: getattr(bert_config, k) for k in ("dtype", "param_dtype", "scan_layers", "remat_policy",
                                                   "attention_impl")}
  loaded_config, params = weights.load_pretrained(config.init_from, BertForPreTraining, **runtime)
  arch = [f for f in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "intermediate_size", "max_position_embeddings", "type_vocab_size")
          if getattr(loaded_config, f) != getattr(bert_config, f)]
  if arch:
    diffs = ", ".join(f"{f}: checkpoint {getattr(loaded_config, f)} vs config {getattr(bert_config, f)}" for f in arch)
    raise TrainingError(f"init_from={config.init_from} has another architecture ({diffs}); set config.model "
                        "to match it.")
  params = jax.device_put(params, shardings.params)
  opt_init = jax.jit(tx.init, out_shardings=shardings.opt_state)
  return state.replace(params=params, opt_state=opt_init(params)), None, f"parameters from {config.init_from}"


# ----------------------------------------------------------------------------------------------------------
# The jitted steps with their shardings: what the loop runs and what `tpu/aot_compile.py` compiles for TPU.
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StepSetup:
  """`abstract`/`shardings`: TrainStates of ShapeDtypeStructs/NamedShardings. `train(state, batch)` donates the
  state and returns (state, metrics); `eval(params, batch)` returns loss and accuracy sums."""
  model: BertForPreTraining
  tx: Any
  abstract: step_lib.TrainState
  shardings: step_lib.TrainState
  data_sharding: jax.sharding.NamedSharding
  train: Any
  eval: Any


def build_train_step(config, bert_config: BertConfig, mesh, rules) -> StepSetup:
  """Model, optimiser, state layout and jitted steps; nothing is allocated or compiled. Call or lower the steps
  under `jax.set_mesh(mesh)` and `nn.logical_axis_rules(rules)`: activation constraints read them when tracing."""
  model = BertForPreTraining(bert_config)
  schedule = optim.make_schedule(config.optim, config.total_steps)
  tx = optim.make_optimizer(config.optim, config.total_steps)
  key = jax.random.key(0)  # only its shape is used; made outside the mesh, which may be compile-only (AOT)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract, shardings = sharding.abstract_and_shardings(
        lambda r: step_lib.init_state(model, tx, r, (1, 8)), mesh, rules, key)
  train_fn, eval_fn = step_lib.make_steps(model, tx, schedule, grad_accum_steps=config.optim.grad_accum_steps,
                                          nsp=bool(config.data.nsp))
  data_sharding = sharding.batch_sharding(mesh)
  p_train = jax.jit(train_fn, in_shardings=(shardings, data_sharding),
                    out_shardings=(shardings, sharding.replicated(mesh)), donate_argnums=0)
  p_eval = jax.jit(eval_fn, in_shardings=(shardings.params, data_sharding), out_shardings=sharding.replicated(mesh))
  return StepSetup(model, tx, abstract, shardings, data_sharding, p_train, p_eval)


# ----------------------------------------------------------------------------------------------------------
# Data: this process's shards, stacked into its share of the global batch.
# ----------------------------------------------------------------------------------------------------------


class ShardedBatches:
  """Iterators of this process's data shards; `next()` gives the process-local rows of one global batch."""

  def __init__(self, config, tokenizer, layout: Layout, split: str = "train"):
    self.layout = layout
    self.iterators = {
        s: data_loader.make_pretrain_iterator(
            config.data, tokenizer, global_batch_size=config.batch_size, seed=config.seed,
            process_index=s, process_count=layout.num_shards, split=split)
        for s in layout.shards}

  def __next__(self) -> dict[str, np.ndarray]:
    parts = [next(it) for it in self.iterators.values()]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}

  def get_states(self) -> dict[int, Any]:
    return {s: it.get_state() for s, it in self.iterators.items()}

  def set_states(self, states: dict[int, Any]) -> None:
    for s, it in self.iterators.items():
      it.set_state(states[s])


def eval_batches(config, tokenizer, layout: Layout) -> list[dict[str, np.ndarray]]:
  per_shard = [data_loader.make_eval_batches(
      config.data, tokenizer, global_batch_size=config.batch_size, process_index=s,
      process_count=layout.num_shards, num_batches=config.eval_batches) for s in layout.shards]
  return [{k: np.concatenate([b[i][k] for b in per_shard]) for k in per_shard[0][i]}
          for i in range(len(per_shard[0]))]


# ----------------------------------------------------------------------------------------------------------
# Preemption: finish the step, save, exit. A second SIGTERM only repeats the request.
# ----------------------------------------------------------------------------------------------------------


class StopRequest:
  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):  # pylint: disable=unused-argument
    if not self.requested:
      log.warning("SIGTERM: finishing the current step, saving a checkpoint and exiting.")
    self.requested = True

  def agreed(self) -> bool:
    """All processes must stop at the same step; any one being asked to is enough."""
    if jax.process_count() == 1:
      return self.requested
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
    return bool(np.any(multihost_utils.process_allgather(np.array(self.requested))))

  def restore(self):
    signal.signal(signal.SIGTERM, self._previous)


# ----------------------------------------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------------------------------------


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict[str, float]:
  """Trains until `config.total_steps` (or preemption) and returns the last logged metrics."""
  # -- set-up that can fail fast, before any compilation --
  writer = metrics_lib.MetricWriter(workdir, enabled=jax.process_index() == 0)
  ckpt = ckpt_lib.Checkpointer(f"{workdir}/checkpoints", max_to_keep=config.max_checkpoints_to_keep,
                               async_save=config.async_checkpointing)
  tokenizer = data_loader.build_tokenizer(config.data)
  bert_config = bert_config_from(config.model, tokenizer.vocab_size)
  mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, config.mesh.dcn_data)
  layout = validate(config, bert_config, mesh)
  rules = sharding.rules_from_config(config.logical_axis_rules)

  setup = build_train_step(config, bert_config, mesh, rules)
  model, tx, abstract, shardings = setup.model, setup.tx, setup.abstract, setup.shardings
  nsp = bool(config.data.nsp)
  peak, peak_label = flops_lib.peak_flops_per_device()  # a single-device matmul on CPU: before the mesh

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    log.info("mesh %s; state: %s", dict(mesh.shape), sharding.sharding_report(abstract, shardings))
    state, data_states, source = initial_state(config, ckpt, model, tx, bert_config, mesh, shardings, abstract,
                                               layout)
    start = int(state.step)
    log.info("state: %s (step %d)", source, start)
    writer.truncate_after(start)

    batches = ShardedBatches(config, tokenizer, layout)
    if data_states is not None:
      batches.set_states(data_states)
    held_out = eval_batches(config, tokenizer, layout) if config.eval_every_steps else []

    data_sharding, p_train, p_eval = setup.data_sharding, setup.train, setup.eval

    def to_global(local):
      return jax.tree.map(lambda x: jax.make_array_from_process_local_data(data_sharding, x), local)

    def evaluate(step):
      totals = None
      for batch in held_out:
        sums = jax.device_get(p_eval(state.params, to_global(batch)))
        totals = sums if totals is None else jax.tree.map(np.add, totals, sums)
      if totals is not None:
        writer.write(step, {f"eval/{k}": v for k, v in step_lib.summarise_eval(totals).items()})

    def save(step, *, final):
      try:
        ckpt.save(step, state.as_dict(), data_states=batches.get_states(), config=config.to_dict(),
                  bert_config=bert_config.to_dict(full=True))
      except ckpt_lib.CheckpointError as e:
        if final:
          raise
        log.error("%s", e)  # The state is still in memory; training goes on and the next save retries.

    tokens_per_step = config.batch_size * config.data.max_seq_length
    step_flops = flops_lib.train_flops_per_step(
        bert_config, batch_size=config.batch_size, seq_len=config.data.max_seq_length,
        num_masked=config.data.max_predictions_per_seq, nsp=nsp)
    progress = metrics_lib.Progress(total_steps=config.total_steps, start_step=start)
    stop = StopRequest()
    last_metrics: dict[str, float] = {}
    pending = None  # metrics of the step before, read while the current step runs
    try:
      for step in range(start, config.total_steps):
        local = next(batches)
        state, metrics = p_train(state, to_global(local))
        if pending is not None:
          _check_finite(*pending, ckpt)
        done = step + 1
        pending = (done, metrics)
        if done % config.log_every_steps == 0 or done == config.total_steps:
          _check_finite(*pending, ckpt)
          scalars = {f"train/{k}": float(v) for k, v in jax.device_get(metrics).items()}
          rate = progress.update(done)
          scalars["train/steps_per_sec"] = rate
          scalars["train/tokens_per_sec"] = rate * tokens_per_step
          scalars["train/mfu"] = flops_lib.mfu(step_flops, 1 / rate, peak * jax.device_count()) if rate else 0.0
          writer.write(done, scalars)
          log.info("%s", progress.line(done, scalars, mfu_label=peak_label))
          last_metrics = scalars
        if config.eval_every_steps and (done % config.eval_every_steps == 0 or done == config.total_steps):
          evaluate(done)
        preempted = stop.agreed()
        if done % config.checkpoint_every_steps == 0 or done == config.total_steps or preempted:
          _check_finite(*pending, ckpt)
          save(done, final=preempted or done == config.total_steps)
        if preempted:
          log.warning("stopped at step %d after SIGTERM; rerun the same command to resume.", done)
          break
      ckpt.wait()
    finally:
      stop.restore()
      ckpt.close()
      writer.close()
  return last_metrics


def _check_finite(step, metrics, ckpt):
  """Stops the run before a non-finite state can reach a checkpoint."""
  loss = float(metrics["loss"])
  if not math.isfinite(loss):
    last = ckpt.latest_step()
    raise TrainingError(
        f"non-finite loss ({loss}) at step {step}. The last good checkpoint is step {last}: lower the learning "
        "rate or check the data, then rerun the same command to resume from it.")
