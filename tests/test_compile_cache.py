"""The persistent compile cache of the commands: where it lives, what `enable` sets, the compile counts the
trainer reports. A second command compiling nothing, and an unwritable cache: tests/inference/test_cli.py."""
import pathlib

import jax
import numpy as np
import pytest

from jbert.runtime import compile_cache

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
