"""jbert's train step as the benches time it: the trainer's step for a fine-tuning config, jitted with the state
donated, at a constant learning rate (no warmup, no decay), so that every timed step does the same work and
jbert and the framework beside it take the same updates."""
from __future__ import annotations

import copy
import functools

import flax.linen as nn
import jax

from jbert.train import optim
from jbert.train import step as step_lib


def constant_lr_train_step(cfg, task, model, input_shape, seed: int = 0):
  """(jitted `train_step(state, batch)`, its optimiser, the initial state from `seed`) for `cfg`
  (configs/finetune.py) and `task`'s `model`; `input_shape` is the dummy input the state is initialised with."""
  ocfg = copy.deepcopy(cfg.optim)
  ocfg.warmup_steps, ocfg.end_learning_rate = 0, ocfg.learning_rate
  tx = optim.make_optimizer(ocfg, total_steps=1)
  train = jax.jit(functools.partial(step_lib.train_step, model=model, task=task, tx=tx,
                                    schedule=optim.make_schedule(ocfg, 1)), donate_argnums=0)
  state = jax.jit(lambda r: nn.meta.unbox(step_lib.init_state(model, tx, r, input_shape)))(jax.random.key(seed))
  return train, tx, state
