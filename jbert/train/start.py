"""Where a run's state comes from: the newest intact checkpoint of its workdir (resume), `init_from`'s parameters,
or a fresh initialisation (`initial_state`, called by `jbert.train.trainer` once the workdir is checked)."""
from __future__ import annotations

import flax.linen as nn
import jax
import numpy as np

from jbert.checkpoint import manager as ckpt_lib
from jbert.train import step as step_lib
from jbert.train.plan import Run
from jbert.train.programs import Steps


def initial_state(run: Run, steps: Steps, ckpt: ckpt_lib.Checkpointer):
  """Where the run's state comes from, in this order:

  1. the newest intact checkpoint in WORKDIR/checkpoints (resume; data iterators restored too); damaged newer
     steps are named in warnings and moved aside (`Checkpointer.restore_latest_intact`);
  2. `config.init_from`: parameters only, through `jbert.load_pretrained` (jbert, HF or TF1 checkpoints), with
     a fresh optimiser and step 0; a task head the checkpoint lacks (or holds with another `num_labels`) is
     initialised from `config.seed` and reported by name;
  3. fresh initialisation from `config.seed`.
  Orbax only lists finalised steps, so a partially written checkpoint is never restored.
  Returns (state, data_states or None, source description).
  """
  config, task = run.config, run.task
  target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        steps.abstract.as_dict(), steps.shardings.as_dict())
  found = ckpt.restore_latest_intact(target, shards=run.shards.shards,
                                     data_restart_ok=config.get("allow_data_restart", False))
  if found is not None:
    step, restored, data_states = found
    return step_lib.TrainState.from_dict(restored), data_states, f"resumed from checkpoint step {step}"

  init = jax.jit(lambda r: nn.meta.unbox(step_lib.init_state(steps.model, steps.tx, r, task.head.dummy_shape)),
                 out_shardings=steps.shardings)
  key = jax.random.key(config.seed)
  init_from = task.init_path(config.init_from)  # a distillation without init_from: its teacher's layers
  if not init_from:
    return init(key), None, "fresh initialisation"

  # The seeded initial parameters only for a task that asks for them: a whole random init costs seconds.
  params = task.load_init(init_from, run.bert_config, seed=config.seed, fresh=lambda: init(key).params)
  params = jax.device_put(params, steps.shardings.params)
  opt_init = jax.jit(steps.tx.init, out_shardings=steps.shardings.opt_state)
  step, rng = jax.device_put((np.int32(0), step_lib.dropout_key_data(key)),
                             (steps.shardings.step, steps.shardings.rng))
  state = step_lib.TrainState(step=step, params=params, opt_state=opt_init(params), rng=rng)
  return state, None, f"parameters from {init_from}"
