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

JAX hands whatever bytes an entry file holds to XLA: a file cut short by a full disk was never repaired (JAX does
not overwrite an existing entry), and another program's entry under a key crashed the process. jbert's cache
(`verify_entries`, which `enable` installs) writes each entry under a temporary name renamed into place, then
beside it `<key>-jbert` with the key, size and sha256 of the entry; an entry is handed to XLA only when that
record matches it. A damaged or foreign entry is one warning naming its file, and is compiled again and
rewritten; one without a record (written by JAX alone, or cut short before its record) is compiled again and
rewritten without a warning. A write that fails (a full or read-only disk) leaves nothing behind and is one
warning per process; the command goes on compiling.

`run.py`, `jbert.embed`, `jbert.fill_mask`, `jbert.predict` and `jbert.glue` call `enable()` before their first
compile. The Python API (`jbert.embed(...)`, `load_pretrained`, `train_and_evaluate`) leaves the process's JAX
configuration to its owner: call `jbert.enable_compile_cache()` once, before the first computation, to opt in.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from typing import Iterator

import jax

try:  # JAX has no public hook for the file cache: these are its internals (jax 0.10), checked before use
  from jax._src import compilation_cache as jax_cache  # pylint: disable=protected-access
  from jax._src.compilation_cache_interface import CacheInterface as _CacheInterface
except ImportError:  # pragma: no cover  (another jax: entries are JAX's own, unverified; `verify_entries` says so)
  jax_cache, _CacheInterface = None, object

from jbert.runtime import atomic

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
  verify_entries()
  if "://" not in path:
    _remove_stale_temporaries(path)
  jax.config.update("jax_enable_compilation_cache", True)
  if jax.config.jax_compilation_cache_dir != path:  # a cache already set up here keeps its owner's thresholds
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


enable_compile_cache = enable  # the name `jbert` exports

_ENTRY, _RECORD = "-cache", "-jbert"  # JAX's `<key>-cache` (jax._src.lru_cache), jbert's record beside it
_STALE_S = 3600.0  # a temporary file this old was left by a killed writer


def verify_entries() -> None:
  """Makes this process's persistent compile cache jbert's (module docstring): JAX's file cache, wrapped, for
  the cache JAX opens from now on and for one it already opened. Idempotent."""
  if jax_cache is None or not (hasattr(jax_cache, "get_file_cache") and hasattr(jax_cache, "_cache")):
    log.warning("compile cache: jax %s keeps its file cache elsewhere than jbert hooks it; entries are used "
                "without jbert's records (a damaged entry may fail to load).", jax.__version__)
    return
  if not getattr(jax_cache.get_file_cache, "_jbert", False):
    opener = jax_cache.get_file_cache

    def get_file_cache(path):
      opened = opener(path)
      return None if opened is None else (VerifiedCache(opened[0], str(path)), opened[1])

    get_file_cache._jbert = True  # pylint: disable=protected-access
    jax_cache.get_file_cache = get_file_cache
  if jax_cache._cache is not None and not isinstance(jax_cache._cache, VerifiedCache):  # pylint: disable=protected-access
    jax_cache._cache = VerifiedCache(jax_cache._cache, str(jax_cache._cache._path))  # pylint: disable=protected-access


def _remove_stale_temporaries(path: str) -> None:
  """Temporary entry files of writers killed mid-write (`atomic.open_for_write`'s `.NAME.PID.tmp`)."""
  try:
    with os.scandir(path) as entries:
      for entry in entries:
        if entry.name.startswith(".") and entry.name.endswith(".tmp") and (
            time.time() - entry.stat().st_mtime > _STALE_S):
          os.remove(entry.path)
  except OSError:
    pass  # another process removed it, or the directory cannot be listed: nothing to clean


def _record(key: str, value: bytes) -> bytes:
  return json.dumps({"key": key, "bytes": len(value), "sha256": hashlib.sha256(value).hexdigest()}).encode()


class VerifiedCache(_CacheInterface):
  """JAX's file cache (`base`) whose entries are written whole and handed to XLA only when they match their
  record (module docstring)."""

  def __init__(self, base, path: str):
    self._base, self._dir, self._path = base, path, base._path  # pylint: disable=protected-access
    self._remote = "://" in path
    self._write_failed = False

  def _file(self, key: str, suffix: str) -> str:
    return f"{self._dir.rstrip('/')}/{key}{suffix}"

  def _read(self, name: str) -> bytes | None:
    try:
      if self._remote:
        from etils import epath  # pylint: disable=g-import-not-at-top
        return epath.Path(name).read_bytes()
      with open(name, "rb") as f:
        return f.read()
    except OSError:
      return None

  def _problem(self, key: str, value: bytes) -> str | None:
    """Why `value` is not the entry of `key`: "" without a record, else what the record says; None when whole."""
    raw = self._read(self._file(key, _RECORD))
    if raw is None:
      return ""
    try:
      record = json.loads(raw)
      want_key, size, digest = record["key"], int(record["bytes"]), record["sha256"]
    except (ValueError, KeyError, TypeError):
      return f"its record {self._file(key, _RECORD)} is unreadable"
    if want_key != key:
      return f"it holds the program of another key ({want_key[:24]}...)"
    if len(value) != size:
      return f"{len(value)} bytes where its record says {size}" + (" (cut short)" if len(value) < size else "")
    if hashlib.sha256(value).hexdigest() != digest:
      return "its bytes do not match their sha256"
    return None

  def get(self, key: str) -> bytes | None:
    value = self._base.get(key)
    if value is None:
      return None
    problem = self._problem(key, value)
    if problem is None:
      _seen(key)
      return value
    if problem:
      log.warning("compile cache: %s is damaged (%s); compiling it again and rewriting it.",
                  self._file(key, _ENTRY), problem)
    self._remove(key)
    return None

  def _remove(self, key: str) -> None:
    for suffix in (_RECORD, _ENTRY):
      try:
        if self._remote:
          from etils import epath  # pylint: disable=g-import-not-at-top
          epath.Path(self._file(key, suffix)).unlink(missing_ok=True)
        elif os.path.lexists(self._file(key, suffix)):
          os.remove(self._file(key, suffix))
      except OSError:
        pass  # a read-only cache: the entry is compiled again, each time, as it would be without a cache

  def put(self, key: str, value: bytes) -> None:
    """The entry, then its record, each written whole: a reader sees the new entry with its record, or no entry,
    or an entry without a record (compiled again)."""
    try:
      self._remove(key)
      if self._remote or getattr(self._base, "eviction_enabled", False):
        self._base.put(key, value)  # an object store writes whole; JAX's size-bounded cache keeps its index
      else:
        with atomic.open_for_write(self._file(key, _ENTRY), "wb") as f:
          f.write(value)
      if self._remote:
        from etils import epath  # pylint: disable=g-import-not-at-top
        epath.Path(self._file(key, _RECORD)).write_bytes(_record(key, value))
      else:
        with atomic.open_for_write(self._file(key, _RECORD), "wb") as f:
          f.write(_record(key, value))
      _seen(key)
    except OSError as e:
      self._remove(key)
      if not self._write_failed:
        self._write_failed = True
        log.warning("compile cache %s: writing a program failed (%s); programs are compiled but not kept (free "
                    "space or set %s to a writable directory, or to off).", self._dir, e.strerror or e, ENV)

  def clear(self) -> None:
    self._base.clear()


class _Files:
  """The entry files of a cache directory, read and written as `VerifiedCache`'s base (jbert's own entries: the
  stored programs of `jbert.runtime.stored_programs`, beside JAX's)."""

  eviction_enabled = False

  def __init__(self, path: str):
    self._path = path

  def get(self, key: str) -> bytes | None:
    name = f"{self._path.rstrip('/')}/{key}{_ENTRY}"
    try:
      if "://" in name:
        from etils import epath  # pylint: disable=g-import-not-at-top
        return epath.Path(name).read_bytes()
      with open(name, "rb") as f:
        return f.read()
    except OSError:  # FileNotFoundError for the usual miss
      return None

  def put(self, key: str, value: bytes) -> None:  # a bucket's objects are written whole
    from etils import epath  # pylint: disable=g-import-not-at-top
    epath.Path(f"{self._path.rstrip('/')}/{key}{_ENTRY}").write_bytes(value)


def entries() -> VerifiedCache | None:
  """The directory JAX keeps its programs in now, as a verified store of entries (JAX's, read; jbert's, read and
  written), or None when the persistent cache is off or this jax keeps it elsewhere than jbert hooks it."""
  if jax_cache is None or not jax.config.jax_enable_compilation_cache:
    return None
  opened = getattr(jax_cache, "_cache", None)  # JAX opens its cache at its first compile and keeps that path
  path = str(opened._path) if opened is not None else jax.config.jax_compilation_cache_dir  # pylint: disable=protected-access
  return None if not path else VerifiedCache(_Files(path), path)


_watch = threading.local()


def _seen(key: str) -> None:
  keys = getattr(_watch, "keys", None)
  if keys is not None:
    keys.append(key)


@contextlib.contextmanager
def watch() -> Iterator[list[str]]:
  """The keys of the entries this thread read whole or wrote while inside: the entry of a program `compile()`d
  inside, from the cache or into it (none when it is not cached)."""
  outer = getattr(_watch, "keys", None)
  _watch.keys = []
  try:
    yield _watch.keys
  finally:
    _watch.keys = outer


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
