"""The task contract: everything the shared trainer and `jbert.predict` need to know about one kind of training.

`jbert.train.trainer` owns the loop (state, sharding, jitted steps, checkpoints, metrics, preemption) and
`jbert.inference.prediction` the model folder and the Runner; a task supplies what differs. A task package
(`jbert/tasks/<family>/`) registers its class (`jbert.tasks.registry.register`). `Task` composes three roles, each
a module with the abstract methods it really needs, beside the registration declared here:

  registration (here)      `kinds` (its names for what it trains; `kind`, the instance's, is recorded with its
                           model), `head`, which configs train it (`datasets` it declares by name, `config_names`,
                           `local_kind`, `variant_of` with `selects`), its `task` keys (`config_section`,
                           `variant_keys`, `ignores`), `declared_options` (`jbert.tasks.options`) and
                           `from_config(config, tokenizer)` (abstract)
  objective (objective.py) what the trainer's steps and the AOT compile need: `model`, `apply`, `load_init`,
                           `export`; `batch_spec`, `loss`, `predictions` (abstract); `objectives`, `step_flops`
  data (data.py)           what feeds them: `train_stream`, `eval_sets` (abstract); `num_train_examples`,
                           `buckets`, `packed_slots` (packing/bucketing, from the run's data config)
  serving (serving.py)     what is made of the predictions on the host: `evaluate` (abstract), `decode`,
                           `write_outputs`

Fine-tuning (`finetuning.py`) implements the data role in memory (`FinetuneTask`: featurised splits, seeded
epochs, packed or bucketed by `Batching`) and adds the serving side of `jbert.predict` (`PredictingTask`:
`for_prediction`, `read_inputs` / `inputs_from`, `featurise`, `records`, `group_key`, `prediction_params`).
The traced methods see jnp arrays inside `jax.jit`; the others run on the host.
"""
from __future__ import annotations

import abc
from typing import Any, Mapping

from jbert.tasks.data import EvalSet, TaskData
from jbert.tasks.objective import (MODEL_INPUTS, PACKED_INPUTS, Batch, Objective, Weighted, mean_cross_entropy_sums,
                                   per_row, reported, rows_of, training_loss, value)
from jbert.tasks.options import TaskOption
from jbert.tasks.serving import Serving, softmax

# The roles' names every task module reads, in one place.
__all__ = ["MODEL_INPUTS", "PACKED_INPUTS", "Batch", "EvalSet", "Objective", "Serving", "Task", "TaskData", "Weighted",
           "mean_cross_entropy_sums", "per_row", "reported", "rows_of", "softmax", "training_loss", "value"]


class Task(Objective, TaskData, Serving):
  """One kind of training on BERT; see the module docstring for the split of work with the trainer.

  A task is built once per run by `jbert.tasks.build_task(config, tokenizer)` (its class's `from_config`) and holds
  everything it needs (its settings and, for training, its featurised data); no other method takes the config.
  """

  # -- registration (class attributes; see `jbert.tasks.registry`) --
  kinds: tuple[str, ...] = ()       # what the class trains, by name; `kind` is the instance's one
  config_names: tuple[str, ...] = ()  # `task.name`s that train it besides its datasets' (`cross_encoder`)
  datasets: Mapping[str, Any] = {}  # `task.name` -> `sources.Dataset` it trains by name (`<family>/sources.py`)
  local_kind: str | None = None     # the `task.kind` with which `local` files train it
  variant_of: str | None = None     # a kind whose configs it trains where `selects(config.task)` says so
  predicts = False                  # whether `jbert.predict` serves its models (`for_prediction`)
  pretrains = False                 # a pretraining objective (its own configs/*.py), no configs/finetune.py name
  declared_options: tuple[TaskOption, ...] = ()  # its settings (`jbert.tasks.options`)

  name: str
  # Batch keys the predict step needs (labels too where predictions are losses, as for pretraining).
  predict_keys: tuple[str, ...] = MODEL_INPUTS
  # Whether the end of training writes results.json, prediction files and an exported model.
  exports: bool = False

  @property
  def kind(self) -> str:
    """The kind this task trains, recorded with its model (config.json's `jbert.task`)."""
    return self.kinds[0]

  @classmethod
  def config_section(cls, name: str) -> dict:  # pylint: disable=unused-argument
    """The `task` keys (beside `name`) of `configs/finetune.py:NAME`, each commented once where it is defined."""
    return {}

  @classmethod
  def variant_keys(cls) -> dict:  # a variant's own `task` keys (off by default), in the configs of its kind
    return {}

  @classmethod
  def selects(cls, task_cfg) -> bool:  # pylint: disable=unused-argument  (a variant: whether it trains task_cfg)
    return False

  @classmethod
  def ignores(cls, task_cfg) -> dict[str, str]:  # pylint: disable=unused-argument
    """{key: why} of the keys of its section that `task_cfg` leaves unread (a TFDS dataset's file and column keys):
    set to anything but their default they are refused (`TASKS.check_keys`), as unknown keys are."""
    return {}

  @classmethod
  def architecture_source(cls, config) -> tuple[str | None, dict]:
    """(the checkpoint whose architecture and tokenizer the run takes, shape fields the task changes in it):
    `init_from` as it is by default; distillation's student is its teacher with fewer layers."""
    return config.get("init_from"), {}

  def init_path(self, init_from: str | None) -> str | None:
    """What the run's parameters start from (`load_init`'s path): `init_from` by default; None: fresh."""
    return init_from

  @classmethod
  @abc.abstractmethod
  def from_config(cls, config, tokenizer=None) -> "Task":
    """The task a training config describes, with its data read and featurised by `tokenizer` (a bad file fails
    here, before anything compiles); without one, its shapes and losses only (AOT compiles, benchmarks)."""
