"""FLOP counts against the matmuls of the real model's jaxpr and every task's step against XLA's cost analysis,
BERT-base ballpark, device peaks (a CPU's measured again as a run goes) and MFU."""
import math
import os
import pathlib
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.extend import core as jax_core

from jbert import distributed
from jbert.runtime import flops
from jbert.model import BertConfig, BertForMaskedLM, BertForPreTraining, init_params


def _dot_flops(jaxpr) -> int:
  """Sum of 2 * (output size) * (contracted size) over every dot_general; scan bodies times their length."""
  total = 0
  for eqn in jaxpr.eqns:
    if eqn.primitive.name == "dot_general":
      (lhs_contract, _), _ = eqn.params["dimension_numbers"]
      lhs = eqn.invars[0].aval.shape
      total += 2 * math.prod(eqn.outvars[0].aval.shape) * math.prod(lhs[d] for d in lhs_contract)
    repeat = eqn.params["length"] if eqn.primitive.name == "scan" else 1
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else [param]:
        if isinstance(sub, jax_core.ClosedJaxpr):
          total += repeat * _dot_flops(sub.jaxpr)
        elif isinstance(sub, jax_core.Jaxpr):
          total += repeat * _dot_flops(sub)
  return total


TINY = dict(vocab_size=50, hidden_size=8, num_attention_heads=2, intermediate_size=12,
            max_position_embeddings=16, attention_impl="einsum")


def test_hand_computed_tiny_config():
  config = types.SimpleNamespace(vocab_size=10, hidden_size=4, intermediate_size=8, num_hidden_layers=2)
  parts = flops.forward_flops_by_part(config, batch_size=2, seq_len=3, num_masked=1)
  assert parts == {
      "encoder_dense": 2 * 2 * 6 * (4 * 16 + 2 * 4 * 8),  # 3072
      "attention": 2 * 2 * 2 * 2 * 9 * 4,                # 576
      "mlm": 2 * 2 * (16 + 4 * 10),                      # 224: 2 masked positions
      "pooler": 2 * 2 * 16,
      "nsp": 2 * 2 * 4 * 2,
  }
  assert flops.forward_flops(config, batch_size=2, seq_len=3, num_masked=1) == 3968
  assert flops.train_flops_per_step(config, batch_size=2, seq_len=3, num_masked=1) == 3 * 3968
  no_nsp = flops.forward_flops_by_part(config, batch_size=2, seq_len=3, num_masked=None, nsp=False)
  assert (no_nsp["pooler"], no_nsp["nsp"], no_nsp["mlm"]) == (0, 0, 2 * 6 * (16 + 40))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_counts_equal_the_matmuls_of_the_model(scan_layers):
  config = BertConfig.from_preset("tiny", scan_layers=scan_layers, **TINY)
  model = BertForPreTraining(config)
  params = nn.meta.unbox(jax.eval_shape(lambda: init_params(model, jax.random.key(0))))
  ids, positions = jnp.ones((2, 6), jnp.int32), jnp.zeros((2, 3), jnp.int32)

  def loss(params):
    out = model.apply({"params": params}, ids, masked_lm_positions=positions)
    return jnp.sum(out.mlm_logits) + jnp.sum(out.nsp_logits)

  forward = _dot_flops(jax.make_jaxpr(loss)(params).jaxpr)
  train = _dot_flops(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
  assert forward == flops.forward_flops(config, batch_size=2, seq_len=6, num_masked=3) == 32_000
  assert train == flops.train_flops_per_step(config, batch_size=2, seq_len=6, num_masked=3) == 96_000


def _modernbert(global_every, **extra):
  return BertConfig.from_dict({
      "model_type": "modernbert", "vocab_size": 99, "hidden_size": 128, "num_hidden_layers": 3,
      "num_attention_heads": 2, "intermediate_size": 96, "local_attention": 16,
      "global_attn_every_n_layers": global_every, "pad_token_id": 0, "attention_impl": "einsum", **extra})


def test_a_gated_mlp_counts_its_gate_as_the_model_computes_it():
  config = _modernbert(global_every=1)  # every layer global: the einsum kernel computes exactly what is counted
  model = BertForMaskedLM(config)
  params = nn.meta.unbox(jax.eval_shape(lambda: init_params(model, jax.random.key(0))))
  ids = jnp.ones((2, 40), jnp.int32)
  computed = _dot_flops(jax.make_jaxpr(lambda p: jnp.sum(model.apply({"params": p}, ids).mlm_logits))(params).jaxpr)
  parts = flops.forward_flops_by_part(config, batch_size=2, seq_len=40, nsp=False)
  assert parts["encoder_dense"] == 3 * 2 * 2 * 40 * (4 * 128 * 128 + 3 * 128 * 96)
  assert computed == flops.forward_flops(config, batch_size=2, seq_len=40, nsp=False) == 58_716_160


def test_a_sliding_window_layer_counts_the_keys_of_its_window():
  config = _modernbert(global_every=3)  # layer 0 global, 1 and 2 local: 16 // 2 = 8 tokens each side, 17 keys
  h = 128
  assert flops.forward_flops_by_part(config, batch_size=2, seq_len=40, nsp=False)["attention"] == (
      2 * 2 * 2 * 40 * (40 + 17 + 17) * h)
  # A sequence shorter than the window: every layer sees all of it.
  assert flops.forward_flops_by_part(config, batch_size=2, seq_len=10, nsp=False)["attention"] == (
      2 * 2 * 2 * 10 * (3 * 10) * h)


def test_bert_base_encoder_ballpark():
  parts = flops.forward_flops_by_part(BertConfig.from_preset("base"), batch_size=1, seq_len=128)
  encoder_params = 12 * (4 * 768 * 768 + 2 * 768 * 3072)  # weight matrices of the 12 layers, 85M
  assert parts["encoder_dense"] == 2 * encoder_params * 128
  assert parts["attention"] == 12 * 4 * 128 * 128 * 768
  assert parts["encoder_dense"] + parts["attention"] == 22_347_251_712  # ~22.3 GFLOP


@pytest.mark.parametrize("kind, platform, peak, label", [
    ("TPU v2", "tpu", 22.5e12, "TPU v2 bf16 peak"),
    ("TPU v3", "tpu", 61.5e12, "TPU v3 bf16 peak"),
    ("TPU v4", "tpu", 275e12, "TPU v4 bf16 peak"),
    ("TPU v5 lite", "tpu", 197e12, "TPU v5 lite bf16 peak"),
    ("TPU v5", "tpu", 459e12, "TPU v5 bf16 peak"),
    ("TPU v6 lite", "tpu", 918e12, "TPU v6 lite bf16 peak"),
    ("NVIDIA A100-SXM4-80GB", "gpu", 312e12, "A100 bf16 peak"),
    ("NVIDIA H100 80GB HBM3", "gpu", 989e12, "H100 bf16 peak"),
    ("NVIDIA H100 PCIe", "gpu", 756e12, "H100 PCIe bf16 peak"),
    ("NVIDIA H200", "gpu", 989e12, "H200 bf16 peak"),
])
def test_peak_table(kind, platform, peak, label):
  device = types.SimpleNamespace(device_kind=kind, platform=platform)
  assert flops.peak_flops_per_device(device) == (peak, label)


def test_unknown_accelerator_falls_back_to_a_measured_bf16_peak(monkeypatch):
  calls = []
  monkeypatch.setattr(flops, "measure_matmul_peak", lambda dtype, n, device: calls.append((dtype, n)) or 5e13)
  device = types.SimpleNamespace(device_kind="TPU v99", platform="tpu")
  assert flops.peak_flops_per_device(device) == (5e13, "measured TPU v99 bf16 matmul peak")
  assert calls == [(jnp.bfloat16, 8192)]


@pytest.mark.devices(8)
def test_cpu_peak_is_measured_cached_and_shared_by_the_cpu_devices():
  small = flops.measure_matmul_peak(jnp.float32, n=128, repeats=2)
  assert 1e7 < small < 1e14
  assert flops.measure_matmul_peak(jnp.float32, n=128, repeats=2) == small  # cached, not re-measured
  peak, label = flops.peak_flops_per_device(jax.devices("cpu")[0])
  assert label == flops.CPU_LABEL == "measured CPU matmul peak"
  assert peak == flops.measure_matmul_peak(jnp.float32) / len(jax.devices("cpu"))  # conftest: 8 devices


def test_a_measured_peak_is_measured_again_at_most_every_minute_and_the_highest_kept():
  """A CPU peak measured while other processes ran is low; a later, quieter measurement raises it, a busier one
  does not lower it, and a datasheet peak is never measured again."""
  now = [0.0]
  measured = iter([3e10, 2e10, 4e10])
  peak = flops.Peak(jax.devices("cpu")[0], every_s=60.0, clock=lambda: now[0], measure=lambda: next(measured))
  assert peak.measured and peak.label == flops.CPU_LABEL
  start = peak.value
  assert peak.refresh() == (start, 0.0)  # within the minute: not measured
  values = []
  for t in (61.0, 122.0, 130.0, 183.0):
    now[0] = t
    value, spent = peak.refresh()
    values.append(value)
    assert spent >= 0.0
  assert values == [max(start, 3e10), max(start, 3e10), max(start, 3e10), max(start, 4e10)]
  with pytest.raises(StopIteration):  # the three measurements, at 61, 122 and 183 s, and no other
    next(measured)
  tpu = flops.Peak(types.SimpleNamespace(device_kind="TPU v4", platform="tpu"), clock=lambda: 1e9,
                   measure=lambda: pytest.fail("measured"))
  assert tpu.refresh() == (275e12, 0.0) and not tpu.measured


def test_mfu():
  assert flops.mfu(2e12, 0.5, 8e12) == 0.5
  with pytest.raises(ValueError, match="step_time_s=0"):
    flops.mfu(1.0, 0, 1.0)


def test_real_tokens_window_counts_attended_tokens_and_scales_flops_per_bucket():
  calls = []
  tokens = flops.RealTokens(lambda length: calls.append(length) or 1000.0 * length)
  assert tokens.window() == (0.0, 0.0, 0.0)
  tokens.add(jnp.asarray(100, jnp.int32), 160, 16)  # a batch of 10 x 16, 100 tokens attended
  tokens.reset()  # the compile step is left out
  tokens.add(jnp.asarray(120, jnp.int32), 160, 16)
  tokens.add(jnp.asarray(200, jnp.int32), 240, 24)
  tokens.add(jnp.asarray(80, jnp.int32), 160, 16)
  per_step, padding, step_flops = tokens.window()
  assert per_step == pytest.approx(400 / 3) and padding == pytest.approx(1 - 400 / 560)
  assert step_flops == pytest.approx((16000 * 120 / 160 + 24000 * 200 / 240 + 16000 * 80 / 160) / 3)
  assert sorted(calls) == [16, 24] and tokens.window() == (0.0, 0.0, 0.0)  # each length's FLOPs once


# Every task's training step, with the model the run trains (`Task.step_flops` of its BertConfig) on a batch of
# B rows of T tokens: (configs/finetune.py task, config keys, T). Local-file tasks read only their files' header
# without a tokenizer; the distillation student is its teacher's layer 0.
_TASK_STEPS = [
    ("sst2", {}, 32),                                    # classification, packed rows
    ("sst2", {"data.packing": False}, 32),               # classification, one sequence a row (length buckets)
    ("conll2003", {}, 32),                               # NER
    ("conll2003", {"task.crf": True}, 32),               # NER with a CRF
    ("squad", {"task.max_query_length": 8}, 32),         # question answering
    ("swag", {"task.train_file": "FILE"}, 32),           # multiple choice, packed
    ("swag", {"task.train_file": "FILE", "data.packing": False}, 32),  # multiple choice, [B, 4, T]
    ("cross_encoder", {"task.train_file": "FILE", "task.text_a": "a", "task.text_b": "b", "task.label": "label"}, 32),
    ("mnrl", {}, 32),                                    # bi-encoders: pairs, triplets, NLI's softmax classifier
    ("triplet", {}, 32),
    ("nli_softmax", {}, 32),
    ("distill", {"task.train_file": "FILE", "task.text_a": "a", "task.label": "label", "task.student_layers": "0",
                 "task.hidden_weight": 1.0}, 32),
    ("pretraining", {}, 32),
]
_B = 8
_WIDE = dict(vocab_size=128, hidden_size=128, num_hidden_layers=1, num_attention_heads=2, intermediate_size=512,
             max_position_embeddings=64, scan_layers=False)


@pytest.fixture(scope="module")
def teacher_and_file(tmp_path_factory):
  """A randomly initialised 2-layer classifier (the distillation teacher) and a header-and-one-row CSV."""
  import jbert  # pylint: disable=import-outside-toplevel
  from jbert.model import BertForSequenceClassification, init_params  # pylint: disable=import-outside-toplevel
  root = tmp_path_factory.mktemp("flops")
  config = BertConfig(**{**_WIDE, "num_hidden_layers": 2})
  params = nn.meta.unbox(init_params(BertForSequenceClassification(config, num_labels=2), jax.random.key(0)))
  jbert.save_pretrained(config, params, root / "teacher", BertForSequenceClassification, label_names=["no", "yes"])
  (root / "rows.csv").write_text("a,b,label\nw0 w1,w2,0\n", encoding="utf-8")
  return str(root / "teacher"), str(root / "rows.csv")


@pytest.mark.parametrize("name, keys, length", _TASK_STEPS, ids=lambda v: v if isinstance(v, str) else None)
def test_every_tasks_counted_flops_are_at_most_those_of_its_compiled_step(name, keys, length, teacher_and_file):
  """MFU = counted FLOPs / time / peak stays at or below 100% only if the count is at most what the step runs:
  XLA's cost analysis of the compiled training step (gradient and update, as one program), which also counts
  LayerNorm, softmax, GELU, the loss and AdamW. The count leaves out only those and the heads' small matmuls,
  so it is within 20% below: the model that actually runs (a distillation student, not its cached teacher)."""
  from configs import finetune, tiny  # pylint: disable=import-outside-toplevel
  from jbert import tasks  # pylint: disable=import-outside-toplevel
  from jbert.runtime import sharding  # pylint: disable=import-outside-toplevel
  from jbert.train import trainer  # pylint: disable=import-outside-toplevel
  teacher, rows = teacher_and_file
  config = tiny.get_config() if name == "pretraining" else finetune.get_config(name)
  with config.unlocked():
    config.batch_size, config.data.max_seq_length, config.total_steps = _B, length, 10
    config.optim.warmup_steps, config.model.scan_layers = 1, False
    config.update_from_flattened_dict({k: rows if v == "FILE" else v for k, v in keys.items()})
    if name == "distill":
      config.task.teacher = teacher
  task = tasks.build_task(config)  # no tokenizer: shapes and losses only
  bert_config = BertConfig(**_WIDE)
  mesh = sharding.make_mesh(devices=jax.devices()[:1])
  rules = sharding.rules_from_config(config.logical_axis_rules)
  steps = trainer.build_steps(config, task, bert_config, mesh, rules)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=steps.data_sharding)
             for k, v in task.train_spec(_B, length).items()}
    lowered = steps.fused.lower(steps.abstract_state(), batch)
    # XLA's optimisations add no matmul (no remat here), so the program as lowered counts what runs; compiling
    # all 13 costs a minute of CPU, so the distillation step of the issue (and pretraining's) compiles to show it.
    cost = lowered.compile().cost_analysis() if name in ("distill", "pretraining") else lowered.cost_analysis()
  ran = float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])
  counted = task.step_flops(bert_config, _B, length)
  assert 0.8 * ran <= counted <= ran, (counted, ran, counted / ran)


REPO = pathlib.Path(__file__).resolve().parents[1]
PEAK_IN_A_MESH = '''
import sys
import jax
from jbert import distributed
from jbert.runtime import flops, sharding
args = dict(a[2:].split("=", 1) for a in sys.argv[1:])
distributed.initialize(args["coordinator_address"], int(args["num_processes"]), int(args["process_id"]))
peak = flops.Peak(every_s=0.0)
with jax.set_mesh(sharding.make_mesh()):  # the trainer's: both processes' devices
  if jax.process_index() == 0:  # each process measures by its own clock: here process 0 alone
    value, spent = peak.refresh()
    print(f"measured {value} {spent}")
'''


def test_a_peak_is_measured_again_inside_a_mesh_over_two_processes(tmp_path):
  """The trainer refreshes the peak inside its mesh; over several processes the measurement stays on this
  process's device (it used to build its input as a global array and fail with device_put's ValueError)."""
  script = tmp_path / "peak.py"
  script.write_text(PEAK_IN_A_MESH)
  procs = distributed.launch_local([str(script)], num_processes=2, devices_per_process=2, log_dir=str(tmp_path),
                                   env=dict(os.environ, PYTHONPATH=str(REPO)))
  codes = [p.wait(timeout=300) for p in procs]
  logs = [(tmp_path / f"process_{i}.log").read_text() for i in range(2)]
  assert codes == [0, 0], logs
  value, spent = map(float, logs[0].split("measured ")[1].split()[:2])
  assert 1e7 < value < 1e14 and spent > 0
  assert "measured" not in logs[1]
