"""gs:// in an install without TensorFlow, against a GCS emulator (tests/gcs_emulator.py): run.py trains,
checkpoints, is killed and resumes in the bucket; the emulator setting reaches every storage client; a missing
package is one line."""
import json
import re
import signal
import subprocess
import sys
import time

import pytest

import gcs_emulator
from jbert.runtime import storage
from test_resume import REPO, TOTAL, command, losses, reference_losses


def bucket_losses(gcs, workdir):
  records = [json.loads(line) for line in gcs.read(f"{workdir}/metrics.jsonl").decode().splitlines()]
  steps = [r["step"] for r in records if "train/loss" in r]
  assert steps == sorted(set(steps)), "a step was logged twice"
  return {r["step"]: r["train/loss"] for r in records if "train/loss" in r}


def committed_steps(gcs, workdir):
  return sorted(int(name.split("/")[0]) for name in gcs.objects(f"{workdir}/checkpoints")
                if re.fullmatch(r"\d+/commit_success\.txt", name))


def test_tensorflow_is_hidden_from_the_commands(gcs):
  probe = "import importlib.util, sys; print(importlib.util.find_spec('tensorflow')); import tensorflow"
  result = subprocess.run([sys.executable, "-c", probe], env=gcs.environ(hide_tensorflow=True), capture_output=True,
                          text=True, timeout=60)
  assert result.returncode == 1 and result.stdout == "None\n" and "ModuleNotFoundError" in result.stderr


def test_run_py_on_a_bucket_trains_is_killed_and_resumes_there_without_tensorflow(gcs, tmp_path_factory):
  """The README's gs:// command, TensorFlow absent: every file of the run is in the bucket (checkpoints through
  tensorstore, the rest through gcsfs, TensorBoard through google-cloud-storage, the compile cache too); kill -9
  after a checkpoint, and the same command restores that step and logs the uninterrupted run's losses."""
  reference = reference_losses(tmp_path_factory)
  workdir = f"gs://{gcs.create_bucket()}/run"
  cmd = [*command(workdir), f"--compile_cache=gs://{workdir.split('/')[2]}/xla"]
  env = gcs.environ(hide_tensorflow=True, JBERT_TRACEBACK="1")
  proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  start = time.time()
  while not committed_steps(gcs, workdir):
    assert proc.poll() is None, f"the run ended before its first checkpoint: {proc.stderr.read()[-3000:]}"
    assert time.time() - start < 300, "no checkpoint reached the bucket"
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL
  proc.stderr.close()
  killed_at = committed_steps(gcs, workdir)[-1]
  assert 4 <= killed_at < TOTAL

  resumed = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0, resumed.stderr[-3000:]
  restored = re.search(r"state: resumed from checkpoint step (\d+)", resumed.stderr)
  assert restored and int(restored.group(1)) == killed_at, resumed.stderr[-3000:]
  assert bucket_losses(gcs, workdir) == reference
  # The first run compiled into the bucket; the resumed one loaded its programs from there.
  compiled = re.search(r"\((\d+) XLA programs? in [\d.]+ s, (\d+) of them from the compile cache\)", resumed.stderr)
  assert compiled and compiled.group(1) == compiled.group(2), resumed.stderr[-3000:]
  files = gcs.objects(workdir)
  assert {"config.json", "history.jsonl", "metrics.jsonl", ".jbert.lock", "tokenizer/vocab.txt"} <= set(files)
  assert committed_steps(gcs, workdir)[-1] == TOTAL
  assert any(name.startswith("tensorboard/events.out.tfevents") and size > 0 for name, size in files.items())
  history = [json.loads(line) for line in gcs.read(f"{workdir}/history.jsonl").decode().splitlines()]
  assert [(h["event"], h["step"]) for h in history] == [("start", 0), ("resume", int(restored.group(1)))]
  assert json.loads(gcs.read(f"{workdir}/.jbert.lock"))["released"]
