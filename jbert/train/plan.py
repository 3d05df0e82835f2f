"""The run's plan: tokenizer, model config, mesh, data shards and the task with its data, all checked before the
workdir is touched or anything compiles (`plan(config) -> Run`); `tpu/aot_compile.py` uses the same checks."""
from __future__ import annotations

import copy
import dataclasses
import functools
import logging
import math
from typing import Any

import jax
import ml_collections

from jbert import tasks as tasks_lib
from jbert.data import corpus
from jbert.data import streams
from jbert.data.streams import DataShards
from jbert.model import BertConfig
from jbert.model import validation
from jbert.runtime import sharding
from jbert.train import architecture
from jbert.train import best as best_lib
from jbert.train import optim
from jbert.train import ranges
from jbert.train import workdir_record


log = logging.getLogger("jbert")


def data_shards(config, mesh) -> DataShards:
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
  # Packed batches: each shard's rows a multiple of this, so the global rows divide over devices and micro-batches.
  row_multiple = dp * accum // math.gcd(dp * accum, num_shards)
  return DataShards(num_shards, tuple(range(first, first + per_proc)), batch // num_shards, row_multiple)


# BERT-base's fine-tuning rate (configs/finetune.py's default, the paper's 2e-5 to 5e-5) and width.
_BASE_RATE, _BASE_WIDTH = 2e-5, 768


def learning_rate_note(config, task: tasks_lib.Task, bert_config: BertConfig) -> str | None:
  """A warning for a fine-tuning run that trains a model narrower than BERT-base at BERT-base's rate or below,
  where small models can learn little and predict the majority class; None otherwise. The default stays the
  paper's: the right rate of a small model depends on it and on the task, so the line says what to try."""
  rate = config.optim.learning_rate
  if not task.exports or bert_config.hidden_size >= _BASE_WIDTH or rate > _BASE_RATE:
    return None
  return (f"optim.learning_rate={rate:g} is BERT-base's fine-tuning rate, and this model is {bert_config.hidden_size} "
          f"wide with {bert_config.num_hidden_layers} layers: a small model can learn little at it and predict the "
          "majority class (Google's small BERTs were fine-tuned at 3e-5 to 3e-4); if the training accuracy stays "
          "at the majority class's share, raise --config.optim.learning_rate (e.g. 1e-4 to 5e-4).")


def source_key(config, source: str | None) -> str:
  """The config key that names the architecture source: `init_from`, or the task key holding that path."""
  if not source or source == config.get("init_from") or "task" not in config:
    return "init_from"
  return next((f"task.{k}" for k, v in config.task.items() if v == source), "init_from")


def check_model(config, bert_config: BertConfig, mesh) -> None:
  tensor = mesh.shape["tensor"]
  if bert_config.num_attention_heads % tensor:
    raise ValueError(f"num_attention_heads={bert_config.num_attention_heads} is not divisible by "
                     f"mesh.tensor={tensor}; choose mesh.tensor among the divisors of the head count.")
  if config.data.max_seq_length > bert_config.max_length:  # RoBERTa's table: position_offset rows more
    raise ValueError(f"data.max_seq_length={config.data.max_seq_length} exceeds the model's {bert_config.max_length} "
                     f"positions ({validation.position_limit(bert_config)}); lower data.max_seq_length.")


def check_cadences(config) -> None:
  """0 means never (the last step still logs, evaluates and saves); a negative cadence is a typo."""
  for key in ("log_every_steps", "eval_every_steps", "checkpoint_every_steps"):
    if config[key] is None or config[key] < 0:
      raise ValueError(f"{key}={config[key]} must be >= 0 (0: only at the last step).")


def resolve_length(config, task: tasks_lib.Task) -> ml_collections.ConfigDict:
  """A copy of `config` with `total_steps` (from `num_epochs` when None) and the warmup resolved."""
  config = copy.deepcopy(config)
  with config.unlocked():
    if config.total_steps is None:
      if task.num_train_examples() is None:
        raise ValueError(f"total_steps=None: task {task.name} has no epochs; set --config.total_steps.")
      config.total_steps = streams.total_steps_for(task.num_train_examples(), config.batch_size,
                                                   config.num_epochs)
    if config.total_steps <= 0:
      raise ValueError(f"total_steps={config.total_steps} must be positive.")
    config.optim.warmup_steps = optim.warmup_steps(config.optim, config.total_steps)
  return config


def resolve_scan_layers(config, workdir: str | None = None, platform: str | None = None
                        ) -> ml_collections.ConfigDict:
  """`model.scan_layers=None` (fine-tuning's default) resolved: as the workdir's checkpoints were trained (the
  parameter layout depends on it), else unrolled on CPU, where XLA runs unrolled layers 15-20% faster and
  compiles them as fast, and scanned on TPU and GPU, where a scanned stack compiles in a time independent of
  its depth, unless the model's layers differ (ModernBERT's: `BertConfig.scannable`). `platform`: the one
  compiled for (default: JAX's backend)."""
  if config.model.scan_layers is not None:
    return config
  recorded = workdir_record.recorded_value(workdir, "model.scan_layers") if workdir else None
  config = copy.deepcopy(config)
  platform = platform or jax.default_backend()
  if isinstance(recorded, bool):
    config.model.scan_layers = recorded
  else:
    config.model.scan_layers = platform != "cpu" and _source_scannable(config)
  return config


def _source_scannable(config) -> bool:
  """Whether the architecture source's layers can be scanned (True for a preset, or a source that cannot be read:
  the run's own checks name what is wrong with it)."""
  source, _ = tasks_lib.architecture_source(config)
  if not source:
    return True
  from jbert import weights  # pylint: disable=g-import-not-at-top  (checkpoint readers only when needed)
  try:
    return weights.describe(source).config.scannable
  except Exception:  # pylint: disable=broad-except
    return True


def resolve(config, workdir: str | None = None, task: tasks_lib.Task | None = None
            ) -> ml_collections.ConfigDict:
  """`config` as the run trains it and as WORKDIR/config.json records it: every value the config leaves to the
  run decided (`model.scan_layers` against the workdir's checkpoints; phase 2's data settings from init_from's
  workdir, `jbert.data.corpus`; `total_steps` and the warmup, which need `task` when total_steps is None). The one
  resolution both the trainer and run.py's early completion check compare with the workdir's record, so that an
  unset value never reads as a change."""
  config = resolve_scan_layers(config, workdir)
  config, _ = corpus.inherit(config)  # phase 2's data settings, from init_from's workdir
  if task is None and config.get("total_steps") is None:
    return config  # epochs: the trainer resolves them once the task has counted its examples
  return resolve_length(config, task)


@dataclasses.dataclass(frozen=True)
class Run:
  """Everything the run decided before touching the workdir."""
  config: ml_collections.ConfigDict  # with total_steps and warmup resolved
  task: tasks_lib.Task
  tokenizer: Any
  bert_config: BertConfig
  mesh: jax.sharding.Mesh
  shards: DataShards
  rules: tuple
  inherited: tuple[workdir_record.Change, ...] = ()  # data settings taken from init_from's workdir (phase 2)

  @functools.cached_property
  def batches(self) -> streams.Stream:
    """This process's training batches, from the start (a resume sets their state), made on first use, which the
    trainer makes past its finished check: a finished run's rerun does no data work beyond reading its data (no
    teacher pass of a distillation, no layout of the whole run's packed batches)."""
    batches = self.task.train_stream(self.shards)
    batches.plan(self.config.total_steps)  # packed batches take their row counts from the whole run's batches
    return batches


def plan(config: ml_collections.ConfigDict, workdir: str | None = None) -> Run:
  """Builds and checks the run from its config; raises a ValueError naming the problem before any compile.
  `workdir`, when given, is only read (`resolve`).

  The task reads and featurises its data here (a bad file fails before anything is written or compiled, and
  the epochs need the training set's size); its training stream is made later (`Run.batches`), and pretraining
  checks its corpus then.
  """
  ranges.check_ranges(config)
  check_cadences(config)
  config = resolve_scan_layers(config, workdir)  # the model below depends on it; `resolve` does the rest
  config, inherited = corpus.inherit(config)  # phase 2: the tokenizer and the task read the inherited corpus
  if inherited:
    log.info("data settings of init_from %s: %s", config.init_from, ", ".join(f"{k}={v!r}" for k, v in inherited))
  source, shape = tasks_lib.architecture_source(config)  # init_from, or a distillation's teacher
  tokenizer = architecture.build_tokenizer(config.data, source, key=source_key(config, source))
  bert_config = architecture.bert_config(config.model, tokenizer.vocab_size, source, shape,
                                         pad_token_id=tokenizer.pad_id)
  mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, config.mesh.dcn_data)
  check_model(config, bert_config, mesh)
  shards = data_shards(config, mesh)
  task = tasks_lib.build_task(config, tokenizer)
  note = learning_rate_note(config, task, bert_config)
  if note:
    log.warning("%s", note)
  config = resolve(config, workdir, task)
  optim.make_schedule(config.optim, config.total_steps)  # Checks the optimiser settings.
  best_lib.BestKeeper.check_config(config, task, shards)
  return Run(config, task, tokenizer, bert_config, mesh, shards, sharding.rules_from_config(config.logical_axis_rules),
             tuple(workdir_record.Change(f"data.{k}", None, v, "init_from") for k, v in inherited))
