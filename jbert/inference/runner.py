"""Batch inference over many variable-length inputs: length-sorted, bucketed, data-parallel, compiled once.

`Runner(fn, params, ...)` applies `fn(params, batch) -> {name: [B, ...]}` to a list of features (dicts of 1-D int
sequences: `input_ids`, optional `token_type_ids`, any extra such as masked positions) and returns one dict of
numpy arrays per feature, in input order. On the way:

* rows are sorted by length and cut into batches, each padded to a bucket length (`bucket_lengths`: steps
  growing with the length, or multiples of `bucket_step`), so XLA compiles a handful of shapes and a short text
  never pays for a long one; the last, partial batch is padded to the smallest of `batch_size`,
  `batch_size / 2`, `/ 4`, ... that holds it, or to a larger one already compiled at its length, with copies of
  one of its own rows (never an all-padding row, whose attention would be degenerate);
* extra 1-D features are zero-padded to the next power of two of their longest row in the batch;
* params are replicated and batches split over a `data` mesh of all local devices; the commands first make
  one XLA:CPU device per core (`use_every_core`);
* executables are cached per (function key, mesh, params layout, batch shapes) for the whole process, so a
  second call with the same model compiles nothing; with `stored` (the commands' functions, whose keys say them
  by value) they are also kept with the persistent compile cache under a key built before tracing
  (`jbert.runtime.stored_programs`), so a second process loads them without tracing `fn`;
* input ids are checked against the vocabulary on the host before anything runs (XLA would clamp them);
* the next batch is dispatched before the previous one's outputs are fetched, so host work overlaps compute.

Outputs named in `token_outputs` have the sequence as axis 1 and come back cut to each row's length.

With `step_tokens` (one device only) a batch is computed a few rows a call (`jbert.inference.steps`).

With `packing` the rows are packed instead (`jbert.inference.packed`): laid end to end, best fit, in rows whose
length follows the call's lengths (at most `max_length`), at most one sequence per 8 tokens a row, `batch_size`
rows a batch; `fn` then reads `segment_ids, position_ids` [R, T] and `cls_positions, sequence_weights` [R, S]
besides the inputs and returns per-slot outputs [R, S, ...] (token outputs [R, T, ...]), which come back per input
as unpacked ones do. A call compiles at most four shapes (two tiers of rows, each a full and a partial batch)
whatever its lengths.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import importlib.util
import itertools
import os
from typing import Any, Callable, Hashable, Iterable, Iterator, Mapping, Sequence

import jax
from jax.sharding import NamedSharding, PartitionSpec as P
import numpy as np

from jbert.data import packing
from jbert.runtime import sharding, stored_programs
from jbert.inference import packed, steps
from jbert.inference.progress import ProgressLine

DEFAULT_BATCH_SIZE = 32
DEFAULT_CHUNK_SIZE = 32768
# Progress is drawn by default from this many rows on: below it a run takes seconds.
PROGRESS_MIN_ROWS = 2048
_SEQUENCE_KEYS = ("input_ids", "token_type_ids", "attention_mask")
_MAX_COMPILED = 256

Features = Mapping[str, Sequence[int]]
_compiled: collections.OrderedDict[Hashable, Any] = collections.OrderedDict()


def bucket_lengths(max_length: int, step: int | None = None) -> tuple[int, ...]:
  """Padded lengths up to `max_length` (which is always one).

  With `step`, its multiples. By default the spacing grows with the length (4 up to 64, then 8 up to 128, 16 up
  to 256, ...), so padding adds at most about an eighth to a row past 32 tokens and 40 shapes cover 512 tokens.
  Sentence embeddings are mostly 10-40 tokens: steps of 8 there padded botchan.txt's sentences by 35% (batch
  32), steps of 4 by 26%, against 18% when each batch is padded to its own longest row, which compiles a shape
  per length.
  """
  if max_length < 1 or (step is not None and step < 1):
    raise ValueError(f"bucket_lengths needs max_length >= 1 and step >= 1, got {max_length} and {step}.")
  if step is not None:
    return tuple(range(step, max_length, step)) + (max_length,)
  lengths, length = [], 4
  while length < max_length:
    lengths.append(length)
    length += max(4, 1 << max(length.bit_length() - 4, 0))  # 4 while < 64, 8 while < 128, 16 while < 256, ...
  return tuple(lengths) + (max_length,)


def batch_sizes(batch_size: int, num_devices: int) -> tuple[int, ...]:
  """`batch_size` rounded up to a multiple of `num_devices`, then its halvings down to one row per device."""
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  sizes, size = [], batch_size
  while True:
    rounded = -(-size // num_devices) * num_devices
    if not sizes or rounded < sizes[-1]:
      sizes.append(rounded)
    if rounded == num_devices:
      return tuple(sizes)
    size = max(size // 2, 1)


@dataclasses.dataclass(frozen=True)
class PlannedBatch:
  rows: np.ndarray  # Positions (into the features given) of the real rows, longest first.
  length: int  # Padded sequence length: a bucket length.
  size: int  # Padded batch size: one of `batch_sizes`.


def plan_batches(lengths: Sequence[int], batch_size: int, buckets: Sequence[int],
                 num_devices: int = 1) -> list[PlannedBatch]:
  """Rows sorted by length (longest first) and cut into consecutive batches, each padded to the bucket of its
  longest row. Only the last batch can be partial; it takes the smallest of `batch_sizes` that holds it."""
  lengths = np.asarray(lengths, dtype=np.int64)
  buckets = np.asarray(sorted(buckets))
  if len(lengths) and lengths.max() > buckets[-1]:
    raise ValueError(f"A row has {lengths.max()} tokens, more than the largest bucket {buckets[-1]}; truncate "
                     "the inputs to max_length first.")
  sizes = batch_sizes(batch_size, num_devices)
  order = np.argsort(-lengths, kind="stable")
  batches = []
  for start in range(0, len(order), sizes[0]):
    rows = order[start:start + sizes[0]]
    length = int(buckets[np.searchsorted(buckets, lengths[rows[0]])])  # Smallest bucket >= the longest row.
    batches.append(PlannedBatch(rows=rows, length=length, size=min(s for s in sizes if s >= len(rows))))
  return batches


def extra_widths(features: Sequence[Features], rows: Sequence[int]) -> dict[str, int]:
  """Padded width of each extra 1-D feature: the next power of two of its longest row."""
  return {k: 1 << max(max(len(features[r][k]) for r in rows) - 1, 0).bit_length()
          for k in features[rows[0]] if k not in _SEQUENCE_KEYS}


def assemble(features: Sequence[Features], planned: PlannedBatch) -> dict[str, np.ndarray]:
  """The padded int32 arrays of one planned batch; rows past the real ones repeat its first (longest) row."""
  rows = list(planned.rows) + [planned.rows[0]] * (planned.size - len(planned.rows))
  shape = (planned.size, planned.length)
  batch = {name: np.zeros(shape, np.int32) for name in _SEQUENCE_KEYS}
  widths = extra_widths(features, planned.rows)
  extras = list(widths)
  batch.update({k: np.zeros((planned.size, w), np.int32) for k, w in widths.items()})
  for i, r in enumerate(rows):
    feature = features[r]
    ids = feature["input_ids"]
    n = len(ids)
    batch["input_ids"][i, :n] = ids
    batch["attention_mask"][i, :n] = 1
    if "token_type_ids" in feature:
      batch["token_type_ids"][i, :n] = feature["token_type_ids"]
    for k in extras:
      batch[k][i, :len(feature[k])] = feature[k]
  return batch


_ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin")


def cpu_devices_to_make(environ: Mapping[str, str], cores: int, jax_started: bool, num_cpu_devices: int,
                        accelerator: bool) -> int | None:
  """How many XLA:CPU devices `use_every_core` asks for, or None to leave JAX as it is: when JAX has started,
  when an accelerator or a non-CPU platform is there, when the user chose a device count, or on one core."""
  chosen = ("xla_force_host_platform_device_count" in environ.get("XLA_FLAGS", "")
            or "JAX_NUM_CPU_DEVICES" in environ or num_cpu_devices != -1)
  platforms = environ.get("JAX_PLATFORMS", "")
  if jax_started or accelerator or chosen or platforms not in ("", "cpu") or cores < 2:
    return None
  return cores


def use_every_core() -> int | None:
  """Makes one XLA:CPU device per core before JAX starts; returns the count, or None where it changed nothing.

  XLA:CPU runs a batched matmul (attention's [B, N, T, T] products) on one thread, so with the single default
  device the other cores idle through attention; the runner is data-parallel over local devices, so with one
  device per core each core runs its share of the batch. BERT-base, 32 x 128, float32 forward on this 2-core
  host: 12.0 s on one device, 11.2 s on two. Called by the inference commands; a library user who wants it
  calls it first thing (or sets `jax_num_cpu_devices` themselves).
  """
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  from jbert import distributed  # pylint: disable=g-import-not-at-top
  accelerator = distributed.on_cloud_tpu_vm() or any(
      importlib.util.find_spec(m) is not None for m in _ACCELERATOR_PLUGINS)
  count = cpu_devices_to_make(os.environ, len(os.sched_getaffinity(0)), xla_bridge.backends_are_initialized(),
                              jax.config.jax_num_cpu_devices, accelerator)
  if count is not None:
    jax.config.update("jax_num_cpu_devices", count)
  return count


def default_mesh() -> jax.sharding.Mesh:
  """A data-parallel mesh over every local device (one per process: equal meshes share cache entries)."""
  return _mesh_over(tuple(jax.local_devices()))


@functools.lru_cache(maxsize=None)
def _mesh_over(devices: tuple[jax.Device, ...]) -> jax.sharding.Mesh:
  return sharding.make_mesh(data=-1, devices=list(devices))


def compiled_count() -> int:
  """Executables held by the process-wide cache (for tests and diagnostics)."""
  return len(_compiled)


class NonFiniteOutput(ValueError):
  """Outputs of `rows` (indices into the features of one `Runner.run` call) hold NaN or inf: weights that are
  finite can still overflow, and a prediction made from such numbers would look valid. Callers name the rows as
  their users know them (file lines, input indices)."""

  def __init__(self, rows: Sequence[int]):
    self.rows = tuple(sorted(rows))
    super().__init__(f"the model's outputs for rows {describe_rows(self.rows)} are not finite (NaN or inf)")


def describe_rows(rows: Sequence[Any], limit: int = 5) -> str:
  """`rows` for a one-line message: the first `limit`, then how many more."""
  shown = ", ".join(str(r) for r in rows[:limit])
  return shown + (f" and {len(rows) - limit} more" if len(rows) > limit else "")


NON_FINITE_FIX = ("the weights overflow on these inputs (e.g. float16/bfloat16 range, or a damaged model); try "
                  "--dtype=float32 or another model")


class Runner:
  """Applies `fn(params, batch) -> {name: [B, ...]}` to many features; see the module docstring.

  Args:
    fn: pure function of (params, batch dict of int32 arrays `input_ids, token_type_ids, attention_mask [B, L]`
      and extras `[B, P]`) returning a dict of arrays with a leading batch axis.
    params: the pytree `fn` takes; replicated over the mesh once.
    key: hashable naming `fn` for the process-wide executable cache (same key = same function); default `fn`.
    max_length: longest row accepted (and the largest bucket).
    vocab_size / type_vocab_size: ids are checked against them on the host.
    batch_size: rows per batch (rounded up to a multiple of the device count).
    bucket_step: bucket lengths are its multiples up to max_length (default: `bucket_lengths`' growing steps);
      `buckets` gives them explicitly instead.
    mesh: default: a `data` mesh over all local devices.
    token_outputs: outputs whose axis 1 is the sequence; returned cut to each row's length.
    packing: several inputs a row (see the module docstring); `buckets` are then the lengths packed rows take.
    packed_slots: sequences a packed row holds at most (default one per 8 tokens).
    step_tokens: compute a batch's real rows `step_tokens // length` a call, the last call taking the rows left
      (`steps.split`), in rows laid for the fewest tokens (`packed.plan`'s `fewest_tokens`).
    stored: keep the compiled programs with the persistent compile cache under `key` (module docstring); only for
      a `key` that names by value everything `fn` computes besides jbert's own code (`stored_programs.describe`).
  """

  def __init__(self, fn: Callable[[Any, dict[str, jax.Array]], Mapping[str, jax.Array]], params: Any, *,
               max_length: int, key: Hashable | None = None, vocab_size: int | None = None,
               type_vocab_size: int | None = None, batch_size: int = DEFAULT_BATCH_SIZE,
               bucket_step: int | None = None, buckets: Sequence[int] | None = None, mesh=None,
               token_outputs: Sequence[str] = (), packing: bool = False, packed_slots: int | None = None,
               stored: bool = False, step_tokens: int | None = None):
    self.fn, self.key = fn, fn if key is None else key
    self.stored = stored
    self.mesh = mesh or default_mesh()
    self.num_devices = self.mesh.devices.size
    self.batch_size = batch_size
    self.buckets = tuple(sorted(buckets)) if buckets else bucket_lengths(max_length, bucket_step)
    self.max_length = self.buckets[-1]
    self.vocab_size, self.type_vocab_size = vocab_size, type_vocab_size
    self.token_outputs = frozenset(token_outputs)
    if packed_slots is not None and packed_slots < 1:
      raise ValueError(f"packed_slots must be >= 1 (sequences a packed row holds), got {packed_slots}.")
    self.packing, self.packed_slots = packing, packed_slots
    self._replicated = NamedSharding(self.mesh, P())
    self._rows = NamedSharding(self.mesh, P(sharding.BATCH_AXES))
    self.params = jax.device_put(params, self._replicated)
    leaves, treedef = jax.tree.flatten(self.params)
    self._params_key = (treedef, tuple((x.shape, str(x.dtype)) for x in leaves))
    self._mesh_key = (tuple(self.mesh.shape.items()), tuple(d.id for d in self.mesh.devices.flat))
    self._jitted = jax.jit(fn, in_shardings=(self._replicated, self._rows), out_shardings=self._rows)
    self.step_tokens = step_tokens

  @property
  def step_tokens(self) -> int | None:
    return self._step_tokens

  @step_tokens.setter
  def step_tokens(self, tokens: int | None) -> None:
    """Steps are calls of the same `fn` at fewer rows: the programs and their keys stay `fn`'s."""
    if tokens is not None and (tokens < 1 or self.num_devices != 1):
      raise ValueError(f"step_tokens={tokens}: a positive number of tokens, on a one-device mesh only (this one "
                       f"has {self.num_devices}).")
    self._step_tokens = tokens

  def _dispatch(self, batch: dict[str, np.ndarray]) -> list[Mapping[str, jax.Array]]:
    """The batch's outputs as futures: whole, or a step at a time (`steps.split`: its real rows only)."""
    parts = steps.split(batch, self.step_tokens) if self.step_tokens else [batch]
    return [self._executable(part)(self.params, part) for part in parts]

  def computed(self, lengths: Sequence[int]) -> list[tuple[int, int]]:
    """(rows, row length) of each batch `run` computes for inputs of `lengths`: the rows a batch is padded to,
    or with `step_tokens` the packed rows only (`steps.split` skips the rest)."""
    return [(p.placement.rows if self.step_tokens and isinstance(p, packed.PackedBatch) else p.size,
             p.row_length if isinstance(p, packed.PackedBatch) else p.length) for p in self._plan(lengths)]

  def row_counts(self, length: int) -> Sequence[int]:
    """The row counts this Runner's programs take at rows of `length`: its batch sizes, or with `step_tokens`
    every count a step can have (what a server warms up)."""
    if self.step_tokens:  # a batch's last step takes the rows left: any count up to a full step
      return range(1, min(steps.rows_a_step(length, self.step_tokens), self.batch_size) + 1)
    return batch_sizes(self.batch_size, self.num_devices)

  # ---------------------------------------------------------------------------------------------------------

  def run(self, features: Sequence[Features], progress: ProgressLine | bool | None = None,
          desc: str = "rows") -> list[dict[str, np.ndarray]]:
    """Outputs per feature, in the order given."""
    features = list(features)
    own_progress = not isinstance(progress, ProgressLine)
    if own_progress:
      enabled = len(features) >= PROGRESS_MIN_ROWS if progress is None else bool(progress)
      progress = ProgressLine(len(features), desc, enabled=enabled)
    lengths = [len(f["input_ids"]) for f in features]
    results: list[dict[str, np.ndarray] | None] = [None] * len(features)
    self._non_finite: list[int] = []
    self._run_batches(features, self._plan(lengths), lengths, results, progress)
    if self._non_finite and self.packing:
      # A NaN or inf reaches the other sequences of its packed row (their attention weight 0 times inf is NaN), so
      # the suspects run again one a row: only the inputs that overflow on their own are named.
      suspects, self._non_finite = sorted(set(self._non_finite)), []
      alone = [features[i] for i in suspects]
      again: list[dict[str, np.ndarray] | None] = [None] * len(alone)
      plans = plan_batches([lengths[i] for i in suspects], self.batch_size, self.buckets, self.num_devices)
      self._run_batches(alone, plans, [lengths[i] for i in suspects], again, ProgressLine(0, enabled=False))
      for i, row in zip(suspects, again):
        results[i] = row
      self._non_finite = [suspects[i] for i in self._non_finite]
    if own_progress:
      progress.close()
    if self._non_finite:
      raise NonFiniteOutput(self._non_finite)
    return results

  def _run_batches(self, features: Sequence[Features], plans, lengths: Sequence[int],
                   results: list[dict[str, np.ndarray] | None], progress: ProgressLine) -> None:
    pending = None
    for planned in plans:
      planned = self._reuse_compiled_size(features, planned)
      batch = self._assemble(features, planned)
      self._validate(batch, planned)
      outputs = self._dispatch(batch)  # Dispatched; runs while the host goes on.
      if pending is not None:
        self._collect(*pending, lengths, results, progress)
      pending = (planned, outputs)
    if pending is not None:
      self._collect(*pending, lengths, results, progress)

  def stream(self, features: Iterable[Features], chunk_size: int = DEFAULT_CHUNK_SIZE,
             progress: ProgressLine | None = None) -> Iterator[list[dict[str, np.ndarray]]]:
    """`run` over consecutive chunks of an iterable: memory bounded by the chunk, outputs in input order."""
    iterator = iter(features)
    while chunk := list(itertools.islice(iterator, chunk_size)):
      yield self.run(chunk, progress=progress if progress is not None else False)

  # ---------------------------------------------------------------------------------------------------------

  def _plan(self, lengths: Sequence[int]) -> list[PlannedBatch] | list[packed.PackedBatch]:
    sizes = batch_sizes(self.batch_size, self.num_devices)
    if self.packing:
      return packed.plan(lengths, batch_sizes=sizes, buckets=self.buckets, slots=self.packed_slots,
                         fewest_tokens=bool(self.step_tokens))
    return plan_batches(lengths, self.batch_size, self.buckets, self.num_devices)

  def _assemble(self, features: Sequence[Features], planned) -> dict[str, np.ndarray]:
    if isinstance(planned, packed.PackedBatch):  # the batch's inputs, unpadded, then laid end to end
      packed.check_inputs(features, planned)
      inputs = assemble(features, PlannedBatch(planned.features, planned.row_length, len(planned.features)))
      return packing.pack_examples(inputs, planned.placement, rows=planned.size, slots=planned.slots, token_keys={})
    return assemble(features, planned)

  def _validate(self, batch: dict[str, np.ndarray], planned) -> None:
    for name, limit, what in (("input_ids", self.vocab_size, "the model's vocab_size"),
                              ("token_type_ids", self.type_vocab_size, "its type_vocab_size")):
      x = batch[name]
      if limit is None or (x.min() >= 0 and x.max() < limit):
        continue
      i, j = np.argwhere((x < 0) | (x >= limit))[0]
      if isinstance(planned, packed.PackedBatch):  # the input the token belongs to, and its position there
        where, position = packed.input_at(planned, batch["segment_ids"], i, j), batch["position_ids"][i, j]
      else:
        where, position = planned.rows[min(i, len(planned.rows) - 1)], j
      raise ValueError(f"{name} of input {where} holds {x[i, j]} at position {position}, outside [0, {limit}) = "
                       f"{what}; the tokenizer does not match the model.")

  def _reuse_compiled_size(self, features: Sequence[Features], planned):
    """A partial batch padded further, to the smallest batch size already compiled at its length, if any.

    The partial batch holds the shortest rows, so the extra rows cost little; compiling its own size costs a
    second or more (BERT-base), and most calls end with a partial batch of some other size. Packed batches keep
    their own size: their shapes are one or two anyway, and outputs that depend on the inputs only (not on what
    the process compiled before) keep a resumed search index bit-identical to an uninterrupted build.
    """
    if isinstance(planned, packed.PackedBatch):
      return planned
    shapes = {k: (planned.length,) for k in _SEQUENCE_KEYS}
    shapes.update({k: (w,) for k, w in extra_widths(features, planned.rows).items()})
    for size in sorted(batch_sizes(self.batch_size, self.num_devices)):
      if size >= planned.size and self._cache_key({k: (size, *v) for k, v in shapes.items()}) in _compiled:
        return dataclasses.replace(planned, size=size)
    return planned

  def _cache_key(self, shapes: Mapping[str, tuple[int, ...]]) -> Hashable:
    return (self.key, self._mesh_key, self._params_key, tuple(sorted(shapes.items())))

  def _executable(self, batch: dict[str, np.ndarray]):
    cache_key = self._cache_key({k: v.shape for k, v in batch.items()})
    exe = _compiled.get(cache_key)
    if exe is None:
      stored = stored_programs.program_key(self.key, self.mesh, (self.params, batch)) if self.stored else None
      exe = stored_programs.load(stored, tuple(self.mesh.devices.flat))
      if exe is None:
        exe = stored_programs.compile_and_store(self._jitted.lower(self.params, batch), stored)
      _compiled[cache_key] = exe
      if len(_compiled) > _MAX_COMPILED:
        _compiled.popitem(last=False)
    else:
      _compiled.move_to_end(cache_key)
    return exe

  def _collect(self, planned, outputs, lengths, results, progress: ProgressLine) -> None:
    host = steps.join(jax.device_get(outputs), planned.size)
    if isinstance(planned, packed.PackedBatch):  # per slot [R, S, ...] and per token [R, T, ...] -> per input
      host = packing.unpack_outputs(host, planned.placement, token_outputs=tuple(self.token_outputs),
                                    length=planned.row_length)
      inputs = planned.features
    else:
      inputs = planned.rows
    rows = [{name: value[i, :lengths[r]] if name in self.token_outputs else value[i]
             for name, value in host.items()} for i, r in enumerate(inputs)]
    for r, row in zip(inputs, rows):
      if not all(np.isfinite(v).all() for v in row.values() if np.issubdtype(v.dtype, np.floating)):
        self._non_finite.append(int(r))
      results[r] = row
    progress.update(len(inputs))
