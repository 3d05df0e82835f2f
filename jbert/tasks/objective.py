"""The objective role of the task contract (`jbert.tasks.base`): what the trainer's jitted steps and the AOT
compile need of a task, and nothing of its data or outputs.

  model, apply          the model (`head` with its labels) and its outputs on a batch; `extra_inputs` beyond
                        MODEL_INPUTS; `load_init` (what `init_from` gives), `export` / `load_export` (WORKDIR/export)
  batch_spec (abstract) shapes and dtypes of a training batch; `train_spec` as the stream feeds it (packed rows)
  loss (abstract)       {name: Weighted(sum, denominator)} over a micro-batch; `objectives`: which entries the
                        trainer minimises, with their weights
  predictions (abstract) per-row arrays of the predict step (and of `jbert.predict`'s Runner)
  step_flops            model FLOPs of a step (MFU)

The loss contract (`Weighted`) and the helpers every task's losses share live here too.
"""
from __future__ import annotations

import abc
from typing import Any, Mapping, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from jbert.model import BertConfig, registry

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


def training_loss(task: "Objective", entries: Mapping[str, Weighted],
                  denominators: Mapping[str, jax.Array] | None = None) -> jax.Array:
  """Σ over the task's objectives of weight · sum / denominator; `denominators`: the global batch's (default: the
  entries' own, for a batch that is the global one)."""
  return sum(weight * value(entries[name], None if denominators is None else denominators[name])
             for name, weight in task.objectives.items())


def reported(task: "Objective", entries: Mapping[str, Weighted]) -> dict[str, jax.Array]:
  """Every entry's value (sums of the global batch, or of a split's rows) and `loss`, the training loss."""
  metrics = {name: value(entry) for name, entry in entries.items()}
  metrics["loss"] = sum(weight * metrics[name] for name, weight in task.objectives.items())
  return metrics


def rows_of(batch: Batch) -> jax.Array:
  """The number of rows (examples) of a batch as a denominator (a float32 scalar); packed bi-encoder batches
  count their examples (`text_slots` [N, K]), not their rows."""
  rows = batch["text_slots"].shape[0] if "text_slots" in batch else batch["input_ids"].shape[0]
  return jnp.asarray(rows, jnp.float32)


def per_row(task: "Objective", outputs, batch: Batch) -> dict[str, Weighted]:
  """The task's `loss` of each row alone: {name: Weighted([B] sums, [B] denominators)}, which add up to any set of
  rows' entries (evaluation sums them over a split)."""
  one = lambda tree: jax.tree.map(lambda x: x[None], tree)
  return jax.vmap(lambda o, b: task.loss(one(o), one(b)))(outputs, batch)


def mean_cross_entropy_sums(logits: jax.Array, labels: jax.Array, weights: jax.Array) -> tuple[jax.Array, ...]:
  """(Σ weight·nll, Σ weight·correct) of integer-labelled logits [..., C]; labels outside [0, C) need weight 0."""
  import optax  # pylint: disable=g-import-not-at-top
  logits = logits.astype(jnp.float32)
  safe = jnp.where(weights > 0, labels, 0)
  nll = optax.softmax_cross_entropy_with_integer_labels(logits, safe)
  correct = (jnp.argmax(logits, -1) == safe).astype(jnp.float32)
  return jnp.sum(nll * weights), jnp.sum(correct * weights)


class Objective(abc.ABC):
  """The model a task trains, its batches' shapes, its losses and per-row predictions (traced methods see jnp
  arrays inside `jax.jit`). `packed_slots` is the data role's (`jbert.tasks.data.TaskData`): a packed layout
  changes the shapes and the FLOPs of a step."""

  head: registry.Head
  num_labels: int | None = None
  label_names: tuple[str, ...] | None = None  # class names in id order (None: a regressor, or no classes)
  # Model sequences in one batch row (multiple choice: one per ending); tokens/s and MFU count them.
  sequences_per_row: int = 1
  kind: str
  # Folders of the export published as their own WORKDIR/<name> (ELECTRA's generator): {export subfolder: name}.
  export_beside: Mapping[str, str] = {}

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

  @abc.abstractmethod
  def batch_spec(self, batch_size: int, max_seq_length: int) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of one training batch of `batch_size` rows."""

  def train_spec(self, rows: int, length: int) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of a training batch of `rows` rows of `length` tokens as the stream feeds it."""
    return self.batch_spec(rows, length)

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
