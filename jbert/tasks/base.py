"""The task contract: everything the shared trainer and `jbert.predict` need to know about one kind of training.

`jbert.train.trainer` owns the loop (state, sharding, jitted steps, checkpoints, metrics, preemption) and
`jbert.inference.prediction` the model folder and the Runner; a task supplies what differs. A task module
registers its class (`jbert.tasks.registry.register`), which declares:

  registration  `kinds` (its names for what it trains; a fine-tuned model records the one that trained it),
                `head`, which configs train it (`config_names`, `local_kind`, `variant_of` with `selects`), its
                `task` keys (`config_section`, `variant_keys`), `from_config(config, tokenizer)`; for fine-tuned
                models `for_prediction(folder, kind=...)`, `recognises(folder)`; `declared_options` (settings beyond
                the data config, `jbert.tasks.options`: config keys, `for_prediction`'s settings, jbert.predict's flags)
  model         `model(bert_config)`, `apply`, `load_init` (what `init_from` gives), `export` (WORKDIR/export)
  batches       `batch_spec` (one definition the loader, `tpu/aot_compile.py` and `bench/` share), the training
                stream and the evaluation sets, `num_train_examples` (epochs), `buckets` (length-bucketed batches)
                and `step_flops` (MFU)
  losses        `loss(outputs, batch) -> {name: Weighted(sum, denominator)}` over a micro-batch and `objectives`
                (which entries the trainer minimises, with their weights); the trainer normalises them over the
                WHOLE global batch (`Weighted`) and reports every entry as sum / denominator
  evaluation    `predictions` (per-row arrays from the jitted predict step, or from `jbert.predict`'s Runner),
                `decode`, `evaluate` (host-side metrics of one split), `records` (one JSON record per example:
                prediction files and `jbert.predict`) and `write_outputs` (prediction files)
  prediction    `read_inputs` / `inputs_from` (a file or Python records -> examples), `featurise`, `group_key`,
                `bucketable`, `token_outputs` (how the Runner batches and pads them), `prediction_params`

The traced methods see jnp arrays inside `jax.jit`; the others run on the host.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, Mapping, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jbert.data.streams import Stream
from jbert.model import BertConfig, registry
from jbert.tasks.options import TaskOption

Batch = dict[str, Any]
MODEL_INPUTS = ("input_ids", "token_type_ids", "attention_mask")
# What the model reads of packed rows (`jbert.data.packing`) beside MODEL_INPUTS.
PACKED_INPUTS = ("segment_ids", "position_ids", "cls_positions")


class Weighted(NamedTuple):
  """One entry of a task's `loss`: a sum over the rows of a micro-batch and the denominator it is reported over.

  The value of an entry is Σ sum / Σ denominator over the WHOLE global batch. The denominator must depend on the
  batch alone, never on the parameters, and be a sum over its rows (a count of rows or tokens, Σ of a weight
  array: padding-free batches weigh their sequence slots), so that micro-batches' denominators add up to the
  global one and per-row entries add up to a split's. The trainer divides each objective's micro-batch sum by the
  global denominator (`training_loss`), so k accumulated micro-batches give the gradient of the whole batch; it
  gets the global denominators exactly by evaluating `loss` on the whole batch with zero outputs of the right
  shapes, of which only the denominators are used (XLA drops the rest). A denominator of 0 (a batch without a
  labelled token) gives the value 0.
  """
  sum: jax.Array
  denominator: jax.Array


def value(entry: Weighted, denominator: jax.Array | None = None) -> jax.Array:
  """sum / denominator (the entry's own by default); 0 where the denominator is 0."""
  denominator = entry.denominator if denominator is None else denominator
  return entry.sum / jnp.where(denominator > 0, denominator, 1.0)


def training_loss(task: "Task", entries: Mapping[str, Weighted],
                  denominators: Mapping[str, jax.Array] | None = None) -> jax.Array:
  """Σ over the task's objectives of weight · sum / denominator; `denominators`: the global batch's (default: the
  entries' own, for a batch that is the global one)."""
  return sum(weight * value(entries[name], None if denominators is None else denominators[name])
             for name, weight in task.objectives.items())


def reported(task: "Task", entries: Mapping[str, Weighted]) -> dict[str, jax.Array]:
  """Every entry's value (sums of the global batch, or of a split's rows) and `loss`, the training loss."""
  metrics = {name: value(entry) for name, entry in entries.items()}
  metrics["loss"] = sum(weight * metrics[name] for name, weight in task.objectives.items())
  return metrics


def rows_of(batch: Batch) -> jax.Array:
  """The number of rows (examples) of a batch as a denominator (a float32 scalar); packed bi-encoder batches
  count their examples (`text_slots` [N, K]), not their rows."""
  rows = batch["text_slots"].shape[0] if "text_slots" in batch else batch["input_ids"].shape[0]
  return jnp.asarray(rows, jnp.float32)


def per_row(task: "Task", outputs, batch: Batch) -> dict[str, Weighted]:
  """The task's `loss` of each row alone: {name: Weighted([B] sums, [B] denominators)}, which add up to any set of
  rows' entries (evaluation sums them over a split)."""
  one = lambda tree: jax.tree.map(lambda x: x[None], tree)
  return jax.vmap(lambda o, b: task.loss(one(o), one(b)))(outputs, batch)


@dataclasses.dataclass
class EvalSet:
  """One evaluation (or test) split, featurised once.

  Attributes:
    name: the split's name (`validation`, `validation_matched`, `test`, ...).
    features: arrays with a shared leading dimension N, one row per model input row, in example order; may hold
      host-only arrays (offsets, ids, texts) that the task's `evaluate` reads.
    labelled: whether gold labels exist (GLUE test splits and unlabelled files have none: predictions only).
    examples: the raw examples, where the task's outputs need them (words, contexts; for classification the
      (text_a[, text_b]) texts of each row, for its prediction files); else None.
  """
  name: str
  features: dict[str, np.ndarray]
  labelled: bool
  examples: Any = None

  @property
  def num_rows(self) -> int:
    return len(next(iter(self.features.values()))) if self.features else 0


class Task(abc.ABC):
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
  head: registry.Head
  num_labels: int | None = None
  label_names: tuple[str, ...] | None = None
  # Batch keys the predict step needs (labels too where predictions are losses, as for pretraining).
  predict_keys: tuple[str, ...] = MODEL_INPUTS
  # Whether the end of training writes results.json, prediction files and an exported model.
  exports: bool = False
  # Model sequences in one batch row (multiple choice: one per ending); tokens/s and MFU count them.
  sequences_per_row: int = 1
  # Outputs of `predictions` with the sequence as axis 1: a bucketed evaluation pads them back to full length.
  token_outputs: tuple[str, ...] = ()

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

  # -- model --

  def model(self, bert_config: BertConfig) -> nn.Module:
    return self.head.cls(bert_config, **self.head.model_kwargs(self.num_labels))

  def apply(self, model: nn.Module, params, batch: Batch, rng, *, deterministic: bool):
    """The model's outputs on a batch (only the model inputs are read)."""
    kwargs = {k: batch[k] for k in MODEL_INPUTS[1:] if k in batch}
    return model.apply({"params": params}, batch["input_ids"], deterministic=deterministic, rngs={"dropout": rng},
                       **kwargs, **self.extra_inputs(batch))

  def load_init(self, path: str, bert_config: BertConfig, *, seed: int, fresh):
    """The parameters a run starts from with `config.init_from=path`; `fresh()` gives its seeded initial ones
    (what the checkpoint lacks comes from them or from `seed`)."""
    del fresh  # load_pretrained initialises a missing head from the seed itself.
    from jbert import weights  # pylint: disable=g-import-not-at-top  (TF/torch only when needed)
    runtime = {k: getattr(bert_config, k) for k in weights.OVERRIDABLE}
    return weights.load_pretrained(path, self.head.cls, num_labels=self.num_labels, rng_seed=seed, **runtime)[1]

  def load_export(self, directory: str, bert_config: BertConfig):
    """The parameters `export` wrote to `directory` (keep_best's WORKDIR/best), as `model(bert_config)` holds
    them: by default load_pretrained of the head (a task that exports more, as a CRF its transitions, adds it)."""
    from jbert import weights  # pylint: disable=g-import-not-at-top
    runtime = {k: getattr(bert_config, k) for k in weights.OVERRIDABLE}
    return weights.load_pretrained(directory, self.head.cls, num_labels=self.num_labels, **runtime)[1]

  def export(self, bert_config: BertConfig, params, out_dir: str, tokenizer) -> None:
    """Writes the trained model (host `params`) to `out_dir` (WORKDIR/export, and keep_best's WORKDIR/best): by
    default a Hugging Face folder of the head with its labels, its kind (config.json's `jbert.task`, which
    transformers ignores) and tokenizer; a task adds what other libraries need to load it as its model
    (sentence-transformers' modules)."""
    from jbert import weights  # pylint: disable=g-import-not-at-top
    weights.save_pretrained(bert_config, params, out_dir, self.head.cls, label_names=self.label_names,
                            tokenizer=tokenizer, task=self.kind)

  def extra_inputs(self, batch: Batch) -> dict[str, Any]:  # pylint: disable=unused-argument
    """Model call arguments beyond the standard inputs (e.g. pretraining's masked positions)."""
    return {}

  def step_flops(self, bert_config: BertConfig, batch_size: int, seq_len: int) -> float:
    """Model FLOPs of one training step of `batch_size` rows (forward and backward), for MFU; a packed row is one
    sequence of `seq_len` tokens to the model, whatever it holds."""
    from jbert.runtime import flops  # pylint: disable=g-import-not-at-top
    per_row = 1 if self.packed_slots() is not None else self.sequences_per_row
    return flops.train_flops_per_step(bert_config, batch_size=batch_size * per_row, seq_len=seq_len,
                                      num_masked=0, nsp=False)

  # -- batches --

  @abc.abstractmethod
  def batch_spec(self, batch_size: int, max_seq_length: int) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of one training batch of `batch_size` rows."""

  def train_spec(self, rows: int, length: int) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of a training batch of `rows` rows of `length` tokens as the stream feeds it."""
    return self.batch_spec(rows, length)

  def packed_slots(self) -> int | None:
    """S, the sequences a packed fine-tuning row holds at most; None when its batches are not packed that way."""
    return None

  def eval_slots(self) -> int | None:
    """S of packed evaluation batches; None: evaluation batches are not packed."""
    return self.packed_slots()

  @abc.abstractmethod
  def train_stream(self, shards) -> Stream:
    """This process's training batches for the data shards of `shards` (`jbert.data.streams.DataShards`)."""

  def num_train_examples(self) -> int | None:
    """Examples in one epoch, where epochs mean something (fine-tuning); None for an endless corpus."""
    return None

  def buckets(self) -> tuple[int, ...] | None:
    """The sequence lengths of length-bucketed training and evaluation batches (`jbert.data.streams`), known
    up front; None: every batch has `max_seq_length`."""
    return None

  @abc.abstractmethod
  def eval_sets(self, shards) -> list[EvalSet]:
    """Featurised evaluation and test splits (labelled ones are scored during training); pretraining lays its
    held-out rows out by the data shards of `shards`."""

  # -- losses (traced) --

  # The entries of `loss` the trainer minimises, each with its weight in the training loss; every other entry is
  # a metric. The logged `loss` is the training loss.
  objectives: Mapping[str, float] = {"loss": 1.0}

  @abc.abstractmethod
  def loss(self, outputs, batch: Batch) -> dict[str, Weighted]:
    """{name: Weighted(sum, denominator)} over the rows of a (micro-)batch; see `Weighted` for the contract."""

  @abc.abstractmethod
  def predictions(self, outputs, batch: Batch) -> dict[str, jax.Array]:
    """Per-row arrays [B, ...] that `evaluate`, `records` and `write_outputs` read (traced; the trainer's
    predict step and `jbert.predict`'s Runner both call it)."""

  # -- evaluation (host) --

  def decode(self, eval_set: EvalSet, predictions: Mapping[str, np.ndarray]) -> Mapping[str, Any]:
    """Host-side decoding of one split's per-row outputs (SQuAD's answer search), done once per evaluation;
    `evaluate`, `records` and `write_outputs` read what it returns."""
    del eval_set
    return predictions

  @abc.abstractmethod
  def evaluate(self, eval_set: EvalSet, predictions: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Metrics of one labelled evaluation set from its predictions (one row per feature row, in order)."""

  def write_outputs(self, eval_set: EvalSet, predictions: Mapping[str, np.ndarray],
                    out_dir: str) -> list[str]:  # pylint: disable=unused-argument
    """Prediction files of one split in `out_dir`; returns their paths."""
    return []


def softmax(logits) -> np.ndarray:
  """float64 softmax over the last axis: the probabilities of prediction files and `jbert.predict`."""
  logits = np.asarray(logits, np.float64)
  p = np.exp(logits - logits.max(-1, keepdims=True))
  return p / p.sum(-1, keepdims=True)


def mean_cross_entropy_sums(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> tuple[jax.Array, ...]:
  """(Σ weight·nll, Σ weight·correct) of integer-labelled logits [..., C]; labels outside [0, C) need weight 0."""
  import optax  # pylint: disable=g-import-not-at-top
  logits = logits.astype(jnp.float32)
  safe = jnp.where(weights > 0, labels, 0)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, safe)
  correct = (jnp.argmax(logits, -1) == safe).astype(jnp.float32)
  return jnp.sum(nll * weights), jnp.sum(correct * weights)
