"""What a compiled TPU step costs on paper: the chips' published figures, the bytes each chip sends in the step's
collectives (read off the compiled HLO) and the roofline step time and MFU they imply.

Chip figures (per chip; Google Cloud's TPU system-architecture pages, docs.cloud.google.com/tpu/docs/v4, v5e, v5p,
v6e): dense bf16 peak, HBM bandwidth, and the inter-chip interconnect (ICI) bandwidth in one direction summed over
the chip's ports (half the "bidirectional ICI bandwidth per chip": v5e 400 GB/s, v5p 1200 GB/s, v6e 800 GB/s; v4's
page gives none, and its 2,400 Gbps = 300 GB/s is the figure Google compared v5p's 4,800 Gbps against at v5p's
launch, which matches v4's 1.1 PB/s all-reduce bandwidth over 4,096 chips).

Collective bytes are what each chip sends with bandwidth-optimal algorithms over a group of n chips: an all-reduce
of S bytes 2(n-1)/n * S, an all-gather or reduce-scatter of S (the whole array) (n-1)/n * S, an all-to-all (n-1)/n
* S, a collective-permute S. Their time at the ICI figure assumes every port busy at once, a lower bound: a ring
along one torus dimension uses half of a v5e chip's four ports.
"""
from __future__ import annotations

import math
import re
from typing import Any, NamedTuple


class Chip(NamedTuple):
  hbm_gib: float          # HBM per chip
  chip_config: str        # libtpu's chip configuration (v4, v5p: both TensorCores as one megacore device)
  peak_flops: float       # dense bf16 FLOP/s
  hbm_bytes_s: float      # HBM bandwidth
  ici_bytes_s: float      # ICI, one direction, all ports


CHIPS = {
    "v4": Chip(32, "megacore", 275e12, 1200e9, 300e9),
    "v5e": Chip(16, "default", 197e12, 819e9, 200e9),
    "v5p": Chip(95, "megacore", 459e12, 2765e9, 600e9),
    "v6e": Chip(32, "default", 918e12, 1638e9, 400e9),
}

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}
_SHAPE = re.compile(r"\b(pred|[su]8|[suf]16|bf16|[suf]32|[suf]64|c64|c128)\[([\d,]*)\]")
_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_OP = re.compile(r"=\s*(.*?)\s(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(-start)?\(")
_HEADER = re.compile(r"^(?:ENTRY\s+)?(%[\w.\-]+)\s")
_CALLS = re.compile(r"(?:calls|body|condition|to_apply|branch_computations)=\{?(%[\w.\-]+(?:,\s*%[\w.\-]+)*)")
_WHILE = re.compile(r"\swhile\(.*condition=(%[\w.\-]+), body=(%[\w.\-]+)")
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_LIST_GROUPS = re.compile(r"replica_groups=\{\{([\d,]*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([\d,]+)\]<=")
_CHANNEL = re.compile(r"channel_id=(\d+)")


def _shape_bytes(text: str) -> list[int]:
  return [math.prod(int(d) for d in dims.split(",") if d) * _BYTES[dtype] for dtype, dims in _SHAPE.findall(text)]


def _group_size(line: str, num_devices: int) -> int:
  if m := _MESH_GROUPS.search(line):
    sizes = dict((k.strip("' "), int(v)) for k, v in (kv.split("=") for kv in m.group(1).split(",")))
    return math.prod(sizes[a.strip("' ")] for a in m.group(2).split(","))
  if m := _LIST_GROUPS.search(line):
    return len(m.group(1).split(","))
  if m := _IOTA_GROUPS.search(line):
    return int(m.group(1).split(",")[-1])
  return num_devices


def _computations(hlo: str) -> dict[str, list[str]]:
  """Instruction lines of each computation of the module's text."""
  comps, name = {}, None
  for line in hlo.splitlines():
    if (m := _HEADER.match(line)) and line.rstrip().endswith("{"):
      name = m.group(1)
      comps[name] = []
    elif name is not None and line.startswith("  "):
      comps[name].append(line)
  return comps


def _trip_counts(comps: dict[str, list[str]]) -> dict[str, int]:
  """How many times each computation runs per step: while bodies (XLA's scanned layers, its windowed collective
  matmuls) by the loop bound, the largest integer constant their condition holds, and everything they call;
  nested loops multiply."""
  times = {name: 1 for name in comps}
  callees = {name: [c for line in lines for group in _CALLS.findall(line) for c in re.split(r",\s*", group)]
             for name, lines in comps.items()}
  loops = []
  for lines in comps.values():
    for line in lines:
      if m := _WHILE.search(line):
        bounds = [int(v) for l in comps.get(m.group(1), [])
                  for v in re.findall(r"[su](?:32|64)\[\][^=]*constant\((\d+)\)", l)]
        loops.append((m.group(2), max(bounds, default=1)))

  def scale(name, factor, seen):
    if name in seen or name not in times:
      return
    seen.add(name)
    times[name] *= factor
    for callee in callees.get(name, ()):
      scale(callee, factor, seen)

  for body, trips in loops:
    scale(body, trips, set())
  return times


def collective_bytes(hlo: str, num_devices: int) -> dict[str, float]:
  """Bytes each device sends per step in each kind of collective of a compiled module's text (`as_text()`).

  An all-reduce inside a computation XLA named `all-reduce-scatter` is the reduce half of a reduce-scatter and is
  counted as one. Collectives inside a while loop count once per trip; one channel counts once.
  """
  comps = _computations(hlo)
  times = _trip_counts(comps)
  found = {}  # channel (or position) -> (kind, bytes per run, runs per step)
  for name, lines in comps.items():
    for index, line in enumerate(lines):
      m = _OP.search(line)
      if not m:
        continue
      shapes, kind, start = m.groups()
      sizes = [b for b in _shape_bytes(shapes) if b > 4] or _shape_bytes(shapes)  # async starts carry u32 flags
      if start and kind in ("all-gather", "collective-permute") and len(sizes) > 1:
        half = len(sizes) // 2  # (operands, results) of an async start
        sizes = sizes[half:] if kind == "all-gather" else sizes[:half]
      size, n = float(sum(sizes)), _group_size(line, num_devices)
      if kind == "all-reduce" and name.startswith("%all-reduce-scatter"):
        kind = "reduce-scatter"  # the whole array is reduced, each device keeps its shard
      elif kind == "reduce-scatter":
        size *= n  # the op's result is the shard
      factor = {"all-reduce": 2 * (n - 1) / n, "collective-permute": 1.0}.get(kind, (n - 1) / n)
      # One collective can appear twice in the text: XLA's TPU async collectives hold it in the start's fused
      # computation and again in the fusion that overlaps it with compute, under the same channel.
      channel = _CHANNEL.search(line)
      key = int(channel.group(1)) if channel else (name, index)
      runs = max(times[name], found[key][2]) if key in found else times[name]
      found[key] = (kind, factor * size, runs)
  sent = dict.fromkeys(_KINDS, 0.0)
  for kind, size, runs in found.values():
    sent[kind] += size * runs
  return sent


def roofline(chip: Chip, flops: float, bytes_accessed: float, ici_bytes: float,
             model_flops: float) -> dict[str, Any]:
  """Per-device seconds of a step at the chip's peaks (compute, HBM, ICI), the bound (overlapped: their maximum;
  serial: their sum) and the MFU each implies for `model_flops` per device."""
  compute_s, memory_s, ici_s = flops / chip.peak_flops, bytes_accessed / chip.hbm_bytes_s, ici_bytes / chip.ici_bytes_s
  overlapped, serial = max(compute_s, memory_s, ici_s), max(compute_s, memory_s) + ici_s
  mfu = lambda s: model_flops / (s * chip.peak_flops) if s else None
  return {"compute_s": compute_s, "memory_s": memory_s, "ici_s": ici_s, "step_s_overlapped": overlapped,
          "step_s_serial": serial, "mfu_overlapped": mfu(overlapped), "mfu_serial": mfu(serial)}


def splash_flops(batch_rows: int, length: int, hidden: int, layers: int, windows=None, block: int = 128) -> float:
  """FLOPs of splash attention's Mosaic kernels in a train step (XLA's cost analysis does not see inside them):
  per layer and row, the forward's q k^T and p v, the dQ kernel's q k^T, dO v^T and dS k, and the dK/dV kernel's
  q k^T, dO v^T, p^T dO and dS^T q, each 2 T^2 H: 9 matmuls, against the 6 of an XLA attention that keeps p.

  `windows` (one per layer: tokens attended on either side, None for every key) counts a sliding-window layer
  at the (block x block) tiles its mask leaves non-empty, the ones the kernel computes."""
  padded = -(-length // 128) * 128
  per_layer = [padded * padded if w is None else _window_tiles(padded // block, w, block) * block * block
               for w in (windows or (None,) * layers)]
  return 9 * 2 * sum(per_layer) * hidden * batch_rows


def _window_tiles(blocks: int, window: int, block: int) -> int:
  """Tiles (i, j) of a blocks x blocks grid holding a query and a key at most `window` apart: the nearest tokens
  of blocks |i - j| apart are (|i - j| - 1) * block + 1 apart."""
  reach = (window - 1) // block + 1 if window > 0 else 0
  return sum(min(blocks - 1, i + reach) - max(0, i - reach) + 1 for i in range(blocks))
