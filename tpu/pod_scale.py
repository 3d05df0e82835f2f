r"""Pod scale on paper: the train step compiled ahead of time for whole pod slices, data-parallel and FSDP meshes.

  python tpu/pod_scale.py --configs=base,large --topologies=v5e:16x16,v4:4x4x4 --meshes=data,fsdp

For each (config, topology, mesh) `tpu/aot_compile.py` compiles the step of `configs/NAME.py:fast` (no attention
dropout, so splash attention trains) at `--rows_per_chip` sequences per chip, and this prints per chip: HBM, the
bytes the step's collectives send (from the compiled HLO, `tpu/hlo_costs.py`), their time at the chip's ICI
bandwidth, the step's compute time at the chip's bf16 peak (the model's FLOPs plus splash's kernels), and so:

  weak        efficiency compute / (compute + ICI) with collectives not overlapped (a lower bound; XLA overlaps
              the gradient all-reduce with the backward pass in part), at --rows_per_chip
  rows_90     the sequences per chip at which that efficiency is 90%: a slice of n chips trains near-linearly
              when the global batch / n >= rows_90 (the collectives' bytes do not depend on the batch; compute
              does, linearly)
  batch_256   the efficiency at the paper's global batch of 256 on this slice

A mesh that does not fit is listed with the compiler's verdict. The last line is the JSON list of rows.
`--hlo_dir=DIR` (aot_compile.py's flag) keeps each compiled step's HLO text in DIR/CONFIG_TOPOLOGY_MESH/.
"""
from __future__ import annotations

import importlib
import json
import os
import pathlib
import sys

if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")  # compile-only TPU devices; no local TPU runtime

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import aot_compile  # noqa: E402  (tpu/, the folder of this script)
import hlo_costs  # noqa: E402
from jbert.model import BertConfig  # noqa: E402

_CONFIGS = flags.DEFINE_list("configs", ["base", "large"], "configs/NAME.py, each with its `fast` preset.")
_TOPOLOGIES = flags.DEFINE_list("topologies", ["v5e:16x16", "v4:4x4x4"], "Whole slices, GENERATION:SHAPE.")
_MESHES = flags.DEFINE_list("meshes", ["data", "fsdp"], "data: replicated state; fsdp: state sharded over all.")
_ROWS = flags.DEFINE_integer("rows_per_chip", 32, "Sequences per chip of the compiled step.")
_SEQ = flags.DEFINE_integer("seq_len", 128, "Sequence length.")
_GLOBAL = flags.DEFINE_integer("global_batch", 256, "The global batch of the batch_256 column.")


def slice_row(name: str, topology: str, mesh: str, rows_per_chip: int, seq_len: int, global_batch: int,
              log=lambda _: None, hlo_dir: str | None = None) -> dict:
  """Compiles `configs/NAME.py:fast` for `topology` with a `mesh` (data | fsdp) over all its chips; the row.
  `hlo_dir`: where the compiled HLO goes (a folder per row)."""
  config = importlib.import_module(f"configs.{name}").get_config("fast")
  chips = len(aot_compile.topology_devices(topology)[0])
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = (-1, 1, 1) if mesh == "data" else (1, -1, 1)
  config.batch_size, config.data.max_seq_length = rows_per_chip * chips, seq_len
  result = aot_compile.compile_train_step(
      config, topology, log=log, eval_step=False,
      hlo_dir=hlo_dir and os.path.join(hlo_dir, f"{name}_{topology.replace(':', '_')}_{mesh}"))
  row = {"config": name, "topology": topology, "chips": chips, "mesh": mesh, "rows_per_chip": rows_per_chip,
         "seq_len": seq_len, "hbm_gib": result.get("total_gib"), "fits": result["fits"],
         "compile_s": result["compile_s"]}
  if result["fits"] is False:
    return row
  chip = hlo_costs.CHIPS[topology.partition(":")[0]]
  bert = BertConfig.from_preset(name)
  kernel = (hlo_costs.splash_flops(rows_per_chip, seq_len, bert.hidden_size, bert.num_hidden_layers)
            if result["attention"]["train"] == "splash" else 0.0)
  compute_s = (result["model_flops"] / chips + kernel) / chip.peak_flops
  sent = sum(result["collective_bytes_per_device"].values())
  ici_s = sent / chip.ici_bytes_s
  per_row = compute_s / rows_per_chip
  at_global = per_row * global_batch / chips
  row.update(collective_gib=sent / 2**30, collectives={k: v / 2**30 for k, v in
                                                         result["collective_bytes_per_device"].items() if v},
             attention=result["attention"]["train"], compute_ms=compute_s * 1e3, ici_ms=ici_s * 1e3,
             weak=compute_s / (compute_s + ici_s), rows_90=9 * ici_s / per_row,
             batch_256=at_global / (at_global + ici_s) if global_batch >= chips else None)
  return row


def table(rows: list[dict]) -> str:
  head = ("config", "topology", "chips", "mesh", "HBM GiB", "fits", "coll. GiB", "compute ms", "ICI ms", "weak",
          "rows_90", f"batch {_GLOBAL.value}")
  lines = [" | ".join(head), " | ".join("---" for _ in head)]
  for r in rows:
    if r["fits"] is False:
      lines.append(" | ".join([r["config"], r["topology"], str(r["chips"]), r["mesh"], "-", "no"] + ["-"] * 6))
      continue
    b256 = "-" if r["batch_256"] is None else f"{r['batch_256']:.0%}"
    lines.append(" | ".join([r["config"], r["topology"], str(r["chips"]), r["mesh"], f"{r['hbm_gib']:.2f}",
                             "yes" if r["fits"] else "no", f"{r['collective_gib']:.3f}", f"{r['compute_ms']:.1f}",
                             f"{r['ici_ms']:.1f}", f"{r['weak']:.0%}", f"{r['rows_90']:.1f}", b256]))
  return "\n".join(lines)


def main(argv):
  del argv
  rows = []
  for name in _CONFIGS.value:
    for topology in _TOPOLOGIES.value:
      for mesh in _MESHES.value:
        rows.append(slice_row(name, topology, mesh, _ROWS.value, _SEQ.value, _GLOBAL.value, hlo_dir=aot_compile.FLAGS_HLO_DIR.value))
        print(json.dumps(rows[-1]), flush=True)
  print(table(rows))
  print(json.dumps(rows))


if __name__ == "__main__":
  app.run(main)
