"""tpu/*.sh against a fake `gcloud` that records its arguments (tests/fake_gcloud.py): the commands a user's TPU
would receive, their remote commands parsed (`bash -n`) and, where this machine can stand for a worker, run."""
import os
import shlex
import signal
import subprocess
import time

import pytest

import fake_gcloud as fakes
from fake_gcloud import assert_parses
from fake_gcloud import remote_command
from fake_gcloud import run

ROOT = fakes.ROOT


@pytest.fixture
def fake_gcloud(tmp_path):
  return fakes.make(tmp_path)


@pytest.mark.parametrize("accelerator,runtime", [("v4-32", "tpu-ubuntu2204-base"),
                                                 ("v5litepod-16", "v2-alpha-tpuv5-lite"),
                                                 ("v5p-8", "v2-alpha-tpuv5"), ("v6e-8", "v2-alpha-tpuv6e")])
def test_create_picks_the_runtime_of_the_generation(fake_gcloud, accelerator, runtime):
  result, calls = run("create.sh", fake_gcloud, ["--spot"], TPU_NAME="t", ZONE="z", ACCELERATOR=accelerator,
                      PROJECT="p")
  assert result.returncode == 0, result.stderr
  assert calls == [["compute", "tpus", "tpu-vm", "create", "t", "--zone=z", "--project=p",
                    f"--accelerator-type={accelerator}", f"--version={runtime}", "--spot"]]


def test_missing_variables_are_named_before_gcloud_runs(fake_gcloud):
  result, calls = run("create.sh", fake_gcloud, ZONE="z")
  assert result.returncode != 0 and "set TPU_NAME" in result.stderr and calls == []
  result, calls = run("create.sh", fake_gcloud, TPU_NAME="t", ZONE="z", ACCELERATOR="v9-8")
  assert result.returncode == 2 and "no default RUNTIME for ACCELERATOR=v9-8" in result.stderr and calls == []


def test_train_runs_run_py_on_every_worker_with_quoted_flags(fake_gcloud):
  result, calls = run("train.sh", fake_gcloud, ["--config=configs/base.py", "--config.data.source=files",
                                                "--config.data.files=/data/a b/*.txt"],
                      TPU_NAME="t", ZONE="z", WORKDIR="gs://bucket/run1", FOLLOW="0")
  assert result.returncode == 0, result.stderr
  [call] = calls
  assert call[:6] == ["compute", "tpus", "tpu-vm", "ssh", "t", "--zone=z"] and "--worker=all" in call
  assert run_py_flags(remote_command(call)) == [
      "--workdir=gs://bucket/run1", "--compile_cache=gs://bucket/jbert_compile_cache", "--config=configs/base.py",
      "--config.data.source=files", "--config.data.files=/data/a b/*.txt"]


def run_py_flags(command: str) -> list[str]:
  """run.py's flags in train.sh's remote command, as the worker's shell splits them: they reach the bash that
  wraps run.py as its arguments, quoted once."""
  assert_parses(command)
  start = command.index("setsid nohup bash -c")
  line = command[start:command.index("\n", command.index(">> ~/jbert_train.log 2>&1", start))]
  assert line.endswith(">> ~/jbert_train.log 2>&1 < /dev/null &")
  words = shlex.split(line.replace("\\\n", " ").split(">>")[0])
  assert words[:3] == ["setsid", "nohup", "bash"] and words[4].startswith('python run.py "$@" &')
  assert words[5] == "run.py"
  return words[6:]


@pytest.mark.parametrize("env,args,want", [
    ({}, [], ["--compile_cache=gs://bucket/jbert_compile_cache"]),
    ({"COMPILE_CACHE": "off"}, [], ["--compile_cache=off"]),
    ({"COMPILE_CACHE": "gs://other/xla"}, [], ["--compile_cache=gs://other/xla"]),
    ({}, ["--compile_cache=gs://mine/cache"], ["--compile_cache=gs://mine/cache"])])  # the user's own wins
def test_train_shares_one_compile_cache_in_the_bucket(fake_gcloud, env, args, want):
  result, [call] = run("train.sh", fake_gcloud, ["--config=configs/base.py", *args], TPU_NAME="t", ZONE="z",
                       WORKDIR="gs://bucket/deep/run1", FOLLOW="0", **env)
  assert result.returncode == 0, result.stderr
  assert [w for w in run_py_flags(remote_command(call)) if w.startswith("--compile")] == want


FAKE_RUN_PY = """import signal, sys, time
print("fake run.py", *sys.argv[1:], flush=True)
def stop(signum, frame):
  print("SIGTERM: step finished, checkpoint saved", flush=True)
  sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
  time.sleep(0.05)
"""


def test_train_detaches_run_py_which_outlives_the_ssh_session_and_stop_ends_it(fake_gcloud, tmp_path):
  """The worker side run for real (one worker, this machine): train.sh returns while run.py goes on in its own
  session, deaf to the SIGHUP of a dropped connection, logging to ~/jbert_train.log; a second start is refused;
  stop.sh sends SIGTERM (run.py saves and exits) and waits for it."""
  home = tmp_path / "home"
  (home / "jbert").mkdir(parents=True)
  (home / "jbert" / "run.py").write_text(FAKE_RUN_PY)
  (home / "jbert-venv" / "bin").mkdir(parents=True)
  (home / "jbert-venv" / "bin" / "activate").write_text("")
  env = dict(TPU_NAME="t", ZONE="z", WORKDIR="gs://bucket/run1", FOLLOW="0", FAKE_GCLOUD_EXEC="1", HOME=str(home))
  log, pid_file = home / "jbert_train.log", home / "jbert_train.pid"
  start = time.time()
  result, _ = run("train.sh", fake_gcloud, ["--config=configs/base.py"], **env)
  assert result.returncode == 0, result.stderr
  assert time.time() - start < 30 and "started on" in result.stdout
  pid = int(pid_file.read_text())
  try:
    deadline = time.time() + 30
    while "fake run.py" not in log.read_text() and time.time() < deadline:
      time.sleep(0.05)
    assert os.getsid(pid) != os.getsid(0)  # a session of its own: not in the ssh session's process group
    os.kill(pid, signal.SIGHUP)  # what a dropped ssh connection sends
    time.sleep(0.3)
    os.kill(pid, 0)  # still running (raises ProcessLookupError otherwise)
    lines = log.read_text().splitlines()
    flags = "--workdir=gs://bucket/run1 --compile_cache=gs://bucket/jbert_compile_cache --config=configs/base.py"
    assert lines[0].startswith("=== ") and lines[0].endswith(f"python run.py {flags} ")
    assert lines[1] == f"fake run.py {flags}"

    again, _ = run("train.sh", fake_gcloud, ["--config=configs/base.py"], **env)
    assert again.returncode != 0 and "a run is still going on" in again.stderr and f"pid {pid}" in again.stderr
    assert int(pid_file.read_text()) == pid and log.read_text().splitlines() == lines  # the first run untouched

    stopped, calls = run("stop.sh", fake_gcloud, **env)
    assert stopped.returncode == 0, stopped.stderr
    assert f"sent SIGTERM to run.py (pid {pid})" in stopped.stdout and "stopped" in stopped.stdout
    assert "--worker=all" in calls[-1]
    assert log.read_text().splitlines()[-1] == "SIGTERM: step finished, checkpoint saved"
    with pytest.raises(ProcessLookupError):  # stop.sh returned once run.py had exited
      os.kill(pid, 0)
    deadline = time.time() + 10  # the wrapping bash writes run.py's exit status, and the stop's mark is there
    while not (home / "jbert_train.exit").exists() and time.time() < deadline:
      time.sleep(0.05)
    assert (home / "jbert_train.exit").read_text() == "0\n" and (home / "jbert_train.stop_requested").exists()
  finally:
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


def test_logs_follows_worker_0_or_the_one_named(fake_gcloud):
  result, calls = run("logs.sh", fake_gcloud, TPU_NAME="t", ZONE="z", WORKER="3", LINES="200")
  assert result.returncode == 0, result.stderr
  [call] = calls
  assert "--worker=3" in call and "--command=tail -n 200 -F ~/jbert_train.log" in call


@pytest.mark.parametrize("workdir,args,message", [("/tmp/w", ["--config=configs/base.py"], "is not a gs:// path"),
                                                  ("gs://b/w", [], "pass run.py's flags")])
def test_train_refuses_local_workdir_and_missing_flags(fake_gcloud, workdir, args, message):
  result, calls = run("train.sh", fake_gcloud, args, TPU_NAME="t", ZONE="z", WORKDIR=workdir)
  assert result.returncode == 2 and message in result.stderr and calls == []


def test_setup_copies_the_committed_tree_and_installs_the_tpu_extra(fake_gcloud):
  result, calls = run("setup.sh", fake_gcloud, TPU_NAME="t", ZONE="z")
  assert result.returncode == 0, result.stderr
  scp, ssh = calls
  assert scp[:3] == ["compute", "tpus", "tpu-vm"] and scp[3] == "scp" and scp[4].endswith("jbert.tar.gz")
  assert scp[5] == "t:" and "--worker=all" in scp
  command = remote_command(ssh)
  assert_parses(command)
  assert "tar xzf ~/jbert.tar.gz -C ~/jbert" in command and "pip install -q -e ~/jbert'[tpu]'" in command
  assert "$PY -m venv ~/jbert-venv" in command and "for c in python3.12 python3.11; do" in command


def test_setup_probes_the_bucket_from_every_host_when_workdir_is_set(fake_gcloud):
  result, calls = run("setup.sh", fake_gcloud, TPU_NAME="t", ZONE="z", WORKDIR="gs://bucket/run1")
  assert result.returncode == 0, result.stderr
  command = remote_command(calls[1])
  assert_parses(command)
  assert 'if [ -n "gs://bucket/run1" ]' in command and '.setup_probe_' in command and '"gs://bucket/run1"' in command


def test_prepare_runs_on_every_host_with_its_share_from_the_tpu_metadata(fake_gcloud, tmp_path):
  result, calls = run("prepare.sh", fake_gcloud, ["--input=gs://b/wiki/*.parquet", "--output=gs://b/wiki prep",
                                                  "--train_vocab=30522"], TPU_NAME="t", ZONE="z")
  assert result.returncode == 0, result.stderr
  [call] = calls
  assert call[:5] == ["compute", "tpus", "tpu-vm", "ssh", "t"] and "--worker=all" in call
  command = remote_command(call)
  # The remote command, run here against a fake metadata server (curl) and a python that prints its arguments:
  # host 2 of a 4-host slice.
  home, bin_dir = tmp_path / "home", tmp_path / "remote_bin"
  (home / "jbert").mkdir(parents=True)
  (home / "jbert-venv" / "bin").mkdir(parents=True)
  (home / "jbert-venv" / "bin" / "activate").write_text("")
  bin_dir.mkdir()
  endpoints = ",".join(f"a:b:10.0.0.{i}" for i in range(4))
  (bin_dir / "curl").write_text('#!/usr/bin/env bash\ncase "$*" in *agent-worker-number*) echo 2;; '
                                f'*worker-network-endpoints*) echo "{endpoints}";; esac\n')
  (bin_dir / "python").write_text('#!/usr/bin/env bash\nprintf "%s\\n" "$@"\n')
  for name in ("curl", "python"):
    (bin_dir / name).chmod(0o755)
  remote = subprocess.run(["bash", "-c", command], env={"HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=60, check=False)
  assert remote.returncode == 0, remote.stderr
  assert remote.stdout.splitlines() == ["-m", "jbert.data", "prepare", "--input=gs://b/wiki/*.parquet",
                                        "--output=gs://b/wiki prep", "--train_vocab=30522", "--num_hosts=4",
                                        "--host_index=2"]
  assert (home / "jbert_prepare.log").read_text() == remote.stdout


def test_prepare_refuses_an_output_the_hosts_do_not_share(fake_gcloud):
  result, calls = run("prepare.sh", fake_gcloud, ["--input=/data/*.txt", "--output=/tmp/prep"], TPU_NAME="t", ZONE="z")
  assert result.returncode == 2 and "pass --output=gs://BUCKET/PATH (got '/tmp/prep')" in result.stderr
  assert calls == []


def test_a_remote_command_that_does_not_parse_never_reaches_the_hosts(fake_gcloud):
  bin_dir, log = fake_gcloud
  script = f'source {ROOT / "tpu" / "common.sh"}; on_all_workers "if [ -f ~/x ]; then echo unclosed"'
  result = subprocess.run(["bash", "-c", script], env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "TPU_NAME": "t",
                                                       "ZONE": "z"}, capture_output=True, text=True, check=False)
  assert result.returncode == 70 and "the remote command does not parse" in result.stderr
  assert fakes.calls(log) == []
