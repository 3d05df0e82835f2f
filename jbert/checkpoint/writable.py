"""Where checkpoints can go: the errors of a checkpoint directory, the probes before a run reads or writes anything
(a gs:// workdir's storage answers; writable, and on gs:// a storage that keeps object generations), and the rule
that a storage that stops answering stops the run (`outage_stops`).
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import jax
from etils import epath

from jbert.checkpoint import integrity
from jbert.errors import UserError
from jbert.runtime import storage_failures


class CheckpointError(RuntimeError, UserError):
  """A checkpoint could not be written (storage) or does not fit the current run; the user's to fix."""


class StorageFailure(CheckpointError):
  """The storage cannot take checkpoints any more (unreachable, or without object generations): the run stops."""


def absolute(path: str | os.PathLike) -> epath.Path:
  path = epath.Path(path)
  return path if str(path).startswith(("gs://", "s3://")) else epath.Path(os.path.abspath(path))


def check_reachable(workdir: str | os.PathLike) -> None:
  """Raises StorageFailure when the storage of a gs:// `workdir` cannot be reached, before the run reads it.

  Unchecked, every read of the start (the workdir's record, its checkpoints) would wait out the client's retries
  (gcsfs: ~30 s a request, over three minutes in all) and the listings among them, which fail as empty, would
  take the workdir for a fresh one until the lease's write failed. One read tells, after the same retries, so a
  blip of the storage is ridden out. Other failures (a missing bucket, no permission) are left to the writes that
  name them."""
  if not str(workdir).startswith("gs://"):
    return
  try:
    epath.Path(workdir).exists()
  except Exception as e:  # pylint: disable=broad-except  (gcsfs raises aiohttp's errors, not only OSError)
    if not storage_failures.unreachable(e):
      return
    raise StorageFailure(f"cannot read {workdir}: {storage_failures.describe(e, str(workdir))}. Nothing was "
                         "started: rerun the same command once the storage answers, or choose another "
                         "--workdir.") from e


def check_writable(directory: str | os.PathLike) -> epath.Path:
  """Creates `directory` and proves it writable, so a bad path fails before any compilation."""
  directory = absolute(directory)
  try:
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / f".write_probe_{jax.process_index()}"
    probe.write_text("ok")
    probe.unlink()
  except Exception as e:  # pylint: disable=broad-except  (gcsfs raises aiohttp's errors, not only OSError)
    storage = storage_failures.describe(e, str(directory))
    if storage is not None:
      raise CheckpointError(f"cannot write checkpoints to {directory}: {storage}. Nothing was trained.") from e
    if not isinstance(e, OSError):
      raise
    raise CheckpointError(
        f"cannot write checkpoints to {directory}: {e}. Choose a writable --workdir (or free disk space).") from e
  if str(directory).startswith("gs://"):
    _check_generations(directory)
  return directory


def _check_generations(directory: epath.Path) -> None:
  """Orbax's arrays go through tensorstore, whose writes are conditional on each object's generation: a storage
  that answers without generations (gcp-storage-emulator) would fail every save, in Orbax's background threads.
  A write, a read, a write conditional on the generation the read gave and a delete find out before anything is
  trained (gcp-storage-emulator gives generations for uploads, but none for downloads)."""
  import tensorstore as ts  # pylint: disable=g-import-not-at-top
  bucket, _, prefix = str(directory).removeprefix("gs://").partition("/")
  key = f".generation_probe_{jax.process_index()}"
  try:
    store = ts.KvStore.open({"driver": "gcs", "bucket": bucket, "path": prefix.rstrip("/") + "/"}).result()
    store.write(key, b"ok").result()
    store.write(key, b"ok", if_equal=store.read(key).result().stamp.generation).result()
    store.delete_range(ts.KvStore.KeyRange(key, key + "\0")).result()
  except Exception as e:  # pylint: disable=broad-except  (tensorstore raises ValueError for every status)
    storage = storage_failures.describe(e, str(directory))
    raise CheckpointError(f"cannot write checkpoints to {directory}: "
                          f"{storage or integrity.root_message(e)}. Nothing was trained.") from e


@contextlib.contextmanager
def outage_stops(checkpointer, what: str, step: int) -> Iterator[None]:
  """A storage that stops answering while `what` is written stops the run, in one line naming the step a rerun
  resumes from (`checkpointer.resume_point`): the clients already retried (gcsfs ~30 s, google-cloud-storage
  2 min), and every later write would wait as long again while nothing can be kept."""
  try:
    yield
  except StorageFailure:
    raise
  except Exception as e:
    if not storage_failures.unreachable(e):
      raise
    checkpointer.storage_down = True
    raise StorageFailure(
        f"writing {what} at step {step} failed: {storage_failures.describe(e)}. The run stops: rerun the same "
        f"command once the storage answers, and it resumes from {checkpointer.resume_point()}.") from e
