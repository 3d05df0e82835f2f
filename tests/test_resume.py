"""Exact resume: a run killed at any point (kill -9, or SIGTERM as on TPU preemption) and started again with the
same command logs bit-identical losses to an uninterrupted run."""
import json
import pathlib
import random
import re
import shlex
import signal
import subprocess
import sys
import time

import pytest

import shared_runs

REPO = pathlib.Path(__file__).resolve().parents[1]
TOTAL = 40


def command(workdir):
  return [sys.executable, "run.py", "--config=configs/tiny.py", f"--workdir={workdir}",
          "--config.batch_size=8", f"--config.total_steps={TOTAL}", "--config.log_every_steps=1",
          "--config.checkpoint_every_steps=4", "--config.eval_every_steps=0",
          "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5"]


def losses(workdir):
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return {l["step"]: l["train/loss"] for l in map(json.loads, lines) if "train/loss" in l}


def wait_for(path, proc, timeout=240):
  start = time.time()
  while not path.exists():
    assert proc.poll() is None, "the run ended before it could be interrupted"
    assert time.time() - start < timeout, f"{path} never appeared"
    time.sleep(0.02)


def reference_losses(tmp_path_factory) -> dict[int, float]:
  """The losses of an uninterrupted `command` run, made once per test run (also for tests/test_storage.py)."""
  def build(workdir):
    subprocess.run(command(workdir), cwd=REPO, check=True, capture_output=True, timeout=600)
    return losses(workdir)
  result = shared_runs.once(tmp_path_factory, "resume_reference", build)  # once per run, not per xdist worker
  assert sorted(result) == list(range(1, TOTAL + 1))
  return result


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  return reference_losses(tmp_path_factory)


@pytest.mark.parametrize("first", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl_c"])
def test_sigterm_or_ctrl_c_saves_exits_cleanly_and_resumes_bit_identically(tmp_path, reference, first, interactive):
  proc = subprocess.Popen(command(tmp_path), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
  wait_for(tmp_path / "checkpoints" / "4", proc)
  proc.send_signal(first)
  name = "SIGTERM" if first == signal.SIGTERM else "Ctrl-C"
  # The second notice waits until the first is taken: sent together, the two can reach the process on two threads
  # and be taken in either order, and the stop would name the other one.
  lines = []
  for line in proc.stderr:
    lines.append(line)
    if f"{name}: finishing the current step" in line:
      break
  proc.send_signal(signal.SIGTERM)  # a second notice (a repeated SIGTERM) must not corrupt anything
  err = "".join(lines) + proc.communicate(timeout=240)[1]
  assert proc.returncode == 0, err[-2000:]
  stopped = max(losses(tmp_path))
  assert f"stopped at step {stopped} after {name}; resume with: {shlex.join(['python', *command(tmp_path)[1:]])}" in err
  assert stopped < TOTAL
  assert (tmp_path / "checkpoints" / str(stopped)).exists()  # saved exactly where it stopped
  resumed = subprocess.run(command(tmp_path), cwd=REPO, check=True, capture_output=True, text=True, timeout=600)
  assert losses(tmp_path) == reference
  # Its train step is the stopped run's: loaded from the compile cache, not compiled again.
  compiled = re.search(r"step \d+ done in [\d.]+ s \((\d+) XLA programs? in [\d.]+ s, (\d+) of them from the "
                       r"compile cache\)", resumed.stderr)
  assert compiled and compiled.group(1) == compiled.group(2), resumed.stderr[-3000:]


def test_kill_9_at_a_random_point_of_an_async_save_then_same_command_resumes_bit_identically(tmp_path, reference):
  """The kill lands while Orbax writes step 8 or 12 in the background: that step is never listed, and is redone."""
  seed = random.randrange(1000)
  delay = random.Random(seed).uniform(0, 0.3)
  proc = subprocess.Popen(command(tmp_path), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  checkpoints = tmp_path / "checkpoints"
  start = time.time()
  while not (checkpoints.exists() and any(p.name.startswith(("8.orbax-checkpoint-tmp", "12.orbax-checkpoint-tmp"))
                                          for p in checkpoints.iterdir())):
    assert proc.poll() is None and time.time() - start < 240, "no save of step 8 or 12 was seen in progress"
    time.sleep(0.005)
  time.sleep(delay)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL
  complete = sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit())
  assert 4 <= complete[-1] <= 12, f"seed {seed}: {complete}"
  subprocess.run(command(tmp_path), cwd=REPO, check=True, capture_output=True, timeout=600)
  assert losses(tmp_path) == reference, f"seed {seed}: killed {delay:.3f} s into a save"
