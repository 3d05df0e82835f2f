"""Multi-host on one machine: 2 processes × 4 CPU devices train like 1 process on 1 device, and checkpoints
written by either restore in the other (same data shards, so even the data stream continues exactly), with packed
rows (the default) of several sequences each: BERT pretraining (configs/tiny.py) and ELECTRA's
(configs/electra.py:tiny, whose generator samples its replacements from the step's key, so every logged metric,
accuracies and replaced-token precision and recall included, has to match).

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
import pytest

from jbert import distributed
import device_children

REPO = pathlib.Path(__file__).resolve().parents[1]
TOTAL = 12
# float32 summed in another order over 8 devices than over 1: 1e-5 absolute, or 1e-6 of ELECTRA's loss, ~40 at
# λ = 50, whose discriminator part differed by 2.7e-5.
TOL = dict(atol=1e-5, rtol=1e-6)
# config: the train/ metrics every step logs that the runs must agree on.
CONFIGS = {
    "configs/tiny.py": ("train/loss",),
    "configs/electra.py:tiny": ("train/loss", "train/generator_mlm_loss", "train/discriminator_loss",
                                "train/generator_mlm_accuracy", "train/discriminator_accuracy",
                                "train/replaced_precision", "train/replaced_recall"),
}


def flags(config, workdir):
  return ["run.py", f"--config={config}", f"--workdir={workdir}", "--config.batch_size=8",
          f"--config.total_steps={TOTAL}", "--config.log_every_steps=1", "--config.checkpoint_every_steps=4",
          "--config.eval_every_steps=0", "--config.data.num_shards=2"]  # 64-token rows: several sequences each


def run_single(config, workdir):
  # One device, as the suite has: the 2 × 4 run then also restores across device counts (8 <-> 1).
  env = dict(os.environ, XLA_FLAGS=device_children.xla_flags(1))
  subprocess.run([sys.executable, *flags(config, workdir)], cwd=REPO, env=env, check=True, capture_output=True,
                 timeout=600)


def run_two_processes(config, workdir, log_dir):
  cwd = os.getcwd()
  os.chdir(REPO)
  try:
    procs = distributed.launch_local(flags(config, workdir), num_processes=2, devices_per_process=4,
                                     log_dir=str(log_dir))
    codes = [p.wait(timeout=600) for p in procs]
  finally:
    os.chdir(cwd)
  logs = "\n".join(p.read_text()[-3000:] for p in sorted(pathlib.Path(log_dir).glob("*.log")))
  assert codes == [0, 0], logs


def logged(workdir, keys):
  """{step: [value of each key]} of the steps metrics.jsonl logs training metrics for."""
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return {l["step"]: [l[k] for k in keys] for l in map(json.loads, lines) if "train/loss" in l}


def resumable_at(workdir, step, copy):
  """A copy of `workdir` whose newest checkpoint is `step`, as a run killed after saving it leaves it."""
  shutil.copytree(workdir, copy)
  for path in (copy / "checkpoints").iterdir():
    if path.name.isdigit() and int(path.name) > step:
      shutil.rmtree(path)
  return copy


@pytest.mark.parametrize("config", list(CONFIGS))
def test_two_processes_match_one_and_checkpoints_cross_restore(tmp_path, config):
  keys = CONFIGS[config]
  one = tmp_path / "one"
  run_single(config, one)
  a = logged(one, keys)
  assert sorted(a) == list(range(1, TOTAL + 1))
  assert all(np.isfinite(a[s]).all() for s in a)
  # Packed rows (the default): a few percent padding where one sequence a row leaves ~27%.
  padding = [l["train/padding_fraction"] for l in map(json.loads, (one / "metrics.jsonl").read_text().splitlines())
             if "train/padding_fraction" in l]
  assert 0 < max(padding) < 0.12
  assert sorted(p.name for p in (one / "checkpoints").iterdir() if p.name.isdigit()) == ["12", "4", "8"]

  # A checkpoint written by 1 process resumes in 2, which train on as 1 process does.
  two = resumable_at(one, 4, tmp_path / "two")
  run_two_processes(config, two, tmp_path)
  b = logged(two, keys)
  assert sorted(b) == list(range(1, TOTAL + 1))
  assert [b[s] for s in range(1, 5)] == [a[s] for s in range(1, 5)]  # the restored run's own lines, kept
  np.testing.assert_allclose([b[s] for s in range(5, TOTAL + 1)], [a[s] for s in range(5, TOTAL + 1)], **TOL)
  assert b[5][0] != a[4][0]  # training went on past the restored step
  # One progress line per logged step, from process 0 with the global figures; process 1 prints none.
  logs = {p.name: p.read_text() for p in pathlib.Path(tmp_path).glob("process_*.log")}
  assert logs["process_0.log"].count(f"step {TOTAL}/{TOTAL} |") == 1
  assert f"step {TOTAL}/{TOTAL} |" not in logs["process_1.log"] and f"step 4/{TOTAL} |" not in logs["process_0.log"]

  # A checkpoint written by 2 processes resumes in 1.
  back = resumable_at(two, 8, tmp_path / "back")
  run_single(config, back)
  c = logged(back, keys)
  assert sorted(c) == list(range(1, TOTAL + 1))
  assert [c[s] for s in range(1, 9)] == [b[s] for s in range(1, 9)]
  np.testing.assert_allclose([c[s] for s in range(9, TOTAL + 1)], [a[s] for s in range(9, TOTAL + 1)], **TOL)
