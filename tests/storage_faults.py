"""Read-only and full storage for fault-injection tests, real wherever this machine allows it.

Root ignores permission bits, so as root a directory becomes read-only through a read-only bind mount and a full
disk is a small tmpfs; as another user `chmod a-w` makes it read-only. Where no mount is possible (root without
CAP_SYS_ADMIN, or a full disk as non-root) the failure is simulated one level up: Orbax's `CheckpointManager.save`
raises the OSError the kernel would have raised. `MODE` says which one runs.
"""
from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import subprocess
import tempfile
import time

import orbax.checkpoint as ocp


def _can_mount() -> bool:
  if os.geteuid() != 0:
    return False
  with tempfile.TemporaryDirectory() as probe:
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", probe], capture_output=True).returncode:
      return False
    subprocess.run(["umount", probe], check=True)
  return True


# JBERT_STORAGE_FAULTS=simulated|chmod forces a mode, to exercise the fallbacks on a machine that can mount.
MODE = os.environ.get("JBERT_STORAGE_FAULTS") or (
    "mount" if _can_mount() else ("chmod" if os.geteuid() != 0 else "simulated"))
CAN_MOUNT = MODE == "mount"


def _mount(*args: str) -> None:
  subprocess.run(["mount", *args], check=True, capture_output=True)


@contextlib.contextmanager
def _simulated_failure(code: int):
  real = ocp.CheckpointManager.save
  ocp.CheckpointManager.save = lambda *args, **kwargs: _raise(code)
  try:
    yield
  finally:
    ocp.CheckpointManager.save = real


@contextlib.contextmanager
def read_only(directory: pathlib.Path):
  """`directory` (and everything under it) read-only until the context exits."""
  if MODE == "chmod":
    modes = {p: p.stat().st_mode for p in [directory, *directory.rglob("*")]}
    for p in modes:
      p.chmod(modes[p] & ~0o222)
    try:
      yield
    finally:
      for p, mode in modes.items():
        p.chmod(mode)
  elif MODE == "mount":
    _mount("--bind", str(directory), str(directory))
    deadline = time.monotonic() + 30
    while True:  # A remount is refused while a background write still has a file open.
      try:
        _mount("-o", "remount,ro,bind", str(directory))
        break
      except subprocess.CalledProcessError:
        assert time.monotonic() < deadline, f"{directory} stayed busy"
        time.sleep(0.01)
    try:
      yield
    finally:
      subprocess.run(["umount", str(directory)], check=True)
  else:
    with _simulated_failure(errno.EROFS):
      yield


class FillableDisk:
  """A file system of its own mounted on (empty) `directory`, which `fill()` makes full (free space below one
  checkpoint) and `grow()` gives space again, as a user freeing disk space would."""

  def __init__(self, directory: pathlib.Path):
    self.directory = directory
    self._real_save = None
    if CAN_MOUNT:
      _mount("-t", "tmpfs", "-o", "size=256m", "tmpfs", str(directory))

  def fill(self) -> None:
    if CAN_MOUNT:
      stats = os.statvfs(self.directory)
      used_kb = (stats.f_blocks - stats.f_bfree) * stats.f_frsize // 1024
      _mount("-o", f"remount,size={used_kb + 1024}k", str(self.directory))
      return
    self._real_save = ocp.CheckpointManager.save
    ocp.CheckpointManager.save = lambda *args, **kwargs: _raise(errno.ENOSPC)

  def grow(self) -> None:
    if CAN_MOUNT:
      _mount("-o", "remount,size=256m", str(self.directory))
    elif self._real_save is not None:
      ocp.CheckpointManager.save, self._real_save = self._real_save, None

  def close(self) -> None:
    self.grow()
    if CAN_MOUNT:
      subprocess.run(["umount", str(self.directory)], check=True)


def _raise(code: int):
  raise OSError(code, os.strerror(code))
