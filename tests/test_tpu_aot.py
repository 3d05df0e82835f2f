"""tpu/aot_compile.py on the 8 simulated CPU devices: the real train step compiles, and its report adds up."""
import json
import os

import pytest

from configs import tiny
from jbert.train import architecture
from jbert.runtime import flops
from jbert.model import BertConfig
import script_module

_VOCAB = 1024  # divisible by tensor=2, so every weight shards as the rules say (no replication fallback)

aot = script_module.load("tpu/aot_compile.py")


def _config(data, fsdp, tensor):
  config = tiny.get_config()
  config.mesh.data, config.mesh.fsdp, config.mesh.tensor = data, fsdp, tensor
  return config


@pytest.mark.devices(8)
@pytest.mark.parametrize("mesh,state_shard_factor", [
    ((8, 1, 1), (1.0, 1.0)),    # pure data parallelism: every device holds the whole state
    ((2, 2, 2), (3.5, 4.0)),    # matrices over fsdp x tensor (4); [H] vectors over fsdp only (2)
])
def test_compiles_train_step_and_reports_consistent_memory_and_flops(mesh, state_shard_factor):
  lines = []
  config = _config(*mesh)
  result = aot.compile_train_step(config, "cpu", vocab_size=_VOCAB, config_name="configs/tiny.py",
                                  log=lines.append)
  gib = 1024 ** 3

  # The JSON object is the last line and carries the whole report.
  assert json.loads(lines[-1]) == json.loads(json.dumps(result))
  assert set(result) >= {"config", "topology", "device_kind", "num_devices", "mesh", "state_gib",
                         "state_per_device_gib", "argument_gib", "output_gib", "alias_gib", "temp_gib",
                         "total_gib", "hbm_gib", "fits", "lower_s", "compile_s", "flops_per_device",
                         "model_flops", "flops_ratio"}
  assert result["mesh"] == dict(zip(("data", "fsdp", "tensor"), mesh))
  assert (result["config"], result["topology"], result["num_devices"]) == ("configs/tiny.py", "cpu", 8)
  assert result["hbm_gib"] is None and result["fits"] is None  # no HBM figure for CPU devices

  # The model is the config's: tiny preset with the given vocabulary.
  bert_config = architecture.bert_config(config.model, _VOCAB)
  assert bert_config == BertConfig.from_preset("tiny", vocab_size=_VOCAB, max_position_embeddings=128,
                                               dtype="float32", scan_layers=False)
  h, f, layers = bert_config.hidden_size, bert_config.intermediate_size, bert_config.num_hidden_layers
  params = (_VOCAB + 128 + 2 + 2) * h + layers * (4 * h * h + 4 * h + 2 * h * f + f + h + 4 * h) \
      + (h * h + h) + (h * h + h + 2 * h + _VOCAB) + (2 * h + 2)  # embeddings, layers, pooler, mlm, nsp
  assert result["params"] == params
  # AdamW keeps two moments per parameter (float32), plus step, count and rng scalars.
  assert result["state_gib"] * gib == pytest.approx(3 * 4 * params, abs=64)

  # Arguments are exactly the state's shards plus this device's rows of the batch (packed rows: 5 arrays of 64
  # tokens, 3 of 10 predictions, 3 of 8 slots); the state is donated, so the outputs alias it.
  batch_rows = 32 // (mesh[0] * mesh[1])
  batch_bytes = batch_rows * (5 * 64 + 3 * 10 + 3 * 8) * 4
  assert result["batch_per_device_gib"] * gib == batch_bytes
  assert result["argument_gib"] * gib == pytest.approx(result["state_per_device_gib"] * gib + batch_bytes, abs=64)
  assert result["alias_gib"] == pytest.approx(result["state_per_device_gib"], rel=1e-6)
  low, high = state_shard_factor
  assert low <= result["state_gib"] / result["state_per_device_gib"] <= high
  assert 0 < result["temp_gib"] < 1
  assert result["total_gib"] == pytest.approx(
      result["argument_gib"] + result["output_gib"] - result["alias_gib"] + result["temp_gib"])

  # XLA counts every op of the partitioned step on one device; over 8 devices that is the model's matmul count
  # plus what jbert.runtime.flops leaves out (LayerNorm, softmax, GELU, the AdamW update, the loss): at most +25%.
  model_flops = flops.train_flops_per_step(bert_config, batch_size=32, seq_len=64, num_masked=10, nsp=True)
  assert result["model_flops"] == model_flops
  assert 1.0 <= result["flops_ratio"] <= 1.25
  assert result["flops_per_device"] * 8 == pytest.approx(result["flops_ratio"] * model_flops)
  assert result["compile_s"] > 0 and result["lower_s"] > 0
  assert "buckets" not in result  # pretraining batches have one length

  # On paper: each device sends its float32 gradients through an all-reduce over the data-parallel devices
  # (2 (n-1)/n of their bytes with a ring), plus scalars and the word embeddings' gradient from its lookup, which
  # XLA:CPU reduces before adding the tied decoder's; tiny trains with attention dropout, so with einsum.
  sent = result["collective_bytes_per_device"]
  gradients = 2 * 7 / 8 * 4 * params
  if mesh == (8, 1, 1):
    assert gradients <= sent["all-reduce"] <= gradients + 2 * 7 / 8 * 4 * _VOCAB * h + 1024
    assert sent["all-gather"] == sent["reduce-scatter"] == 0
  else:  # fsdp gathers weights; tensor parallelism all-reduces activations
    assert sent["all-gather"] > 0 and sent["all-reduce"] > 0
  assert result["attention"] == {"train": "einsum", "eval": "xla"} and result["mosaic_kernels"] == 0
  assert result["roofline"] is None  # no chip figures for CPU devices
  assert result["eval"]["attention"] == "xla" and result["eval"]["total_gib"] > 0


def test_bad_topology_is_refused_with_the_accepted_forms():
  with pytest.raises(ValueError, match=r"GENERATION:SHAPE.*v5e:2x2"):
    aot.topology_devices("v5e-4")
  with pytest.raises(ValueError, match=r"GENERATION:SHAPE"):
    aot.topology_devices("v9:2x2")


def test_fine_tuning_configs_compile_too():
  from configs import finetune  # pylint: disable=import-outside-toplevel
  config = finetune.get_config("mnli")
  config.model.preset, config.batch_size = "tiny", 16
  config.data.max_seq_length = 24
  packed = aot.compile_train_step(config, "cpu", vocab_size=_VOCAB, config_name="configs/finetune.py:mnli",
                                  log=lambda _: None, eval_step=False)
  config.data.packing = False
  result = aot.compile_train_step(config, "cpu", vocab_size=_VOCAB, config_name="configs/finetune.py:mnli",
                                  log=lambda _: None, eval_step=False)
  assert result["scan_layers"] is False  # the unset key, resolved for the CPU it compiled for
  config.model.scan_layers = False
  import jax  # pylint: disable=import-outside-toplevel
  from jbert.model import BertForSequenceClassification, init_params  # pylint: disable=import-outside-toplevel
  bert_config = architecture.bert_config(config.model, _VOCAB)
  shapes = jax.eval_shape(lambda: init_params(BertForSequenceClassification(bert_config, num_labels=3),
                                              jax.random.key(0)))
  assert result["params"] == sum(x.size for x in jax.tree.leaves(shapes))  # MNLI: a 3-class classifier
  assert result["batch_size"] == 16 and result["seq_len"] == 24
  assert result["model_flops"] == flops.train_flops_per_step(
      architecture.bert_config(config.model, _VOCAB), batch_size=16, seq_len=24, num_masked=0, nsp=False)
  assert result["compile_s"] > 0
  # Length-bucketed batches (data.bucketing, on by default): the shorter buckets compile too, smaller.
  assert [b["seq_len"] for b in result["buckets"]] == [8, 12, 16]
  totals = [b["total_gib"] for b in result["buckets"]] + [result["total_gib"]]
  assert totals == sorted(totals) and totals[0] < totals[-1]
  assert all(b["compile_s"] > 0 and 0 < b["temp_gib"] <= result["temp_gib"] for b in result["buckets"])
  # Packed batches (data.packing, on by default): no buckets; the step at batch_size rows of 24 tokens, the most a
  # run can take, sized with its slot arrays (3 a row) beside the tokens.
  assert "buckets" not in packed and (packed["batch_size"], packed["seq_len"]) == (16, 24)
  assert packed["params"] == result["params"] and packed["argument_gib"] > result["argument_gib"]


def test_splash_compiles_for_a_tpu_without_reading_a_corpus():
  """The dropout-free recipe on a v5e:2x2 (libtpu compiles for it here): splash attention, BERT's head size 64,
  in shard_map over data=2 x tensor=2, forward, dQ and dK/dV Mosaic kernels per layer; the roofline on paper.
  The config names a corpus that does not exist: AOT needs shapes only."""
  config = tiny.get_config("fast")
  config.mesh.data, config.mesh.tensor = 2, 2
  config.batch_size, config.data.max_seq_length = 8, 128
  config.model.attention_impl, config.model.scan_layers, config.model.dtype = "splash", False, "bfloat16"
  config.data.source, config.data.files = "files", "/nonexistent/corpus/*.txt"
  result = aot.compile_train_step(config, "v5e:2x2", vocab_size=_VOCAB, log=lambda _: None)
  assert result["device_kind"] == "TPU v5 lite" and result["fits"] is True
  # The host description libtpu needed is gone again: the rest of the process is no TPU VM to jbert.distributed.
  assert "TPU_WORKER_HOSTNAMES" not in os.environ and not aot.distributed.on_cloud_tpu_vm()
  assert result["attention"] == {"train": "splash", "eval": "splash"}
  assert result["mosaic_kernels"] == 3 * 2  # forward, dQ, dK/dV in each of the 2 layers
  assert result["eval"]["mosaic_kernels"] == 2 and result["eval"]["attention"] == "splash"
  # Splash's FLOPs, which XLA's cost analysis does not see: 9 matmuls of 2 T^2 (H / tensor) per layer and row.
  assert result["kernel_flops_per_device"] == 9 * 2 * 128 * 128 * (128 // 2) * 2 * (8 // 2)
  roof = result["roofline"]
  assert roof["compute_s"] == pytest.approx((result["flops_per_device"] + result["kernel_flops_per_device"]) / 197e12)
  assert roof["ici_s"] == pytest.approx(sum(result["collective_bytes_per_device"].values()) / 200e9)
  assert 0 < roof["mfu_serial"] <= roof["mfu_overlapped"] <= 1


def test_the_model_is_init_froms_or_the_distillation_students(tmp_path_factory):
  """What the run builds: init_from's architecture (not config.model's preset), a distillation student at its
  teacher's width with `task.student_layers` layers, and config.model's where the checkpoint cannot be read."""
  import trained  # pylint: disable=import-outside-toplevel
  from tasks import finetune_data as fd  # pylint: disable=import-outside-toplevel
  teacher = trained.classifier(tmp_path_factory)  # the shared tiny pair classifier: 2 layers
  export = teacher.workdir / "export"
  stored = BertConfig.from_json_file(export / "config.json")
  files = {k: teacher.overrides[k] for k in ("task.train_file", "task.eval_file", "task.text_a", "task.text_b",
                                             "task.label")}
  lines = []
  config = fd.finetune_config("distill", **{"task.teacher": str(export), "task.student_layers": "1",
                                             "data.max_seq_length": 16, **files})
  student = aot.model_config(config, _VOCAB, lines.append)
  config = fd.finetune_config("local", **{"init_from": str(export), "data.max_seq_length": 16, **files})
  whole = aot.model_config(config, _VOCAB, lines.append)
  assert (student.num_hidden_layers, whole.num_hidden_layers) == (1, 2) and lines == []
  assert student.hidden_size == whole.hidden_size != architecture.bert_config(config.model, _VOCAB).hidden_size
  assert (whole.hidden_size, whole.vocab_size) == (stored.hidden_size, stored.vocab_size)
  config.init_from = str(tmp_path_factory.mktemp("nothing") / "missing")
  assert aot.model_config(config, _VOCAB, lines.append) == architecture.bert_config(config.model, _VOCAB)
  assert len(lines) == 1 and lines[0].startswith(f"the architecture of {config.init_from} cannot be read here (")


def test_electra_sizes_generator_and_discriminator_together_on_a_tpu():
  """configs/electra.py: the state holds both models (the generator without its own embeddings), compiled for a
  v5e:2x2 by libtpu without a corpus."""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  from configs import electra  # pylint: disable=import-outside-toplevel
  from jbert import tasks  # pylint: disable=import-outside-toplevel
  config = electra.get_config("tiny")
  config.mesh.data = 4
  config.batch_size, config.data.max_seq_length = 8, 64
  config.data.source, config.data.files = "files", "/nonexistent/corpus/*.txt"
  result = aot.compile_train_step(config, "v5e:2x2", vocab_size=_VOCAB, config_name="configs/electra.py:tiny",
                                  log=lambda _: None)
  assert result["device_kind"] == "TPU v5 lite" and result["fits"] is True
  bert_config = aot.model_config(config, _VOCAB, lambda _: None)
  shapes = jax.eval_shape(lambda: nn.meta.unbox(tasks.build_task(config).model(bert_config).init(
      jax.random.key(0), jax.numpy.ones((1, 8), jax.numpy.int32))))["params"]
  count = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  h, e, g = 128, 128, 32  # the discriminator's width and embeddings, the generator's width (1/4)
  own = count(shapes["generator"])
  assert own < count(shapes["discriminator"]) and "embeddings" not in shapes["generator"]["bert"]
  assert shapes["generator"]["bert"]["embeddings_project"]["kernel"].shape == (e, g)
  assert result["params"] == count(shapes["discriminator"]) + own
  assert result["flops_per_device"] > 0 and h == bert_config.hidden_size


@pytest.mark.parametrize("size, generator_width", [("base", 256), ("large", 256)])
def test_electra_base_and_large_size_the_papers_two_models(size, generator_width):
  """configs/electra.py:base|large as tpu/aot_compile.py builds them (no corpus, V from --vocab_size): the
  discriminator is transformers' ElectraForPreTraining of the paper's size, the generator its ElectraForMaskedLM
  of a third (base) or a quarter (large) of the width less the embedding tables it shares. (A full compile for
  v5e:2x2 takes minutes: `python tpu/aot_compile.py --config=configs/electra.py:base --topology=v5e:2x2
  --config.batch_size=16 --config.data.source=files --config.data.files=/none` fits, docs/pretraining.md.)"""
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  from configs import electra  # pylint: disable=import-outside-toplevel
  from jbert import tasks  # pylint: disable=import-outside-toplevel
  config = electra.get_config(size)
  config.data.source, config.data.files = "files", "/nonexistent/corpus/*.txt"
  bert_config = aot.model_config(config, 30522, lambda _: None)
  task = tasks.build_task(config)
  shapes = jax.eval_shape(lambda: nn.meta.unbox(task.model(bert_config).init(
      jax.random.key(0), jax.numpy.ones((1, 8), jax.numpy.int32))))["params"]
  count = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
  gen = task.generator(bert_config)
  assert gen.hidden_size == generator_width and gen.num_hidden_layers == bert_config.num_hidden_layers
  hf = dict(vocab_size=30522, embedding_size=bert_config.embedding_width, max_position_embeddings=512)
  with torch.device("meta"):
    disc = transformers.ElectraForPreTraining(transformers.ElectraConfig(
        **hf, hidden_size=bert_config.hidden_size, num_hidden_layers=bert_config.num_hidden_layers,
        num_attention_heads=bert_config.num_attention_heads, intermediate_size=bert_config.intermediate_size))
    generator = transformers.ElectraForMaskedLM(transformers.ElectraConfig(
        **hf, hidden_size=gen.hidden_size, num_hidden_layers=gen.num_hidden_layers,
        num_attention_heads=gen.num_attention_heads, intermediate_size=gen.intermediate_size))
  numel = lambda module: sum(p.numel() for p in module.parameters())
  assert count(shapes["discriminator"]) == numel(disc)
  # The generator's own parameters: all but the embedding tables and their LayerNorm, which are the
  # discriminator's (its decoder is tied to the word table, which torch counts once).
  assert count(shapes["generator"]) == numel(generator) - numel(generator.electra.embeddings)
