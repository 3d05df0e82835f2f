"""The persistent compile cache of the commands: where it lives, what `enable` sets, the compile counts the
trainer reports, and entries that are whole and their key's or are compiled again (a truncated entry, two swapped
between keys, a full disk). A second command compiling nothing, and an unwritable cache: tests/inference/test_cli.py."""
import contextlib
import errno
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jbert.runtime import compile_cache
import storage_faults

_SETTINGS = ("jax_compilation_cache_dir", "jax_enable_compilation_cache", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")


@pytest.fixture
def jax_settings():
  """The test process's own cache settings (tests/conftest.py) are put back afterwards."""
  saved = {name: getattr(jax.config, name) for name in _SETTINGS}
  yield
  for name, value in saved.items():
    jax.config.update(name, value)


def test_the_setting_then_the_environment_then_jax_then_the_user_cache(monkeypatch, tmp_path, jax_settings):
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  monkeypatch.setenv(compile_cache.ENV, str(tmp_path / "env"))
  assert compile_cache.resolve(str(tmp_path / "flag")) == str(tmp_path / "flag")
  assert compile_cache.resolve("OFF") is None
  assert compile_cache.resolve() == str(tmp_path / "env")
  monkeypatch.setenv(compile_cache.ENV, "gs://bucket/xla")
  assert compile_cache.resolve() == "gs://bucket/xla"
  monkeypatch.delenv(compile_cache.ENV)
  assert compile_cache.resolve() == jax.config.jax_compilation_cache_dir  # the test cache, which JAX already uses
  jax.config.update("jax_compilation_cache_dir", None)
  assert compile_cache.resolve() == str(tmp_path / "xdg" / "jbert" / "xla")
  monkeypatch.delenv("XDG_CACHE_HOME")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert compile_cache.resolve() == str(tmp_path / "home" / ".cache" / "jbert" / "xla")


def test_enable_caches_every_program_and_keeps_a_cache_already_set_up(tmp_path, jax_settings):
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  assert compile_cache.enable(jax.config.jax_compilation_cache_dir) == jax.config.jax_compilation_cache_dir
  assert jax.config.jax_persistent_cache_min_compile_time_secs == before  # tests/conftest.py's threshold stays
  assert compile_cache.enable(str(tmp_path / "new")) == str(tmp_path / "new")
  assert (tmp_path / "new").is_dir() and not list((tmp_path / "new").iterdir())  # the probe file is gone again
  assert jax.config.jax_compilation_cache_dir == str(tmp_path / "new")
  assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0
  assert jax.config.jax_enable_compilation_cache
  assert compile_cache.enable("gs://bucket/xla") == "gs://bucket/xla"  # a URL: nothing local is made or probed
  assert not pathlib.Path("gs:").exists()
  assert compile_cache.enable("off") is None and not jax.config.jax_enable_compilation_cache


def test_compiles_counts_programs_between_two_readings():
  before = compile_cache.compiles()
  jax.jit(lambda x: x * 3 + 1)(np.arange(5, dtype=np.int32)).block_until_ready()
  done = compile_cache.compiles() - before
  assert done.programs == 1 and done.seconds > 0 and done.from_cache in (0, 1)  # 1 when the test cache has it
  assert compile_cache.Compiles(3, 12.44, 2).describe() == "3 XLA programs in 12.4 s, 2 of them from the compile cache"
  assert compile_cache.Compiles(1, 0.5, 0).describe() == "1 XLA program in 0.5 s"


@pytest.fixture
def own_cache(tmp_path, jax_settings):
  """JAX's persistent cache opened afresh in tmp_path/xla by `enable`, as a command opens it; the suite's opens
  again at the next compile after the test."""
  from jax._src import compilation_cache as jax_cache
  jax_cache.reset_cache()
  yield pathlib.Path(compile_cache.enable(str(tmp_path / "xla")))
  jax_cache.reset_cache()
  jax.clear_caches()


def double(x):
  return x * 2 + 1


def cube(x):
  return jnp.cumsum(x ** 3)


EXPECTED = {"double": lambda x: x * 2 + 1, "cube": lambda x: np.cumsum(x ** 3)}


def run(*fns) -> tuple[int, int]:
  """(compiled, loaded from the persistent cache) of `fns` jitted afresh, as a new process would meet them; each
  computes what it should."""
  jax.clear_caches()
  before = compile_cache.compiles()
  x = np.arange(5, dtype=np.float32)
  for fn in fns:
    np.testing.assert_array_equal(jax.jit(fn)(x), EXPECTED[fn.__name__](x), err_msg=fn.__name__)
  done = compile_cache.compiles() - before
  return done.programs - done.from_cache, done.from_cache


def entries(path) -> dict[str, list[str]]:
  names = sorted(p.name for p in path.iterdir())
  return {kind: [n for n in names if n.endswith(kind)] for kind in ("-cache", "-jbert", ".tmp")}


def test_an_entry_is_written_whole_with_its_record_and_a_damaged_one_is_compiled_again_once(own_cache, caplog):
  assert run(double) == (1, 0)
  (entry,), (record,) = entries(own_cache)["-cache"], entries(own_cache)["-jbert"]
  key = entry.removesuffix("-cache")
  assert json.loads((own_cache / record).read_text()) == {
      "key": key, "bytes": (own_cache / entry).stat().st_size,
      "sha256": hashlib.sha256((own_cache / entry).read_bytes()).hexdigest()}
  assert run(double) == (0, 1)
  whole = (own_cache / entry).read_bytes()
  (own_cache / entry).write_bytes(whole[:len(whole) // 2])  # what a full disk left before entries were atomic
  with caplog.at_level("WARNING", logger="jbert"):
    assert run(double) == (1, 0)
  assert [r.getMessage() for r in caplog.records] == [
      f"compile cache: {own_cache / entry} is damaged ({len(whole) // 2} bytes where its record says {len(whole)} "
      "(cut short)); compiling it again and rewriting it."]
  caplog.clear()
  assert run(double) == (0, 1) and not caplog.records  # rewritten: loaded again
  # An entry without its record (JAX's own, or one cut short before it) is compiled again without a warning.
  (own_cache / record).unlink()
  assert run(double) == (1, 0) and not caplog.records
  assert run(double) == (0, 1)


SWAP = """
import json, os, sys
import jax, numpy as np
from jbert.runtime import compile_cache
sys.path.insert(0, {tests!r})
from test_compile_cache import cube, double, run
path = compile_cache.enable({path!r})
counts = [run(double)]
first = set(os.listdir(path))
counts.append(run(cube))
(a,), (b,) = [n for n in first if n.endswith("-cache")], [n for n in set(os.listdir(path)) - first if n.endswith("-cache")]
os.rename(os.path.join(path, a), os.path.join(path, "swap"))
os.rename(os.path.join(path, b), os.path.join(path, a))
os.rename(os.path.join(path, "swap"), os.path.join(path, b))
counts += [run(double, cube), run(double, cube)]
print(json.dumps(counts))
"""


def test_entries_swapped_between_keys_are_compiled_again_not_run(tmp_path):
  """Two valid entries under each other's key ran each other's program (same signature, as here: wrong results),
  or crashed the process in XLA (exit status 139)."""
  script = SWAP.format(tests=str(pathlib.Path(__file__).parent), path=str(tmp_path / "xla"))
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  assert json.loads(done.stdout) == [[1, 0], [1, 0], [2, 0], [0, 2]]  # the swapped pair recompiled once
  damaged = re.findall(r"compile cache: (\S+) is damaged \(\d+ bytes where its record says \d+(?: \(cut short\))?\); "
                       r"compiling it again and rewriting it\.", done.stderr)
  assert sorted(damaged) == sorted(str(p) for p in (tmp_path / "xla").glob("*-cache")) and len(damaged) == 2


def test_a_full_disk_leaves_no_partial_entry_and_a_later_run_caches_again(own_cache, caplog, monkeypatch):
  """A full disk during a write: one warning, nothing half-written; once space is back the next run compiles
  and keeps the program, and the one after loads it."""
  disk = storage_faults.FillableDisk(own_cache) if storage_faults.CAN_MOUNT else None
  try:
    if disk is not None:
      disk.fill()
      with contextlib.suppress(OSError), open(own_cache / "filler", "wb") as f:
        while True:  # the last free blocks too
          f.write(b"\0" * 4096)
          f.flush()
    else:
      real = compile_cache.atomic.open_for_write

      @contextlib.contextmanager
      def full(path, mode="w", **kwargs):
        with real(path, mode, **kwargs) as f:
          f.write(b"\0" * 100)  # a part of the entry reaches the disk
          raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
          yield f  # pylint: disable=unreachable

      monkeypatch.setattr(compile_cache.atomic, "open_for_write", full)
    with caplog.at_level("WARNING", logger="jbert"):
      assert run(double, cube) == (2, 0)
    assert [r.getMessage() for r in caplog.records] == [
        f"compile cache {own_cache}: writing a program failed (No space left on device); programs are compiled but "
        "not kept (free space or set JBERT_COMPILE_CACHE to a writable directory, or to off)."]
    assert entries(own_cache) == {"-cache": [], "-jbert": [], ".tmp": []}
    if disk is not None:
      (own_cache / "filler").unlink()
      disk.grow()
    monkeypatch.undo()
    assert run(double, cube) == (2, 0)
    assert run(double, cube) == (0, 2)
  finally:
    if disk is not None:
      disk.close()
