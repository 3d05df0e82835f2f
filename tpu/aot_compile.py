r"""Ahead-of-time compile check: jbert's pretraining step, compiled for a TPU slice from any host (no TPU needed).

  python tpu/aot_compile.py --config=configs/base.py --topology=v5e:2x2 [--config.KEY=VALUE ...]

What compiles is what `jbert.train.trainer.train_and_evaluate` runs: `train.build_steps` gives the same model,
optimiser, state and batch shardings and jitted step, here on a mesh (`sharding.make_mesh`, so the same device
order) over the compile-only devices of `jax.experimental.topologies.get_topology_desc`. The step is lowered on
abstract inputs (the config's global batch) and compiled by libtpu (`pip install 'jbert[tpu]'`). Printed: the
state's sharding report, XLA's per-device memory analysis against the chip's HBM, the compiled FLOPs against
`jbert.runtime.flops`' model count, and the compile time; the last line is one JSON object.

A fine-tuning config with length-bucketed batches (`data.bucketing`, `jbert.data.streams`) runs the step at
every bucket length: each is compiled too and reported under `buckets` (memory and compile time per length), so
nothing compiles unexpectedly mid-run; `fits` is then that of the largest. Such a step is two programs, as the
trainer runs it (`train.Steps`): the gradient, compiled per length, then the update, compiled once; memory is
the larger program's, FLOPs the sum. With packed batches (`data.packing`) the step is compiled and sized at
`batch_size` rows of `max_seq_length`, the most rows a run's batch can take (a run picks fewer from its data).

The model is the one the run builds (`jbert.train.plan`): `init_from`'s architecture, or distillation's student
(its teacher with `task.student_layers` layers, `Task.architecture_source`), read from the checkpoint's config when
that checkpoint is readable from this host; otherwise `config.model` (its preset and overrides), said in one line.

`--topology` is GENERATION:SHAPE in chips, as in slice names: v4:2x2x1 (v4-8), v5p:2x2x2 (v5p-16), v5e:2x2
(v5e-4), v5e:4x4 (v5e-16), v6e:2x4 (v6e-8); `cpu` compiles for this host's CPU devices instead. Neither the
tokenizer nor the corpus is read (their files need not exist here): `config.model.vocab_size`, else
`--vocab_size`, sets V.

Attention: the report names the kernel the train step runs (`jbert.model.attention`: splash on TPU by default;
einsum while attention dropout is on, which no fused kernel has: `configs/base.py:fast` trains without it) and the
evaluation step's, which is compiled too (`--eval_step`); `mosaic_kernels` counts the Pallas (Mosaic) kernels in
the compiled train step. On paper (`tpu/hlo_costs.py`): the bytes each chip sends in the step's collectives, from
the compiled HLO, and, for unscanned layers (`--config.model.scan_layers=False`: XLA's cost analysis counts a
scanned layer once), the roofline step time at the chip's peak FLOP/s, HBM and ICI bandwidth and the MFU it
implies, splash's kernel FLOPs added (the cost analysis does not see inside Mosaic kernels).
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import pathlib
import sys
import time
from typing import Any, Callable

if __name__ == "__main__":
  # The TPU is only a compile-only description; without this, jax probes for a local TPU runtime and warns.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import flax.linen as nn  # noqa: E402
import jax  # noqa: E402
import ml_collections  # noqa: E402
from ml_collections import config_flags  # noqa: E402

# `python tpu/aot_compile.py` from a checkout, without installing jbert.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import hlo_costs  # noqa: E402  (tpu/, the folder of this script)
from jbert.train import architecture  # noqa: E402
from jbert.runtime import console  # noqa: E402
from jbert import distributed  # noqa: E402
from jbert.model import attention  # noqa: E402
from jbert.train import optim  # noqa: E402
from jbert.runtime import sharding  # noqa: E402
from jbert import tasks as tasks_lib  # noqa: E402
from jbert.train import trainer as train  # noqa: E402

GIB = 1024 ** 3
CHIPS = hlo_costs.CHIPS
_CHIPS_PER_HOST = (2, 2, 1)  # a 4-chip host; only the process layout depends on it, not the compiled program


def topology_devices(topology: str, num_slices: int = 1) -> tuple[list[Any], float | None]:
  """(devices, HBM GiB per device) of `topology`: compile-only TPU devices, or this host's CPUs for `cpu`."""
  if topology == "cpu":
    return jax.devices("cpu"), None
  chip, _, shape = topology.partition(":")
  dims = tuple(int(d) for d in shape.split("x") if d.isdigit()) if shape else ()
  if chip not in CHIPS or not dims or len(dims) != len(shape.split("x")) or len(dims) not in (2, 3):
    raise ValueError(f"--topology={topology!r} is not GENERATION:SHAPE with GENERATION in {sorted(CHIPS)} and a "
                     "2-D (v5e, v6e) or 3-D (v4, v5p) shape in chips, e.g. v5e:2x2, v4:2x2x1; or `cpu`.")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  hbm_gib, chip_config = CHIPS[chip].hbm_gib, CHIPS[chip].chip_config
  dims3 = dims + (1,) * (3 - len(dims))
  # Torus links close in a dimension only on full-size slices (4+ chips per side on v4/v5p, 16 on v5e/v6e).
  wrap = tuple(d >= 4 and min(dims3) >= 4 if len(dims) == 3 else d == 16 for d in dims3)
  compile_only = not distributed.on_cloud_tpu_vm()
  if compile_only:
    # No TPU to guard here: another process that loaded libtpu (any jax program on this host) holds its lockfile.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  try:
    # Without a TPU VM's own values libtpu fills the console with E0000 complaints about its metadata.
    with console.compile_only_host(chip, math.prod(dims)) if compile_only else contextlib.nullcontext():
      desc = topologies.get_topology_desc(
          platform="tpu", topology_name=topology, chip_config_name=chip_config, num_slices=num_slices,
          chips_per_host_bounds=tuple(min(d, b) for d, b in zip(dims3, _CHIPS_PER_HOST)), wrap=wrap)
  except RuntimeError as e:  # jaxlib's JaxRuntimeError, also when libtpu is missing
    raise RuntimeError(f"cannot describe TPU topology {topology!r} ({e}); AOT compilation for TPU needs libtpu: "
                       "pip install 'jbert[tpu]'.") from e
  return list(desc.devices), float(hbm_gib)


def abstract_batch(task, config: ml_collections.ConfigDict, data_sharding,
                   length: int | None = None) -> dict[str, jax.ShapeDtypeStruct]:
  """The global batch the loop feeds the step (the task's `train_spec`, `length` tokens: default
  max_seq_length), rows over data×fsdp. Packed fine-tuning batches (`data.packing`) take `batch_size` rows of
  max_seq_length: the most a batch can need (one example a row), so what fits here fits every step of a run,
  whose row counts come from its data."""
  spec = task.train_spec(config.batch_size, length or config.data.max_seq_length)
  return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=data_sharding) for k, v in spec.items()}


def resolved(config: ml_collections.ConfigDict, platform: str = "tpu") -> ml_collections.ConfigDict:
  """Fine-tuning configs take their length from the data; what compiles does not depend on it. Their unset
  `model.scan_layers` is what a run on `platform` takes (`jbert.train.plan.resolve_scan_layers`)."""
  config = copy.deepcopy(train.resolve_scan_layers(config, platform=platform))
  with config.unlocked():
    config.total_steps = config.total_steps or 10_000
    config.optim.warmup_steps = optim.warmup_steps(config.optim, config.total_steps)
  return config


def _cost(compiled, key: str = "flops") -> float:
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # a list of one dict in older jax
  return float(cost.get(key, 0.0)) if cost else 0.0


def model_config(config: ml_collections.ConfigDict, vocab_size: int, log: Callable[[str], None] = print):
  """The BertConfig the run trains: its architecture source's (init_from, a distillation teacher's student) where
  that checkpoint can be read here, with its own vocabulary; else `config.model`'s with `vocab_size`."""
  from jbert import weights  # pylint: disable=g-import-not-at-top  (TF/torch readers only when needed)
  try:
    source, shape = tasks_lib.architecture_source(config)
    stored = weights.describe(source).config if source else None
  except (OSError, ValueError) as e:
    source, stored = config.get("init_from") or config.task.get("teacher"), None
    log(f"the architecture of {source} cannot be read here ({' '.join(str(e).split())[:200]}); compiling "
        "config.model's instead")
  if stored is None:
    return architecture.bert_config(config.model, vocab_size)
  return architecture.checkpoint_bert_config(config.model, stored.vocab_size, source, stored, shape)  # read once


def compile_train_step(config: ml_collections.ConfigDict, topology: str, vocab_size: int = 30522,
                       hbm_gib: float | None = None, config_name: str | None = None,
                       log: Callable[[str], None] = print, eval_step: bool = True,
                       hlo_dir: str | None = None) -> dict[str, Any]:
  """Lowers and compiles the train step of `config` for `topology`; returns the report, also logged with the
  JSON object last.

  `fits` compares XLA's peak per-device estimate (arguments + outputs - donated aliases + temporaries) with the
  chip's HBM; a step the TPU compiler itself finds too large comes back with `fits: False` and its message.
  Memory numbers are per device; `flops_ratio` = compiled FLOPs over all devices / `jbert.runtime.flops` model FLOPs.
  `eval_step` also compiles the evaluation (predict) step on the same batch shape; `hlo_dir` receives the
  compiled train step's HLO text (`train_step_<i>.hlo.txt`, one per program), for `tpu/hlo_costs.py` to read again.
  """
  devices, known_hbm = topology_devices(topology, config.mesh.dcn_data)
  hbm_gib = hbm_gib or known_hbm
  config = resolved(config, devices[0].platform)
  task = tasks_lib.build_task(config)
  bert_config = model_config(config, config.model.vocab_size or vocab_size, log)
  mesh = sharding.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tensor, config.mesh.dcn_data,
                            devices=devices)
  train.check_model(config, bert_config, mesh)
  train.data_shards(config, mesh)
  rules = sharding.rules_from_config(config.logical_axis_rules)
  setup = train.build_steps(config, task, bert_config, mesh, rules)
  state = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                       setup.abstract, setup.shardings)
  batch = abstract_batch(task, config, setup.data_sharding)
  report = sharding.sharding_report(setup.abstract, setup.shardings)
  model_flops = task.step_flops(bert_config, config.batch_size, config.data.max_seq_length)
  result: dict[str, Any] = {
      "config": config_name, "topology": topology, "device_kind": devices[0].device_kind, "num_devices": len(devices),
      "mesh": {k: int(v) for k, v in mesh.shape.items()}, "batch_size": config.batch_size,
      "seq_len": config.data.max_seq_length, "params": sum(math.prod(x.shape) for x in
                                                           jax.tree.leaves(setup.abstract.params)),
      "state_gib": report.total_bytes / GIB, "state_per_device_gib": report.per_device_bytes / GIB,
      "batch_per_device_gib": sharding.sharding_report(
          batch, jax.tree.map(lambda x: x.sharding, batch)).per_device_bytes / GIB, "hbm_gib": hbm_gib,
      "model_flops": model_flops,
      "scan_layers": bert_config.scan_layers, "remat_policy": bert_config.remat_policy}
  log(f"{topology}: {len(devices)} x {devices[0].device_kind}; mesh {result['mesh']}; "
      f"{result['params'] / 1e6:.1f}M parameters; batch {config.batch_size} x {config.data.max_seq_length}")
  log(f"state: {report}")

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    start = time.perf_counter()
    lowered = _lower_step(setup, state, batch)
    result["lower_s"] = time.perf_counter() - start
    start = time.perf_counter()
    try:
      compiled = [program.compile() for program in lowered]
    except Exception as e:  # pylint: disable=broad-except  (jaxlib's error types move between releases)
      message = str(e)
      if "RESOURCE_EXHAUSTED" not in message and "out of memory" not in message.lower():
        raise
      result.update(compile_s=time.perf_counter() - start, fits=False, error=message[:2000])
      log(f"does NOT fit: the compiler ran out of memory:\n{message[:2000]}")
      log(json.dumps(result))
      return result
  result["compile_s"] = time.perf_counter() - start

  peak = max(compiled, key=_total_bytes)  # the programs run one after another
  total, mem = _total_bytes(peak), peak.memory_analysis()
  flops = sum(_cost(program) for program in compiled)
  result.update(
      argument_gib=mem.argument_size_in_bytes / GIB, output_gib=mem.output_size_in_bytes / GIB,
      alias_gib=mem.alias_size_in_bytes / GIB, temp_gib=mem.temp_size_in_bytes / GIB, total_gib=total / GIB,
      fits=None if hbm_gib is None else total <= hbm_gib * GIB, flops_per_device=flops,
      flops_ratio=flops * len(devices) / model_flops)
  hbm = "no HBM figure for this device" if hbm_gib is None else (
      f"{'fits' if result['fits'] else 'does NOT fit'} in {hbm_gib:g} GiB HBM ({total / (hbm_gib * GIB):.0%})")
  log(f"memory per device: arguments {result['argument_gib']:.3f} GiB, outputs {result['output_gib']:.3f} GiB "
      f"(donated {result['alias_gib']:.3f}), temporaries {result['temp_gib']:.3f} GiB, total "
      f"{result['total_gib']:.3f} GiB: {hbm}")
  log(f"FLOPs: {flops:.4g} per device, {flops * len(devices):.4g} in all = {result['flops_ratio']:.3f} x the "
      f"model count {model_flops:.4g}; lowering {result['lower_s']:.1f} s, compilation {result['compile_s']:.1f} s")
  if bert_config.scan_layers:
    log(f"  (scan_layers=True: XLA's cost analysis counts the scanned layer once, not {bert_config.num_hidden_layers}"
        " times; --config.model.scan_layers=False gives the whole count)")
  if hlo_dir:
    os.makedirs(hlo_dir, exist_ok=True)
    for i, program in enumerate(compiled):
      with open(os.path.join(hlo_dir, f"train_step_{i}.hlo.txt"), "w", encoding="utf-8") as f:
        f.write(program.as_text())
  _on_paper(result, compiled, bert_config, config, mesh, topology, flops, model_flops, log)
  lengths = [n for n in task.buckets() or () if n != config.data.max_seq_length]
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    if lengths:
      result["buckets"] = [_compile_bucket(setup, state, task, config, n, log) for n in lengths]
    if eval_step:
      result["eval"] = _compile_eval(setup, state, batch, result["attention"]["eval"], log)
  log(json.dumps(result))
  return result


def _on_paper(result, compiled, bert_config, config, mesh, topology, flops, model_flops, log) -> None:
  """The attention kernels, the Mosaic kernels and collective bytes of the compiled step and, for unscanned
  layers on a known chip, its roofline (`tpu/hlo_costs.py`), into `result`."""
  platform, length, n = next(iter(mesh.devices.flat)).platform, config.data.max_seq_length, mesh.size
  kernels = {"train": attention.kernel(bert_config, platform, length, training=True),
             "eval": attention.kernel(bert_config, platform, length, training=False)}
  texts = [program.as_text() for program in compiled]
  sent = {}
  for text in texts:
    for kind, count in hlo_costs.collective_bytes(text, n).items():
      sent[kind] = sent.get(kind, 0.0) + count
  result.update(attention=kernels, mosaic_kernels=sum(t.count('custom_call_target="tpu_custom_call"') for t in texts),
                collective_bytes_per_device=sent)
  log(f"attention: {kernels['train']} in training, {kernels['eval']} in evaluation "
      f"(attention_impl={bert_config.attention_impl}); {result['mosaic_kernels']} Mosaic kernels in the train step")
  if kernels["train"] == "einsum" and kernels["eval"] != "einsum":
    log(f"  (training takes einsum: attention dropout {bert_config.attention_probs_dropout_prob} is on and no fused "
        "kernel has it; configs/base.py:fast or --config.model.attention_probs_dropout_prob=0 trains with "
        f"{kernels['eval']})")
  log("collectives per device per step: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sent.items() if v))
  chip = CHIPS.get(topology.partition(":")[0])
  if chip is None or bert_config.scan_layers:
    result["roofline"] = None
    return
  rows = config.batch_size // (mesh.shape["data"] * mesh.shape["fsdp"])
  windows = [bert_config.layer_window(i) for i in range(bert_config.num_hidden_layers)]
  block = attention.splash_block_sizes(-(-length // 128) * 128).block_q
  kernel_flops = hlo_costs.splash_flops(rows, length, bert_config.hidden_size // mesh.shape["tensor"],
                                        bert_config.num_hidden_layers, windows, block
                                        ) if kernels["train"] == "splash" else 0.0
  accessed = sum(_cost(program, "bytes accessed") for program in compiled)
  roof = hlo_costs.roofline(chip, flops + kernel_flops, accessed, sum(sent.values()), model_flops / n)
  result.update(kernel_flops_per_device=kernel_flops, bytes_accessed_per_device=accessed, roofline=roof)
  log(f"roofline per step: compute {roof['compute_s'] * 1e3:.1f} ms (with {kernel_flops:.3g} FLOPs of splash "
      f"kernels), HBM {roof['memory_s'] * 1e3:.1f} ms, ICI {roof['ici_s'] * 1e3:.1f} ms; expected MFU at most "
      f"{roof['mfu_overlapped']:.0%} (collectives overlapped) / {roof['mfu_serial']:.0%} (not)")


def _compile_eval(setup, state, batch, kernel: str, log) -> dict[str, Any]:
  """The evaluation (predict) program on the training batch's shape: what runs it, its memory, compile time."""
  start = time.perf_counter()
  program = setup.predict.lower(state.params, batch).compile()
  text = program.as_text()
  evaluation = {"attention": kernel, "mosaic_kernels": text.count('custom_call_target="tpu_custom_call"'),
                "total_gib": _total_bytes(program) / GIB, "compile_s": time.perf_counter() - start}
  log(f"evaluation step: {kernel} attention ({evaluation['mosaic_kernels']} Mosaic kernels), total "
      f"{evaluation['total_gib']:.3f} GiB per device, compiled in {evaluation['compile_s']:.1f} s")
  return evaluation


def _lower_step(setup, state, batch) -> list[Any]:
  """The programs the trainer runs for one step (`train.Steps`): the fused step, or the gradient then the
  update (bucketed batches, whose update program does not depend on the length)."""
  if not setup.split:
    return [setup.fused.lower(state, batch)]
  grads, metrics = jax.eval_shape(setup.grad, state, batch)
  return [setup.grad.lower(state, batch), setup.update.lower(state, grads, metrics)]


def _total_bytes(compiled) -> int:
  """XLA's peak per-device estimate of one program: arguments + outputs - donated aliases + temporaries."""
  mem = compiled.memory_analysis()
  return mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes


def _compile_bucket(setup, state, task, config, length: int, log) -> dict[str, Any]:
  """Compiles the step at one shorter bucket length (its gradient program: the update is the full length's);
  its memory per device and compile time."""
  batch = abstract_batch(task, config, setup.data_sharding, length)
  start = time.perf_counter()
  program = (setup.grad if setup.split else setup.fused).lower(state, batch).compile()
  total, mem = _total_bytes(program), program.memory_analysis()
  bucket = {"seq_len": length, "temp_gib": mem.temp_size_in_bytes / GIB, "total_gib": total / GIB,
            "compile_s": time.perf_counter() - start}
  log(f"bucket {length}: total {bucket['total_gib']:.3f} GiB per device (temporaries {bucket['temp_gib']:.3f}), "
      f"compiled in {bucket['compile_s']:.1f} s")
  return bucket


# ----------------------------------------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------------------------------------

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.", lock_config=True)
_TOPOLOGY = flags.DEFINE_string("topology", None, "GENERATION:SHAPE (v5e:2x2, v4:2x2x1, v5p:2x2x2) or cpu.")
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", 30522, "Vocabulary size when config.model.vocab_size is None.")
_HBM_GIB = flags.DEFINE_float("hbm_gib", None, "HBM per device in GiB; default: the chip's.")
_EVAL_STEP = flags.DEFINE_bool("eval_step", True, "Also compile the evaluation (predict) step.")
_HLO_DIR = FLAGS_HLO_DIR = flags.DEFINE_string("hlo_dir", None,
                                               "Write the compiled train step's HLO text into this folder.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  result = compile_train_step(_CONFIG.value, _TOPOLOGY.value, _VOCAB_SIZE.value, _HBM_GIB.value,
                              config_name=config_flags.get_config_filename(flags.FLAGS["config"]),
                              log=lambda line: print(line, flush=True), eval_step=_EVAL_STEP.value,
                              hlo_dir=_HLO_DIR.value)
  if result["fits"] is False:
    sys.exit(1)


if __name__ == "__main__":
  # Here, not at import: tests import this module beside other CLIs that share absl's global flags.
  flags.mark_flags_as_required(["config", "topology"])
  app.run(main)
