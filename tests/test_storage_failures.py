"""Storage failures in the user's terms (jbert/runtime/storage_failures.py), and the commands that meet them
against the GCS emulator through a proxy that breaks it (tests/gcs_proxy.py): a storage without object
generations, one that refuses connections from the start, an outage in the middle of training, a bucket that does
not exist."""
import http.client
import io
import json
import logging
import re
import socket
import subprocess
import sys
import time

import aiohttp
import pytest
import requests
import urllib3
from google.api_core import exceptions as api_exceptions

import gcs_proxy
from gcs_emulator import gcs  # noqa: F401  pylint: disable=unused-import  (fixture)
from jbert.runtime import storage_failures
from test_resume import REPO, command, reference_losses
from test_storage import bucket_losses, committed_steps

EMULATOR = "STORAGE_EMULATOR_HOST"


# ----------------------------------------------------------------------------------------------------------
# What each client's failure is.
# ----------------------------------------------------------------------------------------------------------


def _raised_from(outer: Exception, inner: Exception) -> Exception:
  try:
    try:
      raise inner
    except Exception as e:  # pylint: disable=broad-except
      raise outer from e
  except Exception as e:  # pylint: disable=broad-except
    return e


def test_each_clients_outage_is_unreachable_and_named_with_its_reason(monkeypatch):
  monkeypatch.setenv(EMULATOR, "http://127.0.0.1:9023")
  dropped = _raised_from(RuntimeError("Orbax's save failed"), aiohttp.ServerDisconnectedError())
  assert storage_failures.kind(dropped) == storage_failures.UNREACHABLE
  assert storage_failures.describe(dropped) == ("the storage at http://127.0.0.1:9023 cannot be reached (Server "
                                                "disconnected)")
  aborted = requests.exceptions.ConnectionError(
      urllib3.exceptions.ProtocolError("Connection aborted.", http.client.RemoteDisconnected("closed")))
  retried = api_exceptions.RetryError("Timeout of 120.0s exceeded", cause=aborted)  # google-cloud-storage
  assert storage_failures.kind(retried) == storage_failures.UNREACHABLE
  tensorstore = ValueError('Error writing "x": UNAVAILABLE: CURL error Couldn\'t connect to server: Failed to '
                           'connect to 127.0.0.1 port 9023 [tensorstore_spec=\'{"driver": "zarr"}\']')
  assert storage_failures.describe(tensorstore).endswith(
      "(Error writing \"x\": UNAVAILABLE: CURL error Couldn't connect to server: Failed to connect to 127.0.0.1 "
      "port 9023)")
  monkeypatch.delenv(EMULATOR)
  assert storage_failures.describe(ConnectionRefusedError(111, "Connection refused")).startswith(
      "Google Cloud Storage cannot be reached (")


def test_missing_generations_a_missing_bucket_and_everything_else():
  generations = _raised_from(ValueError("Error writing manifest.ocdbt: Malformed StorageGeneration"),
                             aiohttp.ServerDisconnectedError())  # the missing generation is what the user fixes
  assert storage_failures.kind(generations) == storage_failures.NO_GENERATIONS
  assert "answers without object generations" in storage_failures.describe(generations)
  upload = FileNotFoundError("http://127.0.0.1:9023/upload/storage/v1/b/nobkt/o")  # gcsfs: the URL alone
  assert storage_failures.kind(upload) == storage_failures.NO_BUCKET
  assert storage_failures.describe(upload, "gs://nobkt/x/plan.json") == (
      "the bucket nobkt does not exist (or this machine may not write it): create it (gcloud storage buckets create "
      "gs://nobkt) or check its name")
  # A missing object is a missing object, not a missing bucket; other errors are not storage failures.
  for error in (FileNotFoundError("http://127.0.0.1:9023/storage/v1/b/bkt/o/run%2Fconfig.json"),
                FileNotFoundError(2, "No such file or directory", "/tmp/x"), ValueError("bad value"),
                OSError(28, "No space left on device")):
    assert storage_failures.kind(error) is None and storage_failures.describe(error) is None


def test_library_tracebacks_of_a_storage_failure_leave_the_console_but_not_a_log_file(tmp_path, monkeypatch):
  console, log_file = logging.StreamHandler(sys.stderr), logging.FileHandler(tmp_path / "log.txt")
  root = logging.getLogger()
  buffer = io.StringIO()
  monkeypatch.setattr(sys, "stderr", buffer)
  console.setStream(sys.stderr)
  for handler in (console, log_file):
    root.addHandler(handler)
  try:
    failure = aiohttp.ServerDisconnectedError()
    with storage_failures.library_tracebacks_off():
      for name, error in (("gcsfs", failure), ("absl", ValueError("Malformed StorageGeneration")),
                          ("absl", ValueError("a bug")), ("jbert", failure)):
        try:
          raise error
        except Exception:  # pylint: disable=broad-except
          logging.getLogger(name).error("%s record", name, exc_info=True)
    monkeypatch.setenv("JBERT_TRACEBACK", "1")  # for bug reports: everything shows
    with storage_failures.library_tracebacks_off():
      try:
        raise failure
      except Exception:  # pylint: disable=broad-except
        logging.getLogger("gcsfs").error("gcsfs again", exc_info=True)
  finally:
    for handler in (console, log_file):
      root.removeHandler(handler)
    log_file.close()
  shown = buffer.getvalue()
  assert "gcsfs record" not in shown and "absl record" in shown and "a bug" in shown and "jbert record" in shown
  assert "Malformed" not in shown and "gcsfs again" in shown
  kept = (tmp_path / "log.txt").read_text()
  assert kept.count("Traceback") == 5 and "gcsfs record" in kept and "Malformed StorageGeneration" in kept


# ----------------------------------------------------------------------------------------------------------
# The commands against a broken storage.
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture
def proxy(gcs, request):  # noqa: F811
  served = gcs_proxy.Proxy(("127.0.0.1", gcs.port), generations=getattr(request, "param", True))
  yield served
  served.close()


def _env(gcs, proxy):  # noqa: F811
  return gcs.environ(hide_tensorflow=True, **{EMULATOR: proxy.url})


def _jbert_lines(stderr: str) -> list[str]:
  """stderr without the INFO lines of a run's progress: what a user reads as warnings, errors and tracebacks."""
  return [line for line in stderr.splitlines() if not re.match(r"I\d{4} ", line)]


@pytest.mark.parametrize("proxy", [False], indirect=True, ids=["no_generations"])
def test_a_storage_without_object_generations_is_refused_in_one_line_before_training(gcs, proxy):  # noqa: F811
  workdir = f"gs://{gcs.create_bucket()}/run"
  result = subprocess.run(command(workdir), cwd=REPO, env=_env(gcs, proxy), capture_output=True, text=True,
                          timeout=600)
  assert result.returncode == 2, result.stderr[-3000:]
  assert _jbert_lines(result.stderr) == [
      f"run.py: cannot write checkpoints to {workdir}/checkpoints: the storage at {proxy.url} answers without "
      "object generations (no x-goog-generation header), which the checkpoints' writer (tensorstore, under Orbax) "
      "needs for every array it writes; gcp-storage-emulator is such a storage: use fake-gcs-server (or Google "
      "Cloud Storage) instead. Nothing was trained."]
  assert "step 1 done" not in result.stderr  # refused before anything compiled or trained
  assert not committed_steps(gcs, workdir)
  assert json.loads(gcs.read(f"{workdir}/.jbert.lock"))["released"]  # the lease is given back


def test_a_storage_refusing_connections_at_the_start_is_one_line_after_one_reads_retries(gcs):  # noqa: F811
  """Nothing listens at the storage's address: run.py says so in one line (exit status 2) after the retries of
  its first read, not after those of every read of the start (3m40s on this machine before its check), without
  any library's traceback, and creates nothing."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    dead = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed again: connections to it are refused
  workdir = f"gs://{gcs.create_bucket()}/run"
  start = time.monotonic()
  result = subprocess.run(command(workdir), cwd=REPO, env=gcs.environ(hide_tensorflow=True, **{EMULATOR: dead}),
                          capture_output=True, text=True, timeout=600)
  elapsed = time.monotonic() - start
  assert (result.returncode, result.stdout) == (2, ""), result.stderr[-3000:]
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  assert _jbert_lines(result.stderr) == [
      f"run.py: cannot read {workdir}: the storage at {dead} cannot be reached ([Errno 111] Connect call failed "
      f"('127.0.0.1', {dead.rsplit(':', 1)[1]})). Nothing was started: rerun the same command once the storage "
      "answers, or choose another --workdir."]
  assert elapsed < 150, elapsed  # one read's retries (gcsfs: ~33 s) and the start, not seven reads' (220 s)
  assert not (REPO / "gs:").exists() and not gcs.objects(workdir)  # not taken for a local path; nothing stored


def test_an_outage_in_the_middle_of_training_is_one_line_and_the_same_command_resumes(gcs, proxy, tmp_path_factory):  # noqa: F811
  """The storage drops every connection from the first request of step 8's checkpoint on: run.py ends with one
  line (exit status 2) naming the storage error and the step a rerun resumes from, and no library traceback;
  with the storage back, the same command resumes from that step and logs the uninterrupted run's losses."""
  reference = reference_losses(tmp_path_factory)
  workdir = f"gs://{gcs.create_bucket()}/run"
  proxy.down_at(r"/run/checkpoints/8[./]")
  failed = subprocess.run(command(workdir), cwd=REPO, env=_env(gcs, proxy), capture_output=True, text=True,
                          timeout=600)
  assert proxy.is_down and failed.returncode == 2, failed.stderr[-3000:]
  lines = _jbert_lines(failed.stderr)
  # Orbax may warn (a slow save); nothing else shows before the line, no traceback of any library.
  assert "Traceback" not in failed.stderr and all(line.startswith("W") for line in lines[:-1]), failed.stderr[-3000:]
  last = lines[-1]
  assert re.fullmatch(
      rf"run\.py: (the checkpoint of step 8 could not be written to {workdir}/checkpoints|writing "
      rf"{workdir}/metrics\.jsonl at step \d+ failed): the storage at {re.escape(proxy.url)} cannot be reached "
      r"\(Server disconnected\)\. The run stops: rerun the same command once the storage answers, and it resumes "
      r"from step 4, the newest checkpoint this run saw complete\.", last), last
  proxy.up()
  assert committed_steps(gcs, workdir) == [4]  # what the message named is what is there

  resumed = subprocess.run(command(workdir), cwd=REPO, env=_env(gcs, proxy), capture_output=True, text=True,
                           timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  assert "state: resumed from checkpoint step 4 " in resumed.stderr
  assert bucket_losses(gcs, workdir) == reference


def test_prepare_into_a_bucket_that_does_not_exist_names_the_bucket(gcs, tmp_path):  # noqa: F811
  (tmp_path / "text.txt").write_text("a b c.\n\nd e f.\n")
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdef."]) + "\n")
  result = subprocess.run(
      [sys.executable, "-m", "jbert.data", "prepare", f"--input={tmp_path / 'text.txt'}",
       "--output=gs://jbert-no-such-bucket/x", f"--vocab={tmp_path / 'vocab.txt'}"],
      cwd=REPO, env=gcs.environ(hide_tensorflow=True), capture_output=True, text=True, timeout=300)
  assert (result.returncode, result.stdout) == (2, "")
  assert result.stderr == (
      "jbert.data: cannot write gs://jbert-no-such-bucket/x/plan.json: the bucket jbert-no-such-bucket does not "
      "exist (or this machine may not write it): create it (gcloud storage buckets create gs://jbert-no-such-bucket) "
      "or check its name.\n")
