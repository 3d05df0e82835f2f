"""One writer per workdir: a second run started on a workdir in use refuses at once, naming the holder.

Local (and NFS) workdirs: an exclusive `flock` on `WORKDIR/.jbert.lock`, held for the run's life. The kernel drops
it when the process dies, however it dies (kill -9, OOM, a preempted VM), so a stale lock never blocks a resume;
the file only records who holds it (host, pid, start time) for the refusal message, and is never deleted (deleting
a lock file lets two runs lock two different files).

Object stores (`gs://`) have no locks. There the file is a lease that the holder renews every minute from a
background thread: a run that finds a lease renewed in the last `STALE_AFTER_S` seconds by another live run logs
a warning naming it, then takes the lease. It is a warning, not a refusal, because a lease cannot be taken
atomically (two runs starting within a second both see none) and a refusal would block the restart of a
preempted run until its lease expires. Only process 0 of a multi-process run takes the lock; the others share
its run.
"""
from __future__ import annotations

import datetime
import fcntl
import json
import logging
import os
import socket
import threading
import time
from typing import Any

from jbert.errors import UserError
from jbert.runtime import storage_failures

log = logging.getLogger("jbert")

LOCK_FILE = ".jbert.lock"
RENEW_EVERY_S = 60
STALE_AFTER_S = 3 * RENEW_EVERY_S


class WorkdirBusyError(RuntimeError, UserError):
  """Another live run holds the workdir (a user error: run.py reports it in one line)."""


class UnwritableWorkdirError(OSError):
  """The workdir or its lock file cannot be created; its text is the message alone, without "[Errno N]"."""

  def __str__(self) -> str:
    return str(self.strerror)


def _holder() -> dict[str, Any]:
  return {"host": socket.gethostname(), "pid": os.getpid(),
          "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def _describe(info: dict[str, Any] | str | None) -> str:
  """The holder for a refusal message; `info` is its record, None for an empty file, or why it is unreadable."""
  if not info:
    return "an unknown run (its lock file is empty)"
  if isinstance(info, str):
    return f"an unknown run (its lock file {info})"
  return f"pid {info.get('pid')} on host {info.get('host')}, started {info.get('started')}"


def _is_remote(workdir: str) -> bool:
  return "://" in workdir


class WorkdirLock:
  """Held from construction until `release()` (idempotent). Use `acquire(workdir)`."""

  # Locks this process holds, by lock path: a run that ended with an exception before releasing leaves its lock
  # to the garbage collector, and the next run of the same process on that workdir takes it over.
  _held: dict[str, "WorkdirLock"] = {}

  def __init__(self, workdir: str, *, remote: bool | None = None):
    self.remote = _is_remote(workdir) if remote is None else remote
    self.workdir = workdir if _is_remote(workdir) else os.path.abspath(workdir)
    self.path = f"{self.workdir.rstrip('/')}/{LOCK_FILE}"
    self.info = _holder()
    self._fd: int | None = None
    self._stop = threading.Event()
    self._renewer: threading.Thread | None = None
    previous = WorkdirLock._held.pop(self.path, None)
    if previous is not None:
      previous.release()
    if self.remote:
      self._take_lease()
    else:
      self._flock()
    WorkdirLock._held[self.path] = self

  # -- local: flock ------------------------------------------------------------------------------------------

  def _flock(self) -> None:
    try:
      os.makedirs(self.workdir, exist_ok=True)
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
      raise UnwritableWorkdirError(e.errno, f"cannot create {self.path} ({e.strerror}); choose a writable "
                                   "--workdir.") from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      holder = _read_fd(fd)
      os.close(fd)
      raise WorkdirBusyError(
          f"{self.workdir} is in use by another run: {_describe(holder)} (it holds {self.path}). Two runs on one "
          "workdir overwrite each other's checkpoints and metrics: wait for it to finish, stop it, or use "
          "another --workdir.") from None
    except OSError as e:
      os.close(fd)
      raise WorkdirBusyError(f"cannot lock {self.path}: {e}. The file system must support flock "
                             "(local disks and NFS do).") from e
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(self.info).encode(), 0)
    os.fsync(fd)
    self._fd = fd

  # -- object stores: a renewed lease --------------------------------------------------------------------------

  def _take_lease(self) -> None:
    from etils import epath  # pylint: disable=g-import-not-at-top
    path = epath.Path(self.path)
    try:
      other = json.loads(path.read_text()) if path.exists() else None
    except Exception as e:  # pylint: disable=broad-except  (unreadable, or the storage down: the write says which)
      if not isinstance(e, (OSError, ValueError)) and storage_failures.kind(e) is None:
        raise
      other = None
    if other and not other.get("released") and time.time() - other.get("renewed", 0) < STALE_AFTER_S:
      log.warning("%s was renewed %.0f s ago by another run (%s): two runs on one workdir overwrite each other's "
                  "checkpoints. Stop one of them unless that run is dead. Object stores have no locks; this is "
                  "only a lease check.", self.path, time.time() - other["renewed"], _describe(other))
    try:
      path.parent.mkdir(parents=True, exist_ok=True)
      self._write_lease()
    except Exception as e:  # gcsfs names only the URL it was refused (a missing bucket: FileNotFoundError(url))
      storage = storage_failures.describe(e, self.path)
      if not isinstance(e, OSError) and storage is None:
        raise
      bucket = self.path.split("://", 1)[-1].split("/", 1)[0]
      if storage is not None and storage_failures.kind(e) == storage_failures.NO_BUCKET:
        raise OSError(f"cannot write {self.path}: {storage}, or choose another --workdir.") from e
      if storage is not None:
        raise OSError(f"cannot write {self.path}: {storage}. Nothing was started: rerun the same command once the "
                      "storage answers, or choose another --workdir.") from e
      raise OSError(f"cannot write {self.path} ({type(e).__name__}: {' '.join(str(e).split())[:200]}): check that "
                    f"the bucket {bucket} exists and that this machine may write it (gsutil ls gs://{bucket}), or "
                    "choose another --workdir.") from e
    self._renewer = threading.Thread(target=self._renew, name="jbert_workdir_lease", daemon=True)
    self._renewer.start()

  def _write_lease(self, released: bool = False) -> None:
    from etils import epath  # pylint: disable=g-import-not-at-top
    epath.Path(self.path).write_text(json.dumps({**self.info, "renewed": time.time(), "released": released}))

  def _renew(self) -> None:
    while not self._stop.wait(RENEW_EVERY_S):
      try:
        self._write_lease()
      except Exception as e:  # pylint: disable=broad-except  (a transient storage error must not kill the run,
        # and whatever else went wrong only weakens a warning; the next renewal retries)
        reason = storage_failures.describe(e, self.path) or " ".join(str(e).split())[:300] or type(e).__name__
        log.warning("renewing the lease %s failed: %s; the next renewal tries again.", self.path, reason)

  # -- both ------------------------------------------------------------------------------------------------

  def release(self, *, write: bool = True) -> None:
    """Gives the workdir up. `write=False` leaves a lease as it is and does not wait for a renewal under way (a
    storage that cannot be reached would make either wait out the client's retries; the renewer is a daemon
    thread, and the next run takes over the lease with a warning)."""
    if WorkdirLock._held.get(self.path) is self:
      del WorkdirLock._held[self.path]
    if self._fd is not None:
      fd, self._fd = self._fd, None
      os.ftruncate(fd, 0)
      fcntl.flock(fd, fcntl.LOCK_UN)
      os.close(fd)
    if self._renewer is not None:
      self._stop.set()
      if not write:
        self._renewer = None
        return
      self._renewer.join()
      self._renewer = None
      try:
        self._write_lease(released=True)
      except Exception as e:  # pylint: disable=broad-except  (the run is over; the next one takes the lease over)
        reason = storage_failures.describe(e, self.path) or " ".join(str(e).split())[:300] or type(e).__name__
        log.warning("releasing the lease %s failed: %s", self.path, reason)

  def __enter__(self) -> "WorkdirLock":
    return self

  def __exit__(self, *exc) -> None:
    self.release()


class _Shared:
  """What processes other than 0 hold: nothing (process 0's lock covers the whole run)."""

  def release(self, *, write: bool = True) -> None:  # pylint: disable=unused-argument
    pass

  def __enter__(self) -> "_Shared":
    return self

  def __exit__(self, *exc) -> None:
    pass


def acquire(workdir: str, process_index: int = 0) -> WorkdirLock | _Shared:
  """The workdir's lock for this run; raises `WorkdirBusyError` naming the holder if another live run has it."""
  if process_index != 0:
    return _Shared()
  return WorkdirLock(workdir)


def _read_fd(fd: int) -> dict[str, Any] | str | None:
  """The holder's record; None when the file is empty; a phrase saying why it is unreadable otherwise."""
  try:
    data = os.pread(fd, 4096, 0)
  except OSError as e:
    return f"cannot be read: {e.strerror}"
  if not data.strip():
    return None
  try:
    info = json.loads(data.decode())
  except ValueError:
    info = None
  if not isinstance(info, dict):
    return f"holds {len(data)}{'+' if len(data) == 4096 else ''} bytes that are not a jbert run record"
  return info
