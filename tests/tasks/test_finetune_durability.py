"""Fine-tuning has pretraining's durability: kill -9 and the same command give bit-identical losses, and 2
processes × 4 devices train like 1 process on 1 device. (Evaluation sharded over 8 devices is in test_sharding.py,
whose child pytest has 8.)"""
import json
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

from jbert import distributed
from tests.test_resume import wait_for
import trained

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The uninterrupted run (in this process, with the suite's one device: the 2 × 4 process run below then also
  matches across device counts), which the prediction tests use too."""
  run = trained.classifier(tmp_path_factory)
  assert sorted(run.losses) == list(range(1, trained.CLASSIFIER_STEPS + 1))
  return run


def flags(workdir, reference, **more):
  return ["run.py", "--config=configs/finetune.py:local", f"--workdir={workdir}",
          *(f"--config.{k}={v}" for k, v in reference.settings(**more).items())]


def run(args):
  subprocess.run([sys.executable, *args], cwd=REPO, check=True, capture_output=True, timeout=600)


def test_kill_9_then_same_command_resumes_bit_identically(tmp_path, reference):
  proc = subprocess.Popen([sys.executable, *flags(tmp_path, reference)], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  wait_for(tmp_path / "checkpoints" / "8", proc)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL
  run(flags(tmp_path, reference))
  # Exact float equality at every step, before and after the kill, with the reference made in-process.
  assert trained.losses(tmp_path) == reference.losses
  assert json.loads((tmp_path / "results.json").read_text())["metrics"] == json.loads(
      (reference.workdir / "results.json").read_text())["metrics"]


def test_two_processes_train_like_one(tmp_path, reference):
  (tmp_path / "logs").mkdir()
  cwd = os.getcwd()
  os.chdir(REPO)
  try:
    procs = distributed.launch_local(flags(tmp_path / "run", reference), num_processes=2, devices_per_process=4,
                                     log_dir=str(tmp_path / "logs"))
    codes = [p.wait(timeout=600) for p in procs]
  finally:
    os.chdir(cwd)
  logs = "\n".join(p.read_text()[-3000:] for p in sorted((tmp_path / "logs").glob("*.log")))
  assert codes == [0, 0], logs
  two, one = trained.losses(tmp_path / "run"), reference.losses
  assert sorted(two) == sorted(one)
  np.testing.assert_allclose([two[s] for s in sorted(one)], [one[s] for s in sorted(one)], atol=1e-5)
  results = json.loads((tmp_path / "run" / "results.json").read_text())["metrics"]["validation"]["accuracy"]
  assert results == json.loads((reference.workdir / "results.json").read_text())["metrics"]["validation"]["accuracy"]
