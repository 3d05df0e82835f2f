"""Object storage: `gs://` for every path jbert takes, in a plain install (no TensorFlow).

Four clients reach a bucket during a run, each with its own settings:

* etils.epath -> fsspec -> gcsfs: the workdir's own files (config.json, history.jsonl, metrics.jsonl, the lease),
  Orbax's directories and small items, the tokenizer, TFDS's data_dir and JAX's compile cache. etils prefers
  TensorFlow's file system when TensorFlow is installed; gcsfs (a dependency of jbert) serves when it is not.
* tensorstore: the arrays of Orbax checkpoints (its own HTTP client and credentials).
* google-cloud-storage: tensorboardX's event files.
* ArrayRecord's own client: the shards of a prepared corpus (`python -m jbert.data prepare`).

On Google Cloud each finds the VM's credentials by itself. Against an emulator, `STORAGE_EMULATOR_HOST` (which
gcsfs and google-cloud-storage read) is the one setting a user gives: `configure()`, run when `jbert` is
imported, derives what the others need from it, so every client talks to the emulator and none looks for
credentials (outside Google Cloud that search probes the metadata server's link-local address). Settings the
user made are kept.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Iterable, MutableMapping

EMULATOR = "STORAGE_EMULATOR_HOST"
REMOTE = ("gs://",)  # the schemes this module vouches for; others go to etils/fsspec as they are


class StorageError(ValueError):
  """A remote path this install cannot open (the user's to fix: a missing package); one line with the fix."""


def is_remote(path) -> bool:
  """True for a URL (`gs://bucket/x`, `s3://...`), False for a local path."""
  return "://" in os.fspath(path) if path is not None else False


def emulator_url(environ: MutableMapping[str, str] = os.environ) -> str | None:
  """The emulator's base URL from `STORAGE_EMULATOR_HOST` (a bare host:port gets http://), or None."""
  host = environ.get(EMULATOR, "").strip()
  if host in ("", "default"):
    return None
  return (host if "://" in host else f"http://{host}").rstrip("/")


def emulator_settings(url: str) -> dict[str, str]:
  """The variables that point every client at the emulator at `url`, anonymously."""
  return {
      # tensorstore's GCS driver has its own endpoint variable and, without a token, searches for credentials
      # (and finding none, fails every write after a long retry); emulators accept any bearer token.
      "TENSORSTORE_GCS_HTTP_URL": url,
      "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
      # gcsfs: anonymous (fsspec's per-protocol default, read when fsspec is imported), and its core file
      # system: the "experimental" one asks Google's storage-control gRPC service for the bucket's layout.
      "FSSPEC_GS_TOKEN": "anon",
      "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
      # TensorFlow's GCS file system, which etils would pick when TensorFlow is installed, knows no emulator.
      "EPATH_USE_TF": "false",
      # google-auth: no probe of the metadata server from anything that still asks for default credentials.
      "NO_GCE_CHECK": "true",
      # ArrayRecord (a prepared corpus's shards, TFDS's files) has a GCS client of its own; without its endpoint
      # it goes to Google's servers and hangs until they answer.
      "CLOUD_STORAGE_EMULATOR_ENDPOINT": url,
  }


def configure(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
  """Derives the emulator settings from `STORAGE_EMULATOR_HOST` (nothing without it); returns those it set.

  Variables reach the processes this one starts (data workers, `launch_local`). Libraries that read theirs at
  import and are already imported are set in place as well, so calling it late (a test fixture) works too."""
  url = emulator_url(environ)
  if url is None:
    return {}
  added = {}
  for key, value in emulator_settings(url).items():
    if key not in environ:
      environ[key] = added[key] = value
  if environ is os.environ:
    _apply_to_imported()
  return added


def _apply_to_imported() -> None:
  """The emulator settings for libraries imported before `configure` ran."""
  if "fsspec" in sys.modules:
    from fsspec import config as fsspec_config  # pylint: disable=g-import-not-at-top
    fsspec_config.conf.setdefault("gs", {}).setdefault("token", os.environ.get("FSSPEC_GS_TOKEN", "anon"))
  if "gcsfs" in sys.modules and os.environ.get("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT") == "false":
    import fsspec  # pylint: disable=g-import-not-at-top
    from gcsfs import core  # pylint: disable=g-import-not-at-top
    for protocol in ("gs", "gcs"):
      fsspec.register_implementation(protocol, core.GCSFileSystem, clobber=True)
  gpath = sys.modules.get("etils.epath.gpath")
  if gpath is not None and hasattr(getattr(gpath, "_is_tf_installed", None), "cache_clear"):
    gpath._is_tf_installed.cache_clear()  # pylint: disable=protected-access  (it caches the EPATH_USE_TF answer)


def _importable(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except (ImportError, ValueError):  # a parent package that fails to import; a module set to None
    return False


def missing_package(path) -> str | None:
  """The package this install lacks to open `path`, or None when it can (or `path` is local)."""
  text = os.fspath(path) if path is not None else ""
  if not text.startswith(REMOTE):
    return None
  # etils takes TensorFlow's GCS file system when it can import TensorFlow, unless an emulator rules it out.
  tensorflow = emulator_url() is None and os.environ.get("EPATH_USE_TF", "").lower() not in (
      "false", "no", "f", "0") and _importable("tensorflow")
  return None if tensorflow or _importable("gcsfs") else "gcsfs"


def require(paths: Iterable, what: str = "") -> None:
  """Raises StorageError naming the first of `paths` that this install cannot open, and the package to add."""
  for path in paths:
    package = missing_package(path)
    if package:
      where = f"{what}={path}" if what else str(path)
      raise StorageError(f"{where} needs {package} to open gs:// paths, and it is not installed: pip install "
                         f"{package} (jbert's own install, `pip install -e .`, brings it).")


def remote_values(tree, prefix: str = "") -> list[tuple[str, str]]:
  """(dotted key, value) of every `gs://` string in a nested dict/ConfigDict (a config's paths)."""
  found = []
  items = tree.items() if hasattr(tree, "items") else []
  for key, value in items:
    name = f"{prefix}{key}"
    if hasattr(value, "items"):
      found += remote_values(value, name + ".")
    elif isinstance(value, str):
      found += [(name, part) for part in value.split(",") if part.strip().startswith(REMOTE)]
  return found


def require_config(config, workdir=None, compile_cache=None) -> None:
  """`require` for a run: its workdir, compile cache and every `gs://` value of its config, each named."""
  for key, value in [("--workdir", workdir), ("--compile_cache", compile_cache),
                     *((f"--config.{k}", v) for k, v in remote_values(config))]:
    if value is not None:
      require([value.strip()], key)
