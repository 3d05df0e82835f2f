"""Multi-host on one machine: 2 processes × 4 CPU devices train like 1 process on 1 device, and checkpoints
written by either restore in the other (same data shards, so even the data stream continues exactly), with packed
rows (the default) of several sequences each.

One chain of three runs: 1 process trains steps 1-12; 2 processes resume its step 4 and train 5-12; 1 process
resumes their step 8 and trains 9-12. Every step after a restore matches the uninterrupted run. (Two processes
starting from scratch are tested by fine-tuning, tests/tasks/test_finetune_durability.py.)
"""
import json
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np

from jbert import distributed
import device_children

REPO = pathlib.Path(__file__).resolve().parents[1]
TOTAL = 12


def flags(workdir):
  return ["run.py", "--config=configs/tiny.py", f"--workdir={workdir}", "--config.batch_size=8",
          f"--config.total_steps={TOTAL}", "--config.log_every_steps=1", "--config.checkpoint_every_steps=4",
          "--config.eval_every_steps=0", "--config.data.num_shards=2"]  # 64-token rows: several sequences each


def run_single(workdir):
  # One device, as the suite has: the 2 × 4 run then also restores across device counts (8 <-> 1).
  env = dict(os.environ, XLA_FLAGS=device_children.xla_flags(1))
  subprocess.run([sys.executable, *flags(workdir)], cwd=REPO, env=env, check=True, capture_output=True, timeout=600)


def run_two_processes(workdir, log_dir):
  cwd = os.getcwd()
  os.chdir(REPO)
  try:
    procs = distributed.launch_local(flags(workdir), num_processes=2, devices_per_process=4, log_dir=str(log_dir))
    codes = [p.wait(timeout=600) for p in procs]
  finally:
    os.chdir(cwd)
  logs = "\n".join(p.read_text()[-3000:] for p in sorted(pathlib.Path(log_dir).glob("*.log")))
  assert codes == [0, 0], logs


def losses(workdir):
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return {l["step"]: l["train/loss"] for l in map(json.loads, lines) if "train/loss" in l}


def resumable_at(workdir, step, copy):
  """A copy of `workdir` whose newest checkpoint is `step`, as a run killed after saving it leaves it."""
  shutil.copytree(workdir, copy)
  for path in (copy / "checkpoints").iterdir():
    if path.name.isdigit() and int(path.name) > step:
      shutil.rmtree(path)
  return copy


def test_two_processes_match_one_and_checkpoints_cross_restore(tmp_path):
  one = tmp_path / "one"
  run_single(one)
  a = losses(one)
  assert sorted(a) == list(range(1, TOTAL + 1))
  # Packed rows (the default): a few percent padding where one sequence a row leaves ~27%.
  padding = [l["train/padding_fraction"] for l in map(json.loads, (one / "metrics.jsonl").read_text().splitlines())
             if "train/padding_fraction" in l]
  assert 0 < max(padding) < 0.12
  assert sorted(p.name for p in (one / "checkpoints").iterdir() if p.name.isdigit()) == ["12", "4", "8"]

  # A checkpoint written by 1 process resumes in 2, which train on as 1 process does.
  two = resumable_at(one, 4, tmp_path / "two")
  run_two_processes(two, tmp_path)
  b = losses(two)
  assert sorted(b) == list(range(1, TOTAL + 1))
  assert [b[s] for s in range(1, 5)] == [a[s] for s in range(1, 5)]  # the restored run's own lines, kept
  np.testing.assert_allclose([b[s] for s in range(5, TOTAL + 1)], [a[s] for s in range(5, TOTAL + 1)], atol=1e-5)
  assert b[5] != a[4]  # training went on past the restored step
  # One progress line per logged step, from process 0 with the global figures; process 1 prints none.
  logs = {p.name: p.read_text() for p in pathlib.Path(tmp_path).glob("process_*.log")}
  assert logs["process_0.log"].count(f"step {TOTAL}/{TOTAL} |") == 1
  assert f"step {TOTAL}/{TOTAL} |" not in logs["process_1.log"] and f"step 4/{TOTAL} |" not in logs["process_0.log"]

  # A checkpoint written by 2 processes resumes in 1.
  back = resumable_at(two, 8, tmp_path / "back")
  run_single(back)
  c = losses(back)
  assert sorted(c) == list(range(1, TOTAL + 1))
  assert [c[s] for s in range(1, 9)] == [b[s] for s in range(1, 9)]
  np.testing.assert_allclose([c[s] for s in range(9, TOTAL + 1)], [a[s] for s in range(9, TOTAL + 1)], atol=1e-5)
