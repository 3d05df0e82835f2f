"""The Runner's programs found again without tracing (jbert/runtime/stored_programs.py): a second Runner, as a second
process builds it, loads its programs by a key known before tracing and computes the same bits; a damaged stored
program or a vanished JAX entry is traced and compiled again (and stored anew); keys that are not values, a
changed jbert and a cache that is off store or find nothing. `python -m jbert.embed` twice: tests/inference/test_cli.py
and bench/startup.py's test."""
import logging
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jbert.inference import runner as runner_lib
from jbert.model.config import BertConfig
from jbert.runtime import compile_cache, sharding, stored_programs

_SETTINGS = ("jax_compilation_cache_dir", "jax_enable_compilation_cache", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")


@pytest.fixture
def own_cache(tmp_path):
  """JAX's persistent cache opened afresh in tmp_path/xla, as a command opens it; the suite's is put back."""
  from jax._src import compilation_cache as jax_cache  # pylint: disable=import-outside-toplevel
  saved = {name: getattr(jax.config, name) for name in _SETTINGS}
  jax_cache.reset_cache()
  yield pathlib.Path(compile_cache.enable(str(tmp_path / "xla")))
  jax_cache.reset_cache()
  jax.clear_caches()
  for name, value in saved.items():
    jax.config.update(name, value)


PARAMS = {"table": np.linspace(-1.0, 1.0, 40 * 3, dtype=np.float32).reshape(40, 3)}
FEATURES = [{"input_ids": list(range(1, 2 + i % 9))} for i in range(11)]  # lengths 1..9: 2 shapes at batch 8


def new_runner(key, traces: list):
  """A Runner as a new process makes it: nothing compiled in this process; `traces` counts each tracing."""
  runner_lib._compiled.clear()  # pylint: disable=protected-access
  jax.clear_caches()

  def fn(params, batch):
    traces.append(batch["input_ids"].shape)
    hidden = jnp.tanh(params["table"][batch["input_ids"]]) * batch["attention_mask"][..., None]
    return {"pooled": hidden.sum(1)}

  mesh = sharding.make_mesh(data=-1, devices=jax.local_devices()[:1])
  return runner_lib.Runner(fn, PARAMS, key=key, max_length=16, batch_size=8, mesh=mesh, stored=True)


def pooled(rows):
  return np.stack([r["pooled"] for r in rows])


def names(cache: pathlib.Path, kind: str) -> list[str]:
  return sorted(p.name for p in cache.iterdir() if p.name.endswith(kind))


KEY = ("stored-test", BertConfig(vocab_size=40, hidden_size=6, num_attention_heads=2), 3)


def test_a_second_runner_loads_its_programs_without_tracing_and_computes_the_same(own_cache):
  traces = []
  first = pooled(new_runner(KEY, traces).run(FEATURES))
  assert len(traces) == 2  # one full batch of 8, one partial batch of 4 rows (at lengths 12 and 8)
  stored = names(own_cache, "-cache")
  assert len([n for n in stored if n.startswith("jbert-program-")]) == 2
  traces.clear()
  second = pooled(new_runner(KEY, traces).run(FEATURES))
  assert traces == [] and names(own_cache, "-cache") == stored  # nothing traced, compiled or written
  np.testing.assert_array_equal(second, first)
  np.testing.assert_allclose(first[3], np.tanh(PARAMS["table"][[1, 2, 3, 4]]).sum(0), rtol=1e-6)


def test_a_damaged_program_or_a_vanished_jax_entry_is_traced_again_and_stored_anew(own_cache, caplog):
  traces = []
  first = pooled(new_runner(KEY, traces).run(FEATURES))
  program = own_cache / next(n for n in names(own_cache, "-cache") if n.startswith("jbert-program-"))
  whole = program.read_bytes()
  program.write_bytes(whole[:len(whole) // 3])
  traces.clear()
  with caplog.at_level(logging.WARNING, logger="jbert"):
    np.testing.assert_array_equal(pooled(new_runner(KEY, traces).run(FEATURES)), first)
  assert len(traces) == 1 and program.read_bytes() == whole  # the damaged one only, stored again whole
  assert [r.getMessage() for r in caplog.records] == [
      f"compile cache: {program} is damaged ({len(whole) // 3} bytes where its record says {len(whole)} (cut "
      "short)); compiling it again and rewriting it."]

  for name in names(own_cache, "-cache"):  # a cache directory cleaned of JAX's entries by hand
    if not name.startswith("jbert-program-"):
      (own_cache / name).unlink()
  traces.clear()
  caplog.clear()
  with caplog.at_level(logging.WARNING, logger="jbert"):
    np.testing.assert_array_equal(pooled(new_runner(KEY, traces).run(FEATURES)), first)
  assert len(traces) == 2 and not caplog.records  # both traced and compiled again, no warning
  traces.clear()
  np.testing.assert_array_equal(pooled(new_runner(KEY, traces).run(FEATURES)), first)
  assert traces == []


def test_nothing_is_found_for_another_jbert_a_key_not_by_value_or_with_the_cache_off(own_cache, monkeypatch):
  traces = []
  new_runner(KEY, traces).run(FEATURES)
  monkeypatch.setattr(stored_programs, "_SOURCES", "an edited jbert")
  traces.clear()
  new_runner(KEY, traces).run(FEATURES)
  assert len(traces) == 2  # every key changes with jbert's code
  monkeypatch.undo()

  for key in (("by-function", len), ("by-object", object())):  # hashable, but no value in another process
    before = names(own_cache, "-cache")
    for _ in range(2):
      traces.clear()
      new_runner(key, traces).run(FEATURES)
      assert len(traces) == 2
    assert [n for n in names(own_cache, "-cache") if n not in before and n.startswith("jbert-program-")] == []

  jax.config.update("jax_enable_compilation_cache", False)
  assert compile_cache.entries() is None and stored_programs.load("0" * 64) is None
  traces.clear()
  new_runner(("uncached", 1), traces).run(FEATURES)
  assert len(traces) == 2


def test_describe_writes_values_and_refuses_what_has_no_value():
  config = BertConfig(vocab_size=40, hidden_size=6, num_attention_heads=2)
  assert stored_programs.describe(("embed", 3, 0.5, None, {"b": 1, "a": (True,)})) == (
      "tuple('embed', 3, 0.5, None, dict('a': tuple(True), 'b': 1))")
  assert stored_programs.describe(config) == stored_programs.describe(BertConfig(vocab_size=40, hidden_size=6, num_attention_heads=2))
  assert stored_programs.describe(config) != stored_programs.describe(config.replace(dtype="bfloat16"))
  assert stored_programs.describe(np.float32) == "type(numpy.float32)"
  for value in (np.arange(3), object(), lambda x: x, {1, 2}):
    with pytest.raises(TypeError, match="has no description by value"):
      stored_programs.describe(value)
