"""Device mesh and the mapping from logical axis names to mesh axes.

The model names every weight and activation axis logically (`vocab, embed, mlp, heads, kv, layers`,
`activation_*`); this module is the only place that turns those names into a `jax.sharding.Mesh` layout.
Mesh axes:
  data    pure data parallelism (replicated weights); spans slices over DCN when `mesh.dcn_data` > 1
  fsdp    data parallelism with weights and optimiser state sharded along `embed` (ZeRO-3 style)
  tensor  Megatron-style tensor parallelism over heads, mlp and vocab
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# (logical name, mesh axis or axes). Flax uses the first rule whose mesh axis is still free in a given array,
# so an `[embed, mlp]` kernel shards as (fsdp, tensor) and an `[embed, embed]`-like one never uses fsdp twice.
DEFAULT_RULES = (
    ("activation_batch", BATCH_AXES),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv", None),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("transform", "tensor"),  # the H×H pooler and MLM transform kernels: shardable apart from the MLP
    ("heads", "tensor"),
    ("kv", None),
    ("layers", None),
)

log = logging.getLogger("jbert")


def rules_from_config(rules: Sequence[Sequence[Any]] | None) -> tuple[tuple[str, Any], ...]:
  """Normalises rules from a config (lists from JSON/ConfigDict become tuples)."""
  if rules is None:
    return DEFAULT_RULES
  out = []
  for name, axes in rules:
    out.append((name, tuple(axes) if isinstance(axes, (list, tuple)) else axes))
  return tuple(out)


def mesh_shape(data: int, fsdp: int, tensor: int, num_devices: int) -> tuple[int, int, int]:
  """Resolves one -1 entry so that the product equals `num_devices`; raises a clear error otherwise."""
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1:
    raise ValueError(f"mesh: at most one of mesh.data/fsdp/tensor may be -1, got {tuple(sizes)}.")
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh: sizes must be positive or -1, got data={data} fsdp={fsdp} tensor={tensor}.")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if num_devices % known:
      raise ValueError(
          f"mesh: cannot fill -1: {num_devices} devices are not divisible by the product of the other axes "
          f"({known}). Set mesh.data/fsdp/tensor so their product divides {num_devices}.")
    sizes[sizes.index(-1)] = num_devices // known
  if math.prod(sizes) != num_devices:
    raise ValueError(
        f"mesh: data×fsdp×tensor = {sizes[0]}×{sizes[1]}×{sizes[2]} = {math.prod(sizes)} does not match the "
        f"{num_devices} available devices. Set one of --config.mesh.data/fsdp/tensor to -1 to fill the rest.")
  return tuple(sizes)


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, dcn_data: int = 1,
              devices: Sequence[jax.Device] | None = None) -> Mesh:
  """Builds the (data, fsdp, tensor) mesh. With `dcn_data` > 1 the data axis spans slices over DCN."""
  devices = list(devices if devices is not None else jax.devices())
  axis_types = (AxisType.Auto,) * len(MESH_AXES)
  if dcn_data > 1:
    from jax.experimental import mesh_utils  # pylint: disable=g-import-not-at-top
    if len(devices) % dcn_data:
      raise ValueError(f"mesh: {len(devices)} devices cannot be split into mesh.dcn_data={dcn_data} slices.")
    ici = mesh_shape(data, fsdp, tensor, len(devices) // dcn_data)
    grid = mesh_utils.create_hybrid_device_mesh(ici, (dcn_data, 1, 1), devices)
    return Mesh(grid, MESH_AXES, axis_types=axis_types)
  shape = mesh_shape(data, fsdp, tensor, len(devices))
  # A whole slice (all of this process's devices, or an AOT topology's compile-only devices, which are none of
  # them): jax.make_mesh lays the axes along the TPU torus. A subset of the local devices keeps the given order.
  local = set(jax.devices())
  if len(devices) == len(local) or not local.intersection(devices):
    return jax.make_mesh(shape, MESH_AXES, axis_types=axis_types, devices=devices)
  return Mesh(np.asarray(devices).reshape(shape), MESH_AXES, axis_types=axis_types)


def data_parallel_size(mesh: Mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) dimension over data×fsdp, the rest replicated."""
  return NamedSharding(mesh, P(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def _fit_spec(spec: P, shape: Sequence[int], mesh: Mesh, path: str) -> P:
  """Drops mesh axes that do not divide a dimension (e.g. a 30522-row vocabulary over tensor=4).

  Such a dimension is replicated instead of failing at compile time; the layout stays correct, only less
  memory is saved, and the fallback is logged so it can be fixed (e.g. by padding the vocabulary).
  """
  fitted = []
  for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    size = math.prod(mesh.shape[a] for a in names)
    if names and dim % size:
      log.info("sharding: %s dim %d (size %d) is not divisible by %s=%d; replicating it.",
               path, len(fitted), dim, names, size)
      fitted.append(None)
    else:
      fitted.append(axes)
  return P(*fitted)


def _unbox_shapes(tree: Any) -> Any:
  # `nn.meta.unbox` would apply sharding constraints to the abstract values under active rules.
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  return jax.tree.map(lambda x: x.unbox(apply_constraint=False) if is_box(x) else x, tree, is_leaf=is_box)


def logical_to_shardings(boxed_abstract: Any, mesh: Mesh, rules) -> Any:
  """NamedShardings for an abstract pytree whose leaves may be `nn.LogicallyPartitioned` boxes.

  The result has the structure of the UNBOXED tree. Leaves without logical names are replicated.
  """
  logical_specs = nn.get_partition_spec(boxed_abstract)
  mesh_specs = nn.logical_to_mesh(logical_specs, rules)
  shapes = _unbox_shapes(boxed_abstract)
  is_spec = lambda x: isinstance(x, P)

  def fit(path, spec, shape):
    return NamedSharding(mesh, _fit_spec(spec, shape.shape, mesh, jax.tree_util.keystr(path)))

  return jax.tree_util.tree_map_with_path(fit, mesh_specs, shapes, is_leaf=is_spec)


def abstract_and_shardings(boxed_init: Callable[..., Any], mesh: Mesh, rules, *args) -> tuple[Any, Any]:
  """(unboxed abstract tree, NamedShardings) of what `boxed_init(*args)` returns, without allocating it.

  Jitting the init with these `out_shardings` creates every array directly in its shards: no unsharded copy of
  the parameters or optimiser state ever exists.
  """
  boxed = jax.eval_shape(boxed_init, *args)
  with nn.logical_axis_rules(rules):
    shardings = logical_to_shardings(boxed, mesh, rules)
  return _unbox_shapes(boxed), shardings


@dataclasses.dataclass(frozen=True)
class ShardingReport:
  """How much of a state lives sharded; printed at start-up so a bad rule set is visible at once."""
  total_bytes: int
  per_device_bytes: int
  sharded_leaves: int
  total_leaves: int

  def __str__(self):
    gib = 1024 ** 3
    return (f"{self.total_bytes / gib:.3f} GiB in {self.total_leaves} arrays; {self.sharded_leaves} sharded; "
            f"{self.per_device_bytes / gib:.3f} GiB per device")


def sharding_report(abstract: Any, shardings: Any) -> ShardingReport:
  total = per_device = sharded = count = 0
  for leaf, sharding in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings)):
    nbytes = math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize
    shard_shape = sharding.shard_shape(leaf.shape)
    total += nbytes
    per_device += math.prod(shard_shape) * np.dtype(leaf.dtype).itemsize
    sharded += tuple(shard_shape) != tuple(leaf.shape)
    count += 1
  return ShardingReport(total, per_device, sharded, count)
