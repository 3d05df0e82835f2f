"""jbert.runtime.processes.alive: running, exited and zombie processes."""
import os
import subprocess
import sys

from jbert.runtime import processes


def test_running_exited_and_zombie_processes():
  assert processes.alive(os.getpid())
  child = subprocess.Popen([sys.executable, "-c", "pass"])
  os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped: a zombie
  assert not processes.alive(child.pid)
  child.wait()
  assert not processes.alive(child.pid)  # reaped: no such process
