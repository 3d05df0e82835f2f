"""The batch runner: planning, bucketing, input order, data parallelism, the executable cache, validation."""
import io

import flax.linen as nn
import jax
import numpy as np
import pytest

import jbert.model as jm
from jbert.runtime import sharding
from jbert.inference import runner as runner_lib
from jbert.inference.progress import ProgressLine

CONFIG = jm.BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=40)
MODEL = jm.BertModel(CONFIG)


def _params():
  return nn.meta.unbox(jm.init_params(MODEL, jax.random.key(0)))


def _features(n, seed=0, max_len=40):
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(n):
    length = int(rng.integers(2, max_len + 1))
    ids = rng.integers(5, CONFIG.vocab_size, length)
    types = (np.arange(length) >= length // 2).astype(int)
    out.append({"input_ids": ids.tolist(), "token_type_ids": types.tolist()})
  return out


def hidden_fn(params, batch):
  out = MODEL.apply({"params": params}, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"])
  return {"hidden": out.last_hidden_state, "pooled": out.pooled_output}


def _reference(params, features):
  """Unbucketed and unsorted: every row in one batch, in input order, padded to the maximum length."""
  ids, types, mask = (np.zeros((len(features), 40), np.int32) for _ in range(3))
  for i, f in enumerate(features):
    n = len(f["input_ids"])
    ids[i, :n], types[i, :n], mask[i, :n] = f["input_ids"], f["token_type_ids"], 1
  out = jax.jit(hidden_fn)(params, {"input_ids": ids, "token_type_ids": types, "attention_mask": mask})
  return [{"hidden": np.asarray(out["hidden"][i, :len(f["input_ids"])]), "pooled": np.asarray(out["pooled"][i])}
          for i, f in enumerate(features)]


def test_batch_sizes_and_plan():
  assert runner_lib.batch_sizes(32, 1) == (32, 16, 8, 4, 2, 1)
  assert runner_lib.batch_sizes(32, 8) == (32, 16, 8)
  assert runner_lib.batch_sizes(20, 8) == (24, 16, 8)
  assert runner_lib.bucket_lengths(100, 32) == (32, 64, 96, 100)
  assert runner_lib.bucket_lengths(300) == (4, 8, 12, 16, 20, 24, 28, 32, 36, 40, 44, 48, 52, 56, 60, 64, 72, 80,
                                            88, 96, 104, 112, 120, 128, 144, 160, 176, 192, 208, 224, 240, 256,
                                            288, 300)
  assert runner_lib.bucket_lengths(3) == (3,)
  lengths = [5, 40, 33, 12, 31, 32, 7, 64, 2]
  plan = runner_lib.plan_batches(lengths, batch_size=4, buckets=(16, 32, 64))
  # Longest first, each batch padded to the bucket of its longest row; the last one takes the smallest size
  # that holds it.
  assert [(p.rows.tolist(), p.length, p.size) for p in plan] == [
      ([7, 1, 2, 5], 64, 4), ([4, 3, 6, 0], 32, 4), ([8], 16, 1)]
  assert sorted(np.concatenate([p.rows for p in plan]).tolist()) == list(range(len(lengths)))
  with pytest.raises(ValueError, match="more than the largest bucket 64"):
    runner_lib.plan_batches([65], 4, (32, 64))


def test_partial_batches_are_padded_with_a_real_row():
  features = [{"input_ids": [2, 7, 8, 3], "token_type_ids": [0, 0, 0, 0], "positions": [1, 2]},
              {"input_ids": [2, 9, 3], "token_type_ids": [0, 0, 0], "positions": [1]}]
  planned = runner_lib.plan_batches([4, 3], batch_size=8, buckets=(8,))[0]
  assert planned.size == 2 and planned.rows.tolist() == [0, 1]
  planned = runner_lib.PlannedBatch(rows=planned.rows, length=8, size=4)
  batch = runner_lib.assemble(features, planned)
  assert batch["input_ids"].tolist() == [[2, 7, 8, 3, 0, 0, 0, 0], [2, 9, 3, 0, 0, 0, 0, 0]] + [
      [2, 7, 8, 3, 0, 0, 0, 0]] * 2
  assert batch["attention_mask"].sum(1).tolist() == [4, 3, 4, 4]
  # Extra features are padded to the next power of two of their longest row.
  assert batch["positions"].tolist() == [[1, 2], [1, 0], [1, 2], [1, 2]]


def test_bucketed_results_equal_unbucketed_in_input_order():
  params = _params()
  features = _features(23)
  want = _reference(params, features)
  run = runner_lib.Runner(hidden_fn, params, max_length=40, batch_size=4, token_outputs=("hidden",), mesh=_mesh(1))
  assert run.buckets == (4, 8, 12, 16, 20, 24, 28, 32, 36, 40)
  got = run.run(features)
  assert len(got) == len(features)
  for f, g, w in zip(features, got, want):
    assert g["hidden"].shape == (len(f["input_ids"]), 32)  # Cut to the row's own length.
    # Padding is masked out, so only float rounding (other shapes, other batch neighbours) may differ.
    np.testing.assert_allclose(g["hidden"], w["hidden"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(g["pooled"], w["pooled"], atol=1e-6, rtol=0)


def _mesh(n):
  return sharding.make_mesh(data=-1, devices=jax.devices()[:n])


@pytest.mark.devices(8)
def test_eight_devices_equal_one():
  assert len(jax.devices()) == 8
  params = _params()
  features = _features(37, seed=1)
  one = runner_lib.Runner(hidden_fn, params, max_length=40, batch_size=8, mesh=_mesh(1)).run(features)
  eight = runner_lib.Runner(hidden_fn, params, max_length=40, batch_size=8, mesh=_mesh(8)).run(features)
  for a, b in zip(one, eight):
    np.testing.assert_allclose(a["pooled"], b["pooled"], atol=1e-6, rtol=0)


def test_compiled_shapes_are_reused_across_calls():
  params = _params()
  features = _features(30, seed=2)

  def fn(params, batch):
    return {"pooled": hidden_fn(params, batch)["pooled"]}

  make = lambda: runner_lib.Runner(fn, params, key="test-reuse", max_length=40, batch_size=8, mesh=_mesh(1))
  before = runner_lib.compiled_count()
  first = make().run(features)
  compiled = runner_lib.compiled_count() - before
  plan = runner_lib.plan_batches([len(f["input_ids"]) for f in features], 8, runner_lib.bucket_lengths(40))
  assert compiled == len({(p.length, p.size) for p in plan})
  second = make().run(list(reversed(features)))  # A new Runner, the same shapes: nothing compiles.
  assert runner_lib.compiled_count() - before == compiled
  for a, b in zip(first, reversed(second)):
    np.testing.assert_allclose(a["pooled"], b["pooled"], atol=1e-6, rtol=0)


def test_partial_batch_takes_a_size_already_compiled_at_its_length():
  params = _params()
  rng = np.random.default_rng(3)
  same_length = [{"input_ids": rng.integers(5, CONFIG.vocab_size, 10).tolist()} for _ in range(9)]

  def fn(params, batch):
    return {"pooled": hidden_fn(params, batch)["pooled"]}

  run = runner_lib.Runner(fn, params, key="test-partial", max_length=40, batch_size=8, mesh=_mesh(1))
  before = runner_lib.compiled_count()
  full = run.run(same_length[:8])  # One batch of 8 at bucket 12.
  assert runner_lib.compiled_count() - before == 1
  planned = runner_lib.plan_batches([10] * 3, 8, run.buckets)[0]
  assert (planned.size, planned.length) == (4, 12)  # Alone it would compile a batch of 4 ...
  three = run.run(same_length[6:])  # ... but the compiled batch of 8 at that length is reused.
  assert runner_lib.compiled_count() - before == 1 and len(three) == 3
  for a, b in zip(full[6:], three[:2]):
    np.testing.assert_allclose(a["pooled"], b["pooled"], atol=1e-6, rtol=0)
  longer = run.run([{"input_ids": same_length[0]["input_ids"] * 2}])  # Nothing compiled at bucket 20: size 1.
  assert runner_lib.compiled_count() - before == 2 and longer[0]["pooled"].shape == (32,)


def test_ids_are_checked_on_the_host():
  params = _params()
  run = runner_lib.Runner(hidden_fn, params, max_length=40, vocab_size=CONFIG.vocab_size, type_vocab_size=2,
                          mesh=_mesh(1))
  bad = _features(3) + [{"input_ids": [2, 50, 3], "token_type_ids": [0, 0, 0]}]
  with pytest.raises(ValueError, match=r"input_ids of input 3 holds 50 at position 1, outside \[0, 50\)"):
    run.run(bad)
  with pytest.raises(ValueError, match="token_type_ids of input 0 holds 2"):
    run.run([{"input_ids": [2, 9, 3], "token_type_ids": [0, 2, 0]}])


def test_stream_keeps_input_order():
  params = _params()
  features = _features(21, seed=3)

  def fn(params, batch):
    del params
    return {"first": batch["input_ids"][:, 1], "length": batch["attention_mask"].sum(1)}

  run = runner_lib.Runner(fn, params, key="test-stream", max_length=40, batch_size=4, mesh=_mesh(8))
  rows = [r for chunk in run.stream(iter(features), chunk_size=5) for r in chunk]
  assert [int(r["first"]) for r in rows] == [f["input_ids"][1] for f in features]
  assert [int(r["length"]) for r in rows] == [len(f["input_ids"]) for f in features]


def test_progress_line_has_rate_and_eta():
  now = [0.0]
  stream = io.StringIO()
  progress = ProgressLine(1000, "embed", stream=stream, interval_s=0, clock=lambda: now[0])
  now[0] = 2.0
  progress.update(250)
  assert stream.getvalue() == "\rembed: 250/1,000 (25%) 125.0/s ETA 0:06  "
  now[0] = 8.0
  progress.update(750)
  progress.close()
  assert stream.getvalue().endswith("\rembed: 1,000/1,000 (100%) 125.0/s ETA 0:00  \n")
  silent = io.StringIO()
  ProgressLine(10, stream=silent, enabled=False).update(5)
  assert silent.getvalue() == ""


@pytest.mark.parametrize("environ, cores, started, num_cpu_devices, accelerator, want", [
    ({}, 4, False, -1, False, 4),
    ({"JAX_PLATFORMS": "cpu"}, 2, False, -1, False, 2),
    ({}, 1, False, -1, False, None),  # One core: nothing to spread over.
    ({}, 4, True, -1, False, None),  # JAX has started: too late, and its devices are in use.
    ({}, 4, False, 3, False, None),  # The user chose through jax.config ...
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, 4, False, -1, False, None),  # ... or XLA_FLAGS
    ({"JAX_NUM_CPU_DEVICES": "1"}, 4, False, -1, False, None),  # ... or the environment.
    ({"JAX_PLATFORMS": "tpu"}, 4, False, -1, False, None),
    ({}, 4, False, -1, True, None),  # A TPU VM or a GPU plugin.
])
def test_cpu_devices_to_make(environ, cores, started, num_cpu_devices, accelerator, want):
  assert runner_lib.cpu_devices_to_make(environ, cores, started, num_cpu_devices, accelerator) == want


def test_use_every_core_makes_a_device_per_core_before_jax_starts():
  import os  # pylint: disable=g-import-not-at-top
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  code = ("import jax, os\nfrom jbert.inference import runner\nn = runner.use_every_core()\n"
          "print(n, jax.local_device_count(), len(os.sched_getaffinity(0)), runner.use_every_core())")
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
  env["JAX_PLATFORMS"] = "cpu"
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
  made, devices, cores, again = out.stdout.split()
  if int(cores) > 1:
    assert (made, devices) == (cores, cores)
  else:
    assert (made, devices) == ("None", "1")
  assert again == "None"  # JAX has started: a second call changes nothing.
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=3"
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
  assert out.stdout.split()[:2] == ["None", "3"]


def _log_of_first_id(params, batch):
  del params  # log(id - 5) is -inf for id 5 and NaN below: rows starting with such ids are broken
  first = batch["input_ids"][:, 1].astype("float32")
  return {"value": jax.numpy.log(first - 5.0), "length": batch["attention_mask"].sum(-1)}


def test_non_finite_outputs_name_their_rows_not_the_padding():
  ids = [7, 5, 9, 3, 8, 6, 2]  # rows 1, 3 and 6 give -inf or NaN
  features = [{"input_ids": np.array([1, i, 1], np.int32), "token_type_ids": np.zeros(3, np.int32)} for i in ids]
  runner = runner_lib.Runner(_log_of_first_id, {}, key="log_of_first_id", max_length=8, batch_size=8)
  with pytest.raises(runner_lib.NonFiniteOutput) as error:
    runner.run(features)
  assert error.value.rows == (1, 3, 6)
  assert str(error.value) == "the model's outputs for rows 1, 3, 6 are not finite (NaN or inf)"
  # Batches are padded with rows of zeros (log(-5) is NaN): padding is never reported.
  finite = runner.run([features[i] for i in (0, 2, 4, 5)])
  np.testing.assert_allclose([r["value"] for r in finite], np.log([2.0, 4.0, 3.0, 1.0]), rtol=1e-6)
  assert runner_lib.describe_rows(list(range(8))) == "0, 1, 2, 3, 4 and 3 more"
