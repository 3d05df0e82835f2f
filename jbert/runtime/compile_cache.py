"""JAX's persistent compilation cache for the commands: a rerun, a resume or a second `embed` call loads its XLA
programs from disk instead of compiling them again.

Which directory, first match wins:
1. the command's own setting (`run.py --compile_cache=PATH|off`);
2. `$JBERT_COMPILE_CACHE`: a path, or `off`;
3. a directory this process's JAX already uses (`jax_compilation_cache_dir`, `$JAX_COMPILATION_CACHE_DIR`),
   kept with its own thresholds;
4. `$XDG_CACHE_HOME/jbert/xla`, else `~/.cache/jbert/xla`.

`gs://` and other URLs go to JAX as they are (nothing is created locally): on a TPU pod one bucket path serves
every host, process 0 writes and all read. JAX keys an entry by the program, its compile options, the devices
and the jax/XLA versions, so a stale entry is never used, only left behind; delete the directory to reclaim the
space. A cache directory that cannot be written is one warning line, and the command compiles as if it had none.

`run.py`, `jbert.embed`, `jbert.fill_mask`, `jbert.predict` and `jbert.glue` call `enable()` before their first
compile. The Python API (`jbert.embed(...)`, `load_pretrained`, `train_and_evaluate`) leaves the process's JAX
configuration to its owner: call `jbert.enable_compile_cache()` once, before the first computation, to opt in.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading

import jax

ENV = "JBERT_COMPILE_CACHE"
OFF = ("off", "none", "false", "0", "no")
_HITS = "/jax/compilation_cache/cache_hits"
_COMPILE = "/jax/core/compile/backend_compile_duration"  # a compile, or a load from the cache, and its seconds

log = logging.getLogger("jbert")


def default_dir() -> str:
  """`$XDG_CACHE_HOME/jbert/xla`, else `~/.cache/jbert/xla`."""
  cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(cache, "jbert", "xla")


def resolve(setting: str | None = None) -> str | None:
  """The directory (or URL) to cache in, or None for no cache; see the module docstring for the order."""
  for value in (setting, os.environ.get(ENV)):
    if value is not None and value.strip():
      value = value.strip()
      return None if value.lower() in OFF else (value if "://" in value else os.path.expanduser(value))
  return jax.config.jax_compilation_cache_dir or default_dir()


def _unwritable(path: str) -> str | None:
  """Why a local cache directory cannot be written to, or None when it can."""
  try:
    os.makedirs(path, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path, prefix=".probe-"):
      pass
  except OSError as e:
    return e.strerror or str(e)
  return None


def enable(setting: str | None = None) -> str | None:
  """Turns the persistent cache on for this process (or off, for `off`); returns the directory in use or None.

  Every program is cached, however fast it compiled or small it is: on CPU most of a command's programs take
  well under JAX's default threshold of a second, and together they are most of its start-up."""
  path = resolve(setting)
  if path is None:
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  reason = None if "://" in path else _unwritable(path)
  if reason is not None:
    log.warning("compile cache %s: %s; compiling without a cache (set %s to a writable directory, or to off).",
                path, reason, ENV)
    jax.config.update("jax_enable_compilation_cache", False)
    return None
  jax.config.update("jax_enable_compilation_cache", True)
  if jax.config.jax_compilation_cache_dir != path:  # a cache already set up here keeps its owner's thresholds
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


enable_compile_cache = enable  # the name `jbert` exports


@dataclasses.dataclass(frozen=True)
class Compiles:
  """XLA programs built so far in this process: `programs` compiled or loaded, `seconds` spent on them,
  `from_cache` of them loaded from the persistent cache."""
  programs: int = 0
  seconds: float = 0.0
  from_cache: int = 0

  def __sub__(self, other: Compiles) -> Compiles:
    return Compiles(self.programs - other.programs, self.seconds - other.seconds, self.from_cache - other.from_cache)

  def describe(self) -> str:
    """E.g. `3 XLA programs in 12.4 s, 2 of them from the compile cache`."""
    text = f"{self.programs} XLA program{'s' * (self.programs != 1)} in {self.seconds:.1f} s"
    return text + (f", {self.from_cache} of them from the compile cache" if self.from_cache else "")


_lock = threading.Lock()
_counts = {"programs": 0, "seconds": 0.0, "from_cache": 0}
_listening = False


def _on_event(event: str, **kwargs) -> None:
  del kwargs
  if event == _HITS:
    with _lock:
      _counts["from_cache"] += 1


def _on_duration(event: str, duration: float, **kwargs) -> None:
  del kwargs
  if event == _COMPILE:
    with _lock:
      _counts["programs"] += 1
      _counts["seconds"] += duration


def compiles() -> Compiles:
  """The process's compiles so far, counted from the first call of this function; subtract two readings to
  count what happened in between."""
  global _listening
  with _lock:
    if not _listening:
      jax.monitoring.register_event_listener(_on_event)
      jax.monitoring.register_event_duration_secs_listener(_on_duration)
      _listening = True
    return Compiles(**_counts)
