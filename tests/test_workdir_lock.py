"""One writer per workdir: a live holder is named and refused at once; a dead one (kill -9) never blocks."""
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from jbert.checkpoint import lock as workdir_lock

# Loads the module by path: the holder starts in a fraction of a second, without JAX.
HOLD = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("workdir_lock", sys.argv[1])
module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)
lock = module.acquire(sys.argv[2])
print("held", flush=True)
time.sleep(600)
"""


def hold_in_subprocess(workdir):
  proc = subprocess.Popen([sys.executable, "-c", HOLD, workdir_lock.__file__, str(workdir)], stdout=subprocess.PIPE,
                          text=True)
  assert proc.stdout.readline().strip() == "held"
  return proc


def test_a_live_holder_is_refused_at_once_by_name_and_a_killed_one_never_blocks(tmp_path):
  holder = hold_in_subprocess(tmp_path)
  try:
    start = time.monotonic()
    with pytest.raises(workdir_lock.WorkdirBusyError) as refused:
      workdir_lock.acquire(str(tmp_path))
    assert time.monotonic() - start < 1
    info = json.loads((tmp_path / ".jbert.lock").read_text())
    assert info["pid"] == holder.pid and info["host"] == socket.gethostname()
    assert (f"{tmp_path} is in use by another run: pid {holder.pid} on host {socket.gethostname()}, started "
            f"{info['started']}") in str(refused.value)
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  # The kernel dropped the dead process's lock; its file (with the dead holder's details) stays and is reused.
  with workdir_lock.acquire(str(tmp_path)) as lock:
    assert json.loads((tmp_path / ".jbert.lock").read_text())["pid"] == os.getpid()
    assert lock.path == str(tmp_path / ".jbert.lock")


def test_released_locks_and_locks_left_by_this_process_are_taken_again(tmp_path):
  first = workdir_lock.acquire(str(tmp_path))
  first.release()
  first.release()  # idempotent
  second = workdir_lock.acquire(str(tmp_path))
  # A run of this process that ended in an exception left `second` unreleased: the next run takes it over.
  third = workdir_lock.acquire(str(tmp_path))
  assert second._fd is None and third._fd is not None  # pylint: disable=protected-access
  holder_attempt = subprocess.run([sys.executable, "-c", HOLD, workdir_lock.__file__, str(tmp_path)],
                                  capture_output=True, text=True, timeout=60)
  assert "WorkdirBusyError" in holder_attempt.stderr and f"pid {os.getpid()}" in holder_attempt.stderr
  third.release()


def test_processes_other_than_0_share_the_run_of_process_0(tmp_path):
  with workdir_lock.acquire(str(tmp_path)):
    with workdir_lock.acquire(str(tmp_path), process_index=1):
      assert not (tmp_path / "other").exists()


def test_object_store_lease_warns_about_a_fresh_one_and_not_about_a_stale_or_released_one(tmp_path, caplog):
  # gs:// has no flock: the same code runs on a local path with remote=True.
  other = {"host": "tpu-vm-7", "pid": 4242, "started": "2025-01-01T00:00:00+00:00", "released": False}
  lease = tmp_path / ".jbert.lock"
  cases = [(time.time() - 5, False, True), (time.time() - workdir_lock.STALE_AFTER_S - 5, False, False),
           (time.time() - 5, True, False)]
  for renewed, released, warned in cases:
    lease.write_text(json.dumps({**other, "renewed": renewed, "released": released}))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="jbert"):
      lock = workdir_lock.WorkdirLock(str(tmp_path), remote=True)
    mine = json.loads(lease.read_text())
    assert mine["pid"] == os.getpid() and not mine["released"]
    assert ("another run (pid 4242 on host tpu-vm-7" in caplog.text) == warned
    lock.release()
    assert json.loads(lease.read_text())["released"]


@pytest.mark.parametrize("content, holder", [
    (b"", "an unknown run (its lock file is empty)"),
    (b"\x00\x01garbage", "an unknown run (its lock file holds 9 bytes that are not a jbert run record)"),
    (b"[1, 2]", "an unknown run (its lock file holds 6 bytes that are not a jbert run record)"),
])
def test_a_holder_whose_lock_file_is_empty_or_garbage_is_described_as_such(tmp_path, content, holder):
  lock_file = tmp_path / workdir_lock.LOCK_FILE
  lock_file.write_bytes(content)
  hold = ("import fcntl, os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\n"
          "print('held', flush=True)\ntime.sleep(600)\n")
  proc = subprocess.Popen([sys.executable, "-c", hold, str(lock_file)], stdout=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().strip() == "held"
    with pytest.raises(workdir_lock.WorkdirBusyError) as refused:
      workdir_lock.acquire(str(tmp_path))
  finally:
    proc.kill()
    proc.wait()
  assert str(refused.value).startswith(f"{tmp_path} is in use by another run: {holder} (it holds {lock_file}).")
  assert lock_file.read_bytes() == content  # a refused run leaves the holder's file as it was
