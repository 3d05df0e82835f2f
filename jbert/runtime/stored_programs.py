"""Compiled programs found again without tracing: the inference Runner's second process loads its executables
from the persistent compile cache by a key it can build before tracing anything.

JAX keys its persistent cache by the lowered program, so even a hit traces the Python function (a Flax model) and
lowers it first. For `jbert.embed` with a MiniLM-sized model that is ~0.3 s a shape on docs/performance.md's 2-core
host, as much as loading the compiled program, and what kept a second call on the same folder at ~0.8x the first.

A stored program is an entry of jbert's in the cache directory, `jbert-program-<sha256>-cache` with its `-jbert`
record (written whole and verified as `jbert.runtime.compile_cache` writes and verifies every entry). It holds
`jax.experimental.serialize_executable`'s description of the compiled program (shardings, shapes, trees) with, in
place of the XLA executable, the key of JAX's own entry holding it, so no executable is stored twice. Its key,
`program_key`, is the caller's name for the function, which must say by value everything the function computes
(`describe`: plain values and dataclasses; anything else and nothing is stored), with what else changes the
traced program: jbert's source (a sha256 of its .py files), the Python, jax, jaxlib, flax and numpy versions,
every jax setting but the cache's own, the JAX_/XLA_/TPU_ environment, the devices and mesh, and the argument
shapes, dtypes and shardings. A program stored under a key JAX's entry no longer backs (a cache directory cleaned
by hand), or damaged (one warning), is traced and compiled again and stored anew.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import io
import logging
import os
import pathlib
import pickle
import sys
from typing import Any, Hashable, Sequence

import jax
import numpy as np

from jbert import version
from jbert.runtime import compile_cache

try:  # jax's internals for the executable's description (jax 0.10), checked before use as compile_cache does
  from jax._src import compilation_cache as _jax_cache  # pylint: disable=protected-access
  from jax.experimental import serialize_executable as _serialize
  from jax._src.lib import _jax, xla_client as _xc  # pylint: disable=protected-access
  _USABLE = all(hasattr(_jax_cache, n) for n in ("decompress_executable", "extract_executable_and_time")) and all(
      hasattr(_serialize, n) for n in ("_JaxPjrtPickler", "_JaxPjrtUnpickler"))
except ImportError:  # pragma: no cover  (another jax: every program is traced, as JAX does)
  _USABLE = False

log = logging.getLogger("jbert")

_PREFIX = "jbert-program-"
_ENV_PREFIXES = ("JAX_", "XLA_", "TPU_", "LIBTPU")
_FORMAT = 1


class _NotDescribable(TypeError):
  pass


def describe(value: Any) -> str:
  """`value` written out by value, the same in every process; raises TypeError for anything that is not plain
  (numbers, strings, containers of them, dataclasses, enums, types): a repr such as an array's elides its
  contents, or an object's names a memory address."""
  if value is None or isinstance(value, (bool, int, float, str, bytes)):
    return repr(value)
  if isinstance(value, (tuple, list)):
    return f"{type(value).__name__}({', '.join(describe(v) for v in value)})"
  if isinstance(value, dict):
    return f"dict({', '.join(sorted(f'{describe(k)}: {describe(v)}' for k, v in value.items()))})"
  if isinstance(value, enum.Enum):
    return f"{type(value).__module__}.{type(value).__qualname__}.{value.name}"
  if isinstance(value, type):
    return f"type({value.__module__}.{value.__qualname__})"
  if isinstance(value, np.dtype):
    return f"dtype({value})"
  if dataclasses.is_dataclass(value):
    fields = ", ".join(f"{f.name}={describe(getattr(value, f.name))}" for f in dataclasses.fields(value))
    return f"{type(value).__module__}.{type(value).__qualname__}({fields})"
  raise _NotDescribable(f"{type(value).__qualname__} has no description by value")


def _digest_sources() -> str:
  """sha256 over jbert's version and .py files: any edit of jbert changes every key (a miss traces again)."""
  root = pathlib.Path(__file__).resolve().parents[1]
  digest = hashlib.sha256(version.__version__.encode())
  for path in sorted(root.rglob("*.py")):
    digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
  return digest.hexdigest()


# Read when the Runner is imported, with the code it runs, not when the first program is stored (~10 ms).
_SOURCES = _digest_sources()


def _environment() -> str:
  import flax  # pylint: disable=g-import-not-at-top  (the models' library; loaded already by any model)
  import jaxlib  # pylint: disable=g-import-not-at-top
  settings = sorted((name, repr(getattr(jax.config, name, value))) for name, value in jax.config.values.items()
                    if "compilation_cache" not in name and "persistent_cache" not in name)
  environ = sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIXES))
  versions = (sys.version, jax.__version__, jaxlib.__version__, flax.__version__, np.__version__)
  return repr((_SOURCES, versions, settings, environ, jax.process_index(), jax.process_count()))


def program_key(name: Hashable, mesh: jax.sharding.Mesh, args: Any) -> str | None:
  """The stored program's key for function `name` (the caller's, by value) on `mesh` applied to `args` (arrays or
  shapes), or None when `name` has no description by value (nothing is then stored)."""
  try:
    described = describe(name)
  except _NotDescribable:
    return None
  devices = [(d.id, d.platform, d.device_kind, d.process_index) for d in mesh.devices.flat]
  leaves, treedef = jax.tree.flatten(args)
  shapes = [(tuple(x.shape), str(x.dtype), repr(getattr(x, "sharding", None))) for x in leaves]
  backend = mesh.devices.flat[0].client
  text = repr((_FORMAT, described, _environment(), backend.platform, backend.platform_version,
               tuple(mesh.shape.items()), devices, str(treedef), shapes))
  return hashlib.sha256(text.encode()).hexdigest()


class _Pickler(_serialize._JaxPjrtPickler if _USABLE else pickle.Pickler):  # pylint: disable=protected-access
  """The executable's description with JAX's cache key in place of the executable."""

  def __init__(self, file, entry: str):
    super().__init__(file)
    self._entry = entry

  def persistent_id(self, obj):
    if isinstance(obj, (_xc.LoadedExecutable, _jax.Executable)):
      return ("jax-entry", self._entry)
    return super().persistent_id(obj)


class _Unpickler(_serialize._JaxPjrtUnpickler if _USABLE else pickle.Unpickler):  # pylint: disable=protected-access

  def __init__(self, file, backend, store: compile_cache.VerifiedCache, devices):
    super().__init__(file, backend, devices)
    self._store = store

  def persistent_load(self, pid):
    if pid[0] == "jax-entry":
      value = self._store.get(pid[1])
      if value is None:
        raise _Missing(pid[1])
      executable, _ = _jax_cache.extract_executable_and_time(_jax_cache.decompress_executable(value))
      return self.backend.deserialize_executable(executable, executable_devices=self.execution_devices)
    return super().persistent_load(pid)


class _Missing(LookupError):
  """JAX's entry that a stored program names is gone."""


def load(key: str | None, devices: Sequence[jax.Device] = ()):
  """The stored program of `key` (a `jax.stages.Compiled`) for `devices` (its mesh's; default all), or None."""
  store = compile_cache.entries() if key and _USABLE else None
  if store is None:
    return None
  raw = store.get(_PREFIX + key)
  if raw is None:
    return None
  try:
    stored = pickle.loads(raw)
    backend = (devices[0] if devices else jax.devices()[0]).client
    unloaded, args_flat, no_kwargs = _Unpickler(io.BytesIO(stored["executable"]), backend, store,
                                                list(devices) or None).load()
    return jax.stages.Compiled(unloaded.load(), [], stored["in_tree"].unflatten(args_flat), stored["out_tree"],
                               no_kwargs=no_kwargs)
  except _Missing:
    return None  # compiled again, and stored again over this one
  except Exception as e:  # pylint: disable=broad-except  (a program that cannot load is compiled as if never stored)
    log.warning("compile cache: the stored program %s%s cannot be loaded (%s: %s); tracing and compiling it again.",
                _PREFIX, key, type(e).__name__, e)
    return None


def compile_and_store(lowered: jax.stages.Lowered, key: str | None):
  """`lowered.compile()`, stored under `key` (when not None) if JAX's persistent cache holds its executable."""
  with compile_cache.watch() as used:
    compiled = lowered.compile()
  store = compile_cache.entries() if key and _USABLE else None
  if store is None or len(used) != 1:  # not cached (too small or quick for the cache's thresholds, or no cache)
    return compiled
  try:
    unloaded = compiled._executable._unloaded_executable  # pylint: disable=protected-access
    if compiled._params.const_args or getattr(getattr(unloaded, "mut", None), "in_mut", None):  # pylint: disable=protected-access
      return compiled  # what serialize_executable refuses too
    args_flat, in_tree = jax.tree.flatten(compiled.args_info)
    described = io.BytesIO()
    _Pickler(described, used[0]).dump((unloaded, args_flat, compiled._no_kwargs))  # pylint: disable=protected-access
    payload = pickle.dumps({"executable": described.getvalue(), "in_tree": in_tree, "out_tree": compiled.out_tree})
  except (AttributeError, TypeError, ValueError, pickle.PicklingError) as e:
    log.debug("compile cache: program not stored (%s: %s)", type(e).__name__, e)
    return compiled
  store.put(_PREFIX + key, payload)
  return compiled
