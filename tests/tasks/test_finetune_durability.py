"""Fine-tuning has pretraining's durability, through the command a user reruns (run.py with configs/finetune.py's
defaults, `model.scan_layers` unset): kill -9 and the same command, or SIGTERM and the `resume with:` command it
prints, give bit-identical losses; rerunning a finished run says so and changes no file; a raised total_steps
trains on. 2 processes × 4 devices train like 1 process on 1 device. (Evaluation sharded over 8 devices is in
test_sharding.py, whose child pytest has 8.)"""
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys

import numpy as np
import pytest

from jbert import distributed
from tests.test_resume import wait_for
from tests.test_workdir_record import hashes
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


def run(args) -> subprocess.CompletedProcess:
  done = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  return done


def metrics(workdir):
  return json.loads((pathlib.Path(workdir) / "results.json").read_text())["metrics"]


def complete(workdir, step) -> str:
  return (f"run.py: already complete at step {step} ({workdir}); raise --config.total_steps to train further, or "
          "pass another --workdir.\n")


def test_kill_9_then_same_command_resumes_bit_identically_then_says_complete_and_extends(tmp_path, reference):
  proc = subprocess.Popen([sys.executable, *flags(tmp_path, reference)], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  wait_for(tmp_path / "checkpoints" / "8", proc)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL
  resumed = run(flags(tmp_path, reference))
  assert f"; written in {tmp_path}: results.json, export/ (the model), predictions/validation.tsv\n" in resumed.stderr
  # Exact float equality at every step, before and after the kill, with the reference made in-process.
  assert trained.losses(tmp_path) == reference.losses
  assert metrics(tmp_path) == metrics(reference.workdir)

  before = hashes(tmp_path)
  again = run(flags(tmp_path, reference))  # the same command once more: nothing left to do
  assert again.stdout == complete(tmp_path, trained.CLASSIFIER_STEPS)
  assert hashes(tmp_path) == before

  total = trained.CLASSIFIER_STEPS + 4
  run(flags(tmp_path, reference, total_steps=total))
  losses = trained.losses(tmp_path)
  assert {s: losses[s] for s in reference.losses} == reference.losses and sorted(losses) == list(range(1, total + 1))
  assert json.loads((tmp_path / "results.json").read_text())["step"] == total
  last = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()][-1]
  assert (last["event"], last["step"]) == ("resume", trained.CLASSIFIER_STEPS)
  assert {c["key"]: (c["old"], c["new"]) for c in last["changes"]} == {
      "total_steps": (trained.CLASSIFIER_STEPS, total), "optim.warmup_steps": (2, 3)}  # 10% of total_steps


def mnrl_flags(workdir, mnrl):
  """run.py with configs/finetune.py:mnrl and the shared run's keys; `model.scan_layers` left to the default."""
  settings = {k: v for k, v in mnrl.settings.items() if k != "model.scan_layers"}
  return ["run.py", "--config=configs/finetune.py:mnrl", f"--workdir={workdir}",
          *(f"--config.{k}={v}" for k, v in settings.items())]


def test_bi_encoder_sigterm_then_the_printed_resume_command_resumes_bit_identically(tmp_path, tmp_path_factory):
  mnrl = trained.mnrl(tmp_path_factory)
  proc = subprocess.Popen([sys.executable, *mnrl_flags(tmp_path, mnrl)], cwd=REPO, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  lines = []
  for line in proc.stderr:  # the first step is done: SIGTERM lands mid-run
    lines.append(line)
    if " step 1 done in " in line:
      proc.send_signal(signal.SIGTERM)
      break
  err = "".join(lines) + proc.communicate(timeout=300)[1]
  assert proc.returncode == 0, err[-3000:]
  stopped = re.search(r"stopped at step (\d+) after SIGTERM; resume with: (.*)$", err, re.M)
  assert stopped, err[-3000:]
  step, command = int(stopped.group(1)), shlex.split(stopped.group(2))
  assert 1 <= step < trained.MNRL_STEPS and (tmp_path / "checkpoints" / str(step)).is_dir()
  assert not (tmp_path / "results.json").exists()
  assert command == ["python", *mnrl_flags(tmp_path, mnrl)]
  resumed = run(command[1:])  # what the user pastes, with this interpreter as `python`
  assert f"; written in {tmp_path}: results.json, export/ (the model)\n" in resumed.stderr  # no predictions/
  assert trained.losses(tmp_path) == mnrl.losses
  assert metrics(tmp_path) == metrics(mnrl.workdir)
  before = hashes(tmp_path)
  assert run(command[1:]).stdout == complete(tmp_path, trained.MNRL_STEPS)
  assert hashes(tmp_path) == before


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
