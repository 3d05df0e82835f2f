"""The fine-tuning side of the task contract (`jbert.tasks.base`): `FinetuneTask`, whose training set is
featurised in memory and fed in seeded epochs, packed or length-bucketed (`jbert.data.streams`), and
`PredictingTask`, a fine-tuning task whose models `jbert.predict` serves."""
from __future__ import annotations

import abc
import dataclasses
import logging
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jbert.data import packing
from jbert.data import streams
from jbert.data.streams import Stream
from jbert.model import validation
from jbert.tasks.base import MODEL_INPUTS, PACKED_INPUTS, Batch, EvalSet, Task

log = logging.getLogger("jbert")
_BATCHING_KEYS = ("bucketing", "packing", "max_sequences_per_row")


@dataclasses.dataclass(frozen=True)
class Batching:
  """How a fine-tuning run lays out its training and evaluation batches: the data config's `bucketing`, `packing`
  and `max_sequences_per_row` (the fine-tuning config holds their defaults, each commented:
  `jbert/train/finetune_config.py`), and the gradient accumulation under which the bi-encoders cannot pack."""
  bucketing: bool
  packing: bool
  max_sequences: int
  grad_accum_steps: int = 1
  data: Any = None  # the data config, which `packing.check` checks where packing applies

  @classmethod
  def from_config(cls, config) -> "Batching":
    missing = [k for k in _BATCHING_KEYS if k not in config.data]
    if missing:
      raise ValueError(f"config.data has no {', '.join(missing)}: a fine-tuning config sets "
                       f"{', '.join(_BATCHING_KEYS)} (start from configs/finetune.py).")
    return cls(bool(config.data.bucketing), bool(config.data.packing), int(config.data.max_sequences_per_row),
               int(config.optim.grad_accum_steps), config.data)


class FinetuneTask(Task):
  """A task whose training set is featurised in memory: seeded epochs over its rows (`streams.FeatureStream`).

  Subclasses set `label_keys` (the batch keys beyond the model inputs) and call `__init__` with the run's
  `Batching` (none for prediction) and the featurised training split (None when the task is built without data,
  for compilation or benchmarks) and their evaluation
  sets.
  """

  exports = True
  tokenizer = None  # featurises examples; `jbert.predict` sets it once the model's is loaded
  label_keys: tuple[str, ...] = ()
  # Label keys with the sequence as their last axis (NER's per-token labels): bucketed batches cut them too.
  token_keys: tuple[str, ...] = ()
  # Whether batches may be length-bucketed, in training (`data.bucketing` decides whether they are: the run's
  # `Batching` sets `bucketing`) and in `jbert.predict`'s Runner.
  bucketable = True
  # Whether training and evaluation batches may be packed, several examples a row (`data.packing` decides whether
  # they are: the run's `Batching` sets `packing` and `max_sequences`); packed, the model reads each sequence's [CLS]
  # (`cls_positions`) where `reads_cls`, and `token_fill` fills the token keys past a row's sequences.
  packable = False
  unpackable_reason = "not built yet"  # what the log line says when `data.packing` is on for a task that cannot
  reads_cls = False
  # Packed with each of an example's K texts a sequence of its own (bi-encoders): the batch's `text_slots` [N, K]
  # gather the embeddings back across rows, so micro-batches (which split rows and examples apart) cannot pack.
  gathers_texts = False
  token_fill: Mapping[str, int] = {}

  def __init__(self, name: str, *, max_seq_length: int, global_batch_size: int, seed: int,
               train: Mapping[str, np.ndarray] | None = None, eval_sets: Sequence[EvalSet] = (),
               batching: Batching | None = None):
    self.name, self.max_seq_length = name, max_seq_length
    self.global_batch_size, self.seed = global_batch_size, seed
    self._train, self._eval_sets = train, list(eval_sets)
    self.bucketing = self.bucketable
    self.packing, self.max_sequences = False, 1
    if batching is not None:
      self._lay_out(batching)

  def _lay_out(self, batching: Batching) -> None:
    """The run's bucketing and packing, where they apply to this task's batches (said on the console where not)."""
    self.bucketing, self.packing, self.max_sequences = batching.bucketing, batching.packing, batching.max_sequences
    if self.packing and self.packable and self.gathers_texts and batching.grad_accum_steps > 1:
      self.packing = False
      log.info("task %s: data.packing does not apply with optim.grad_accum_steps > 1 (micro-batches would split "
               "an example's texts from its rows); its batches stay %s.", self.name,
               "length-bucketed" if self.buckets() else "padded to max_seq_length")
    elif self.packing and not self.packable:
      log.info("task %s: data.packing does not apply to its batches (%s); they stay %s.", self.name,
               self.unpackable_reason, "length-bucketed" if self.buckets() else "padded to max_seq_length")
    elif self.packing:
      packing.check(batching.data)

  def buckets(self) -> tuple[int, ...] | None:
    packed = self.packing and self.packable
    return streams.buckets(self.max_seq_length) if self.bucketing and self.bucketable and not packed else None

  @property
  def pad_id(self) -> int:
    return self.tokenizer.pad_id if self.tokenizer is not None else 0

  def packed_slots(self) -> int | None:
    return self.max_sequences if self.packing and self.packable else None

  def train_spec(self, rows: int, length: int) -> dict[str, jax.ShapeDtypeStruct]:
    """`batch_spec`, or packed: inputs, `segment_ids`, `position_ids` and token labels [rows, length], the slots'
    `cls_positions`, `sequence_weights` and per-example labels [rows, S] (`streams.PackedStream`)."""
    spec = self.batch_spec(rows, length)
    slots = self.packed_slots()
    if slots is None:
      return spec
    out = {k: jax.ShapeDtypeStruct((rows, length), jnp.int32) for k in (*MODEL_INPUTS, *PACKED_INPUTS[:2])}
    out.update({k: jax.ShapeDtypeStruct((rows, length), spec[k].dtype) for k in self.token_keys})
    out.update({k: jax.ShapeDtypeStruct((rows, slots), jnp.int32) for k in packing.EXAMPLE_SLOT_KEYS})
    out.update({k: jax.ShapeDtypeStruct((rows, slots), spec[k].dtype) for k in self.label_keys
                if k not in self.token_keys})
    return out

  def extra_inputs(self, batch):
    """Packed rows: each token's sequence and position in it, and (`reads_cls`) each sequence's [CLS]."""
    if "segment_ids" not in batch:
      return {}
    return {k: batch[k] for k in PACKED_INPUTS[:3 if self.reads_cls else 2]}

  def slot_weights(self, batch: Batch, labels: jax.Array) -> jax.Array:
    """float32 weights of per-example `labels`: packed [R, S] the slot weights (0: an empty slot), else ones [B]."""
    if "sequence_weights" in batch:
      return batch["sequence_weights"].astype(jnp.float32)
    return jnp.ones(labels.shape[:1], jnp.float32)

  def train_stream(self, shards) -> Stream:
    if self._train is None:
      raise ValueError(f"task {self.name} was built without data (no tokenizer); it cannot train.")
    keys = (*MODEL_INPUTS, *self.label_keys)
    layout = dict(global_batch_size=self.global_batch_size, seed=self.seed, num_shards=shards.num_shards,
                  shards=shards.shards)
    if self.packed_slots() is not None:
      return streams.PackedStream(self._train, keys, max_sequences=self.packed_slots(), pad_id=self.pad_id,
                                  token_keys={k: self.token_fill[k] for k in self.token_keys},
                                  example_keys=[k for k in self.label_keys if k not in self.token_keys],
                                  row_multiple=shards.row_multiple, separate_texts=self.gathers_texts, **layout)
    if self.buckets() is None:
      return streams.FeatureStream(self._train, keys, **layout)
    return streams.BucketedStream(self._train, keys, lengths=self.buckets(),
                                  sequence_keys=(*MODEL_INPUTS, *self.token_keys), **layout)

  def num_train_examples(self) -> int:
    return len(self._train["input_ids"]) if self._train is not None else 0

  def eval_sets(self, shards=None) -> list[EvalSet]:
    del shards  # In memory: every process holds every split whole.
    return list(self._eval_sets)

  @abc.abstractmethod
  def featurise(self, examples: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
    """Model inputs (and labels, where the examples have them) of examples as the task's readers give them."""

  @abc.abstractmethod
  def records(self, eval_set: EvalSet, predictions: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One JSON-ready record per example of `eval_set` (from `decode`), in order: what `jbert.predict` returns
    and the prediction files hold."""


class PredictingTask(FinetuneTask):
  """A fine-tuning task whose models `jbert.predict` serves: its model folder gives the task back
  (`for_prediction`), which reads inputs, featurises them as training did, and turns outputs into records."""

  predicts = True
  # What a server needs to know of its inputs and records: each input is one model sequence, cut to max_length
  # (not windows or endings: a token limit per input applies), and its records score (text, pair) inputs with one
  # number (`score` or `value`: a re-ranker).
  one_sequence_per_input = False
  scores_pairs = False
  title = "fine-tuning"  # what messages call the task
  default_max_length = 128  # when neither the caller nor the fine-tuning run says (capped at the positions)

  @classmethod
  def recognises(cls, folder) -> str | None:
    """The kind this class serves a model `folder` (`jbert.inference.folder.ModelFolder`) with its head as, when the
    folder records no kind (transformers' and sentence-transformers' folders); None: not one of its models."""
    del folder
    return cls.kinds[0]

  @classmethod
  @abc.abstractmethod
  def for_prediction(cls, folder, *, kind: str, max_length: int | None = None, **options) -> "PredictingTask":
    """The task without data for the fine-tuned model in `folder` (its `info`: head, labels; its `run_config`: the
    fine-tuning run's config where known), featurising and decoding as that run did; explicit `max_length` and
    `options` override. `tokenizer` is set once the model's is loaded."""

  @classmethod
  def prediction_length(cls, folder, max_length: int | None) -> int:
    """`max_length`, else the run's `data.max_seq_length`, else `default_max_length` capped at the model's
    positions; refused outside [3, the model's `max_length`]."""
    config = folder.info.config
    limit = config.max_length  # RoBERTa's first position_offset rows of the table serve padding
    if max_length is None:  # `is None`, not `or`: an explicit 0 is refused below, not replaced by the default
      max_length = ((folder.run_config or {}).get("data") or {}).get("max_seq_length") or min(
          cls.default_max_length, limit)
    if not 3 <= max_length <= limit:
      raise ValueError(f"max_length={max_length} must lie in [3, {validation.position_limit(config)}].")
    return int(max_length)

  @abc.abstractmethod
  def read_inputs(self, path: str, *, column: str | None = None, pair_column: str | None = None,
                  pairs: bool = False) -> list[dict[str, Any]]:
    """Prediction examples of an input file (read as the trainer reads its own files); a ValueError names the file
    and line of the first problem. Every example carries `where` ("FILE, line N") for messages."""

  @abc.abstractmethod
  def inputs_from(self, records: Sequence[Any]) -> list[dict[str, Any]]:
    """Prediction examples of Python inputs (texts, tuples or dicts, as the task documents); `where`: "input I"."""

  def group_key(self, example: Mapping[str, Any]) -> Any:  # pylint: disable=unused-argument
    """Examples featurised together share it (multiple choice: the number of endings)."""
    return 0

  def prediction_params(self, params, folder):  # pylint: disable=unused-argument
    """The parameters `model(config)` predicts with, from the head's loaded ones (plus what the task keeps beside
    them in `folder`, as a CRF its transitions)."""
    return params

  def predict_fn(self, model: nn.Module):
    """fn(params, batch) -> `predictions` per row of [B, T] inputs, for `jbert.inference.Runner`; packed rows
    [R, T] (a `packable` task's, `Runner(packing=True)`) give them per slot [R, S, ...] (token outputs per
    token)."""
    def fn(params, batch):
      outputs = model.apply({"params": params}, *(batch[k] for k in MODEL_INPUTS), deterministic=True,
                            **self.extra_inputs(batch))
      return self.predictions(outputs, batch)
    return fn

  @staticmethod
  def recorded_labels(folder) -> tuple[str, ...]:
    """The label names a folder records (`id2label`), else LABEL_i for its number of labels."""
    info = folder.info
    labels = tuple(info.label_names or (f"LABEL_{i}" for i in range(info.num_labels or 0)))
    if not labels:
      raise ValueError(f"The {info.head.architecture} checkpoint records neither num_labels nor id2label.")
    return labels
