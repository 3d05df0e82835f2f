"""Multi-host on one machine: 2 processes × 4 CPU devices train like 1 process on 1 device, and checkpoints
written by either restore in the other (same data shards, so even the data stream continues exactly)."""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np

from jbert import distributed

REPO = pathlib.Path(__file__).resolve().parents[1]


def flags(workdir, total_steps):
  return ["run.py", "--config=configs/tiny.py", f"--workdir={workdir}", "--config.batch_size=8",
          f"--config.total_steps={total_steps}", "--config.log_every_steps=1", "--config.checkpoint_every_steps=4",
          "--config.eval_every_steps=0", "--config.data.num_shards=2", "--config.data.max_seq_length=32",
          "--config.data.max_predictions_per_seq=5"]


def run_single(workdir, total_steps):
  # One device, as the suite has: the 2 × 4 run then also restores across device counts (8 <-> 1).
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1")
  subprocess.run([sys.executable, *flags(workdir, total_steps)], cwd=REPO, env=env, check=True,
                 capture_output=True, timeout=600)


def run_two_processes(workdir, total_steps, log_dir):
  cwd = os.getcwd()
  os.chdir(REPO)
  try:
    procs = distributed.launch_local(flags(workdir, total_steps), num_processes=2, devices_per_process=4,
                                     log_dir=str(log_dir))
    codes = [p.wait(timeout=600) for p in procs]
  finally:
    os.chdir(cwd)
  logs = "\n".join(p.read_text()[-3000:] for p in sorted(pathlib.Path(log_dir).glob("*.log")))
  assert codes == [0, 0], logs


def losses(workdir):
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return {l["step"]: l["train/loss"] for l in map(json.loads, lines) if "train/loss" in l}


def test_two_processes_match_one_and_checkpoints_cross_restore(tmp_path):
  one, two = tmp_path / "one", tmp_path / "two"
  run_single(one, 8)
  run_two_processes(two, 8, tmp_path)
  a, b = losses(one), losses(two)
  assert sorted(a) == sorted(b) == list(range(1, 9))
  np.testing.assert_allclose([b[s] for s in range(1, 9)], [a[s] for s in range(1, 9)], atol=1e-5)
  # One progress line per logged step, from process 0 with the global figures; process 1 prints none.
  logs = {p.name: p.read_text() for p in pathlib.Path(tmp_path).glob("process_*.log")}
  assert logs["process_0.log"].count("step 8/8 |") == 1 and "step 8/8 |" not in logs["process_1.log"]

  # A checkpoint written by 2 processes resumes in 1, and one written by 1 process resumes in 2.
  shutil.copytree(two, tmp_path / "two_then_one")
  shutil.copytree(one, tmp_path / "one_then_two")
  run_single(tmp_path / "two_then_one", 12)
  run_two_processes(tmp_path / "one_then_two", 12, tmp_path)
  c, d = losses(tmp_path / "two_then_one"), losses(tmp_path / "one_then_two")
  assert sorted(c) == sorted(d) == list(range(1, 13))
  np.testing.assert_allclose([d[s] for s in range(9, 13)], [c[s] for s in range(9, 13)], atol=1e-5)
  assert c[9] != a[8]  # training went on past the restored step
