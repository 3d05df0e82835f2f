"""Test-wide JAX set-up: one CPU device (as a user's CPU run has) and a persistent compilation cache, also for the
commands the tests start.

Both must happen before the first JAX operation, so they live here rather than in a fixture. Both are set in the
environment, so that the processes the tests start (run.py, launch_local's processes, device children) have them
too: a run.py started to be killed and resumed loads what the test's own run of that config compiled. JAX fixes the
number of devices when it starts, and simulating 8 on a 2-core machine makes every step about half again as
slow, so the tests that need a mesh say so with `@pytest.mark.devices(8)` and run in a child pytest with that
many devices (tests/device_children.py).
"""
import os
import pathlib
import signal

import device_children

DEVICES = device_children.DEVICES
os.environ.setdefault("XLA_FLAGS", device_children.xla_flags(DEVICES))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

_CACHE = pathlib.Path(os.environ.get("JBERT_TEST_CACHE", pathlib.Path(__file__).resolve().parents[1] / ".jax_cache"))
# JAX reads its config options from variables of the same name in upper case, at import. Programs that compile in
# under 0.2 s are not worth a file; at -O0 (device_children.xla_flags) most of the others take under 0.5 s.
os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_CACHE)
os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.2"
os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"
# The commands the tests start (run.py, python -m jbert.embed, ...) cache in the same place, not in ~/.cache.
os.environ.setdefault("JBERT_COMPILE_CACHE", str(_CACHE))

pytest_configure = device_children.pytest_configure
pytest_runtest_logreport = device_children.pytest_runtest_logreport
pytest_sessionfinish = device_children.pytest_sessionfinish

SHARED_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from jbert.runtime import compile_cache  # noqa: E402

# Files whose tests run for half a minute to a minute each (two processes, run.py killed and resumed, training
# until a model has learned, the device check's dry run). They start first, right after the device children: one
# started last would keep its worker busy for a minute after the other ran out of tests (xdist's work stealing,
# below, balances the rest test by test).
LONG_FIRST = ("tests/test_multiprocess.py", "tests/test_bench_device_check.py", "tests/test_storage.py",
              "tests/tasks/token_classification/test_task.py", "tests/test_programs.py", "tests/test_resume.py",
              "tests/tasks/multiple_choice/test_task.py", "tests/tasks/test_finetune_durability.py",
              "tests/tasks/token_classification/test_crf.py", "tests/tasks/distillation/test_task.py",
              "tests/test_docs.py", "tests/test_storage_failures.py")


def pytest_collection_modifyitems(config, items):
  device_children.pytest_collection_modifyitems(config, items)
  # A stable sort: the device children stay first, each file's tests in their order.
  items.sort(key=lambda item: (not device_children.runs_in_child(item),
                               item.nodeid.split("::")[0] not in LONG_FIRST))


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist, which the device children run without
def pytest_xdist_make_scheduler(config, log):
  """`-n 2`'s scheduler: an idle worker takes tests queued for the other (the tests run from 0.1 s to a minute)."""
  from xdist.scheduler import WorkStealingScheduling  # pylint: disable=import-outside-toplevel
  return WorkStealingScheduling(config, log)


# The suite's own programs are cached as the commands cache theirs (each entry with its record), so that a command
# a test starts loads what the test process compiled, and the other way round.
compile_cache.verify_entries()


@pytest.fixture
def interactive():
  """SIGINT as an interactive shell leaves it, for this process and the commands it starts. A suite started in the
  background by a non-interactive shell has SIGINT ignored, and a command started with it ignored keeps it so
  (jbert.train.stop), so a Ctrl-C sent to it would do nothing."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, previous)


@pytest.fixture
def tiny_bert_config():
  """Small enough to compile in seconds; sizes divisible by 2 so tensor=2 meshes shard every axis."""
  from jbert.model import BertConfig
  return BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, max_position_embeddings=32)


def make_pretrain_batch(seed: int, batch: int = 8, seq: int = 16, preds: int = 4, vocab: int = 128):
  """A pretraining batch in the contract's format with some padding and masked positions."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, size=(batch, seq)).astype(np.int32)
  lengths = rng.integers(seq // 2, seq + 1, size=batch)
  attention = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  ids = ids * attention
  types = ((np.arange(seq)[None] >= lengths[:, None] // 2) & (attention == 1)).astype(np.int32)
  positions = np.stack([np.sort(rng.choice(np.arange(1, n), size=preds, replace=False)) for n in lengths])
  weights = (rng.random((batch, preds)) < 0.85).astype(np.int32)
  weights[:, 0] = 1
  return {
      "input_ids": ids, "token_type_ids": types, "attention_mask": attention,
      "masked_lm_positions": positions.astype(np.int32) * weights,
      "masked_lm_ids": np.take_along_axis(ids, positions, 1).astype(np.int32) * weights,
      "masked_lm_weights": weights,
      "next_sentence_labels": rng.integers(0, 2, size=batch).astype(np.int32),
  }
