"""tpu/run.sh (training to the end through preemptions) and the slice's life around it: queued resources
(tpu/create.sh QUEUED=1), tpu/delete.sh, tpu/bucket.sh, ssh flags, DRY_RUN, tpu/setup.sh's dirty-tree notice and
its Python fallback; against the fake gcloud of tests/fake_gcloud.py, the workers' side run on this machine."""
import os
import shlex
import shutil
import subprocess

import pytest

import fake_gcloud as fakes
from fake_gcloud import assert_parses
from fake_gcloud import remote_command
from fake_gcloud import run

ENV = dict(TPU_NAME="t", ZONE="us-central2-b", ACCELERATOR="v4-8", WORKDIR="gs://bucket/run1", POLL_S="0.05",
           REVISION="0123456789abcdef")

# run.py on a worker: its Nth start exits with the Nth status of FAKE_RUN_PLAN (the last one repeated).
FAKE_RUN_PY = """import os, pathlib, sys, time
starts = pathlib.Path(os.environ["HOME"]) / "starts"
n = int(starts.read_text()) + 1 if starts.exists() else 1
starts.write_text(str(n))
plan = os.environ["FAKE_RUN_PLAN"].split(",")
code = plan[min(n, len(plan)) - 1]
print(f"fake run.py start {n}:", *sys.argv[1:], flush=True)
while code == "train":  # until the slice goes
  time.sleep(0.05)
code = int(code)
if code == 2:
  print("run.py: --config.optim.learning_rate=-1: pass a positive number", file=sys.stderr, flush=True)
sys.exit(code)
"""


@pytest.fixture
def fake_gcloud(tmp_path):
  return fakes.make(tmp_path)


@pytest.fixture
def slice_scripts(tmp_path):
  """tpu/ copied, its setup.sh replaced by one that records its calls (the real one is tested on its own, in
  tests/test_tpu_scripts.py): run.sh drives the rest as they are."""
  scripts = tmp_path / "repo" / "tpu"
  shutil.copytree(fakes.ROOT / "tpu", scripts)
  (scripts / "setup.sh").write_text('#!/usr/bin/env bash\necho "setup REVISION=$REVISION" >> "$HOME/setups"\n')
  return scripts


def verbs(calls):
  """Each gcloud call as `group verb` (tpu-vm create, queued-resources describe, ...)."""
  return [" ".join(c[2:4]) if c[:2] == ["compute", "tpus"] else " ".join(c[:3]) for c in calls]


def test_run_recreates_a_preempted_slice_and_restarts_a_failed_run_until_it_finishes(fake_gcloud, slice_scripts,
                                                                                      tmp_path):
  home = fakes.worker_home(tmp_path, FAKE_RUN_PY)
  result, calls = run("run.sh", fake_gcloud, ["--config=configs/base.py"], answers=["PREEMPTED", "READY"],
                      scripts=slice_scripts, HOME=str(home), FAKE_GCLOUD_EXEC="1", FAKE_RUN_PLAN="1,0",
                      CREATE_FLAGS="--spot", **ENV)
  assert result.returncode == 0, result.stdout + result.stderr
  # The preempted slice deleted and created again (with the flags it was made with), set up once, at the commit
  # run.sh started from; run.py started twice: it failed, then finished.
  assert ["compute", "tpus", "tpu-vm", "delete", "t", "--zone=us-central2-b", "--quiet"] in calls
  assert ["compute", "tpus", "tpu-vm", "create", "t", "--zone=us-central2-b", "--accelerator-type=v4-8",
          "--version=tpu-ubuntu2204-base", "--spot"] in calls
  v = verbs(calls)
  assert v.index("tpu-vm describe") < v.index("tpu-vm delete") < v.index("tpu-vm create") < v.index("tpu-vm ssh")
  assert (home / "setups").read_text() == "setup REVISION=0123456789abcdef\n"
  log = (home / "jbert_train.log").read_text().splitlines()
  assert [l.split(":")[0] for l in log if l.startswith("fake run.py")] == ["fake run.py start 1",
                                                                           "fake run.py start 2"]
  assert sum(l.startswith("=== ") for l in log) == 2 and (home / "jbert_train.exit").read_text() == "0\n"
  out = result.stdout
  assert "t is PREEMPTED: deleting it and creating it again." in out
  assert "run.py failed with exit status 1." in out and "(attempt 2 of 10)" in out
  assert "run.py finished on t after 2 start(s)" in out
  for call in calls:
    if call[3:4] == ["ssh"]:
      assert_parses(remote_command(call))


def test_run_recovers_a_slice_preempted_while_training(fake_gcloud, slice_scripts, tmp_path):
  home = fakes.worker_home(tmp_path, FAKE_RUN_PY)
  result, calls = run("run.sh", fake_gcloud, ["--config=configs/base.py"],
                      answers=["READY", "READY", "PREEMPTED", "PREEMPTED", "READY"], scripts=slice_scripts,
                      HOME=str(home), FAKE_GCLOUD_EXEC="1", FAKE_RUN_PLAN="train,0", **ENV)
  assert result.returncode == 0, result.stdout + result.stderr
  out = result.stdout
  assert "t is PREEMPTED during the run." in out and "t is PREEMPTED: deleting it and creating it again." in out
  assert "run.py finished on t after 2 start(s)" in out
  assert (home / "starts").read_text() == "2" and (home / "setups").read_text().count("setup") == 2
  assert [c[3] for c in calls if c[3] in ("create", "delete")] == ["delete", "create"]


def test_run_gives_up_after_max_attempts(fake_gcloud, slice_scripts, tmp_path):
  home = fakes.worker_home(tmp_path, FAKE_RUN_PY)
  result, _ = run("run.sh", fake_gcloud, ["--config=configs/base.py"], answers=["READY"], scripts=slice_scripts,
                  HOME=str(home), FAKE_GCLOUD_EXEC="1", FAKE_RUN_PLAN="137", MAX_ATTEMPTS="2", **ENV)
  assert result.returncode == 1
  assert ("gave up after 2 starts of run.py (MAX_ATTEMPTS=2); the last ended: run.py failed with exit status 137"
          in result.stderr)
  assert (home / "starts").read_text() == "2"


def test_run_retries_a_failed_creation_a_bounded_number_of_times(fake_gcloud, slice_scripts, tmp_path):
  home = fakes.worker_home(tmp_path, FAKE_RUN_PY)
  result, calls = run("run.sh", fake_gcloud, ["--config=configs/base.py"], answers=["NOT_FOUND"],
                      scripts=slice_scripts, HOME=str(home), FAKE_RUN_PLAN="0", FAKE_GCLOUD_FAILS="create",
                      MAX_ATTEMPTS="3", **ENV)
  assert result.returncode == 1
  assert [c[3] for c in calls if c[3] == "create"] == ["create"] * 3
  assert "tpu/create.sh failed (1 of 3); trying again in 0.05 s." in result.stdout
  assert "tpu/create.sh failed 3 times in a row (see above); giving up." in result.stderr
  assert "There is no more capacity in the zone" in result.stderr and not (home / "starts").exists()


def test_run_refuses_a_stopped_vm(fake_gcloud, slice_scripts, tmp_path):
  result, calls = run("run.sh", fake_gcloud, ["--config=configs/base.py"], answers=["STOPPED"],
                      scripts=slice_scripts, **ENV)
  assert result.returncode == 1 and "t is STOPPED (gcloud compute tpus tpu-vm stop): start it again" in result.stderr
  assert verbs(calls) == ["tpu-vm describe"]


def test_run_stops_at_a_refused_command_instead_of_retrying_it(fake_gcloud, slice_scripts, tmp_path):
  home = fakes.worker_home(tmp_path, FAKE_RUN_PY)
  result, _ = run("run.sh", fake_gcloud, ["--config=configs/base.py"], answers=["READY"], scripts=slice_scripts,
                  HOME=str(home), FAKE_GCLOUD_EXEC="1", FAKE_RUN_PLAN="2", **ENV)
  assert result.returncode == 2 and (home / "starts").read_text() == "1"
  assert "run.py: --config.optim.learning_rate=-1: pass a positive number" in result.stdout  # the log's end
  assert "a restart would fail the same way" in result.stderr


def test_run_follows_a_run_already_going_and_ends_when_stop_asks(fake_gcloud, slice_scripts, tmp_path):
  """A run.sh started again (its laptop closed) adopts the run instead of starting a second one; tpu/stop.sh's
  SIGTERM ends the loop rather than a restart."""
  home = fakes.worker_home(tmp_path, "import signal, sys, time\n"
                                     "signal.signal(signal.SIGTERM, lambda *a: (print('stopped at step 7'), "
                                     "sys.exit(0)))\nprint('training', flush=True)\nwhile True: time.sleep(0.05)\n")
  env = dict(HOME=str(home), FAKE_GCLOUD_EXEC="1", **ENV)
  started, _ = run("train.sh", fake_gcloud, ["--config=configs/base.py"], FOLLOW="0", **env)
  assert started.returncode == 0, started.stderr
  pid = int((home / "jbert_train.pid").read_text())
  answers = tmp_path / "answers"
  answers.write_text("READY\n")
  try:
    follower = subprocess.Popen(["bash", str(slice_scripts / "run.sh"), "--config=configs/base.py"],
                                env={"PATH": f"{fake_gcloud[0]}:{os.environ['PATH']}", "SETUP": "0",
                                     "FAKE_ANSWERS": str(answers), **env},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = follower.stdout.readline()  # stopped once it follows: a stop from before run.sh is not a reason to end
    assert "a run is already going on t: following it (attempt 1 of 10)." in first, first
    stopped, _ = run("stop.sh", fake_gcloud, timeout=30, **env)
    assert stopped.returncode == 0, stopped.stderr
    try:
      out, err = follower.communicate(timeout=60)
    except subprocess.TimeoutExpired as e:
      pytest.fail(f"run.sh did not end after the stop: {e.stdout!r} {e.stderr!r}")
  finally:
    if follower.poll() is None:
      follower.kill()
    for started in {pid, int((home / "jbert_train.pid").read_text())}:  # and any run a failing run.sh started
      try:
        os.killpg(os.getpgid(started), 9)
      except ProcessLookupError:
        pass
  assert follower.returncode == 0, out + err
  assert "run.py stopped as tpu/stop.sh asked (exit status " in out and "rerun tpu/run.sh" in out
  assert (home / "jbert_train.log").read_text().count("=== ") == 1  # never started a second time


def test_run_dry_run_prints_a_first_attempt_and_calls_nothing(fake_gcloud, tmp_path):
  result, calls = run("run.sh", fake_gcloud, ["--config=configs/base.py", "--config.data.files=/a b/*.txt"],
                      DRY_RUN="1", QUEUED="1", CREATE_FLAGS="--spot --valid-until-duration=6h",
                      SSH_FLAGS="--tunnel-through-iap", **{k: v for k, v in ENV.items() if k != "REVISION"})
  assert result.returncode == 0, result.stderr
  assert calls == []
  out = result.stdout
  assert ("DRY_RUN: gcloud compute tpus queued-resources create t --node-id=t --zone=us-central2-b "
          "--accelerator-type=v4-8 --runtime-version=tpu-ubuntu2204-base --spot --valid-until-duration=6h") in out
  assert "DRY_RUN: gcloud compute tpus tpu-vm scp " in out
  assert ("tpu-vm ssh t --zone=us-central2-b --tunnel-through-iap --worker=all --command=\"$REMOTE\"" in out)
  # Every remote command printed parses as the hosts' shell will read it.
  blocks, block = [], None
  for line in out.splitlines():
    if line == "REMOTE:":
      block = []
      blocks.append(block)
    elif block is not None and line.startswith("    "):
      block.append(line[4:])
    else:
      block = None
  assert len(blocks) == 2 and "pip install -q -e ~/jbert'[tpu]'" in "\n".join(blocks[0])
  for lines in blocks:
    assert_parses("\n".join(lines))
  flags = next(l for l in blocks[1] if l.lstrip().startswith("--workdir="))
  assert shlex.split(flags.split(">>")[0]) == ["--workdir=gs://bucket/run1",
                                               "--compile_cache=gs://bucket/jbert_compile_cache",
                                               "--config=configs/base.py", "--config.data.files=/a b/*.txt"]
  assert "DRY_RUN: nothing done; done, it would say: installed commit" in out


@pytest.mark.parametrize("answers,code,message", [
    (["WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"], 0, "created t (v5p-8, v2-alpha-tpuv5)"),
    (["WAITING_FOR_RESOURCES", "FAILED"], 1, "the queued resource t is FAILED")])
def test_create_queues_a_resource_and_waits_for_it(fake_gcloud, answers, code, message):
  result, calls = run("create.sh", fake_gcloud, ["--spot", "--valid-until-duration=6h"], answers=answers,
                      TPU_NAME="t", ZONE="us-east5-b", ACCELERATOR="v5p-8", QUEUED="1", POLL_S="0", PROJECT="p")
  assert result.returncode == code and message in result.stdout + result.stderr
  assert calls[0] == ["compute", "tpus", "queued-resources", "create", "t", "--node-id=t", "--zone=us-east5-b",
                      "--project=p", "--accelerator-type=v5p-8", "--runtime-version=v2-alpha-tpuv5", "--spot",
                      "--valid-until-duration=6h"]
  assert calls[1:] == [["compute", "tpus", "queued-resources", "describe", "t", "--format=value(state.state)",
                        "--zone=us-east5-b", "--project=p"]] * len(answers)
  states = [l.split(": ")[-1] for l in result.stdout.splitlines() if "queued resource t:" in l]
  assert states == answers


def test_delete_stops_the_run_first_then_deletes(fake_gcloud):
  result, calls = run("delete.sh", fake_gcloud, answers=["READY"], TPU_NAME="t", ZONE="z")
  assert result.returncode == 0, result.stderr
  assert verbs(calls) == ["tpu-vm describe", "tpu-vm ssh", "tpu-vm delete"]
  command = remote_command(calls[1])
  assert_parses(command)
  assert "--worker=all" in calls[1] and "kill -TERM" in command and "touch ~/jbert_train.stop_requested" in command
  assert calls[2] == ["compute", "tpus", "tpu-vm", "delete", "t", "--zone=z", "--quiet"]


@pytest.mark.parametrize("env,answers,want", [
    ({"QUEUED": "1"}, ["SUSPENDED"], [["compute", "tpus", "queued-resources", "delete", "t", "--zone=z", "--force",
                                       "--quiet"]]),
    ({}, ["NOT_FOUND"], []),  # nothing to delete: said, status 0
    ({"FORCE": "1"}, [], [["compute", "tpus", "tpu-vm", "delete", "t", "--zone=z", "--quiet"]])])
def test_delete_without_a_run_to_stop(fake_gcloud, env, answers, want):
  result, calls = run("delete.sh", fake_gcloud, answers=answers, TPU_NAME="t", ZONE="z", **env)
  assert result.returncode == 0, result.stderr
  assert [c for c in calls if "delete" in c] == want and not [c for c in calls if "ssh" in c]
  if not want:
    assert "there is no TPU VM t in z; nothing to delete." in result.stdout


def test_delete_keeps_the_slice_when_its_run_cannot_be_stopped(fake_gcloud, tmp_path):
  (fake_gcloud[0] / "gcloud").write_text((fake_gcloud[0] / "gcloud").read_text().replace(
      "if [[ \"${FAKE_GCLOUD_EXEC", "if [[ \"$4\" == ssh ]]; then echo 'ssh: connect to host: timed out' >&2; exit 255;"
      " fi\nif [[ \"${FAKE_GCLOUD_EXEC"))
  result, calls = run("delete.sh", fake_gcloud, answers=["READY"], TPU_NAME="t", ZONE="z")
  assert result.returncode == 1 and "nothing was deleted; FORCE=1 tpu/delete.sh deletes it anyway" in result.stderr
  assert not [c for c in calls if "delete" in c]


def test_ssh_flags_reach_every_ssh_and_scp(fake_gcloud):
  for script in ("setup.sh", "logs.sh", "stop.sh"):
    result, calls = run(script, fake_gcloud, TPU_NAME="t", ZONE="z",
                        SSH_FLAGS="--internal-ip --strict-host-key-checking=no")
    assert result.returncode == 0, result.stderr
  assert [c[3] for c in calls] == ["scp", "ssh", "ssh", "ssh"]  # setup's two, logs', stop's
  assert all("--internal-ip" in c and "--strict-host-key-checking=no" in c for c in calls)
  # A gcloud whose GA tpu-vm ssh lacks --tunnel-through-iap: its alpha track has it.
  result, calls = run("logs.sh", fake_gcloud, TPU_NAME="t", ZONE="z", SSH_FLAGS="--tunnel-through-iap",
                      GCLOUD_TRACK="alpha")
  assert result.returncode == 0, result.stderr
  assert calls[-1][:5] == ["alpha", "compute", "tpus", "tpu-vm", "ssh"] and "--tunnel-through-iap" in calls[-1]


def test_bucket_is_created_in_the_region_and_the_vm_account_may_write_it(fake_gcloud):
  result, calls = run("bucket.sh", fake_gcloud, answers=["NOT_FOUND", "123-compute@developer.gserviceaccount.com"],
                      TPU_NAME="t", ZONE="us-central2-b", BUCKET="gs://my-bucket/some/run", PROJECT="p")
  assert result.returncode == 0, result.stderr
  assert calls == [
      ["storage", "buckets", "describe", "gs://my-bucket", "--project=p", "--format=value(name)"],
      ["storage", "buckets", "create", "gs://my-bucket", "--project=p", "--location=us-central2",
       "--uniform-bucket-level-access"],
      ["compute", "tpus", "tpu-vm", "describe", "t", "--zone=us-central2-b", "--project=p",
       "--format=value(serviceAccount.email)"],
      ["storage", "buckets", "add-iam-policy-binding", "gs://my-bucket", "--project=p",
       "--member=serviceAccount:123-compute@developer.gserviceaccount.com", "--role=roles/storage.objectAdmin"]]
  assert "123-compute@developer.gserviceaccount.com may write gs://my-bucket" in result.stdout
  # An existing bucket is left as it is; only the grant is made.
  result, calls = run("bucket.sh", fake_gcloud, answers=["gs://my-bucket", "sa@p.iam.gserviceaccount.com"],
                      TPU_NAME="t", ZONE="us-central2-b", BUCKET="gs://my-bucket")
  assert result.returncode == 0 and "gs://my-bucket exists" in result.stdout
  assert not [c for c in calls[4:] if "create" in c]


def test_setup_names_what_a_dirty_checkout_leaves_behind(fake_gcloud, tmp_path):
  repo = tmp_path / "repo"
  shutil.copytree(fakes.ROOT / "tpu", repo / "tpu")
  (repo / "configs").mkdir()
  (repo / "configs" / "base.py").write_text("batch = 256\n")
  git = ["git", "-C", str(repo), "-c", "user.email=t@t", "-c", "user.name=t"]
  subprocess.run([*git, "init", "-q"], check=True)
  subprocess.run([*git, "add", "."], check=True)
  subprocess.run([*git, "commit", "-qm", "c"], check=True)
  result, _ = run("setup.sh", fake_gcloud, scripts=repo / "tpu", TPU_NAME="t", ZONE="z")
  assert result.returncode == 0 and "uncommitted" not in result.stderr
  (repo / "configs" / "base.py").write_text("batch = 512\n")
  (repo / "configs" / "mine.py").write_text("")
  result, calls = run("setup.sh", fake_gcloud, scripts=repo / "tpu", TPU_NAME="t", ZONE="z")
  assert result.returncode == 0
  commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
  assert (f"the checkout has 2 uncommitted change(s), which the hosts will not get (only commit {commit} is "
          "copied): configs/base.py, configs/mine.py; commit them first") in result.stderr
  assert f"installed commit {commit}" in result.stdout


HOST_PYTHON = "python() { echo host 0 sees 4 TPU; }"


def _python_finder(tmp_path, setup_command, have=(), apt_has=(), ppa_has=(), venv_python=HOST_PYTHON):
  """Runs setup.sh's remote command on a fake host whose PATH holds only the pythons in `have` (each reporting
  its version) and an apt that installs those in `apt_has` (or `ppa_has`, once the deadsnakes PPA is added);
  the venv's python is the shell function `venv_python`.
  Returns (the finished command, the apt/sudo calls it made)."""
  home, bin_dir = tmp_path / "fakehost", tmp_path / "fakehost_bin"
  home.mkdir()
  bin_dir.mkdir()
  calls = tmp_path / "apt_calls"
  for tool in ("bash", "rm", "mkdir", "tar", "gzip", "cat", "grep", "tail", "sed", "hostname", "head", "touch", "cp",
               "ln"):
    (bin_dir / tool).symlink_to(shutil.which(tool))

  def python(path, new_enough):  # answers the version check; `-m venv DIR` makes a venv whose pip does nothing
    path.write_text(f'#!/bin/bash\nif [ "$1" = -c ]; then exit {0 if new_enough else 1}; fi\n'
                    'if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"; ln -sf /bin/true "$3/bin/python"\n'
                    f'  cat > "$3/bin/activate" <<\'EOF\'\npip() {{ :; }}; {venv_python}\nEOF\nfi\n')
    path.chmod(0o755)

  for name in have:
    python(bin_dir / name, name >= "python3.11")
  python(tmp_path / "installed_python", True)  # what apt installs
  (bin_dir / "sudo").write_text('#!/bin/bash\n"$@"\n')
  ppa = tmp_path / "ppa_added"
  (bin_dir / "add-apt-repository").write_text(f'#!/bin/bash\necho "add-apt-repository $*" >> {calls}\ntouch {ppa}\n')
  (bin_dir / "apt-get").write_text(
      f'#!/bin/bash\necho "apt-get $*" >> {calls}\n[ "$1" = install ] || exit 0\n'
      'for p in "$@"; do case "$p" in python3.*-venv|-*|install|software-properties-common) ;; *)\n'
      f'  if [[ " {" ".join(apt_has)} " == *" $p "* ]] ||'
      f' {{ [ -f {ppa} ] && [[ " {" ".join(ppa_has)} " == *" $p "* ]]; }};'
      f' then cp {tmp_path}/installed_python "{bin_dir}/$p"; else echo "E: Unable to locate package $p" >&2; exit 100;'
      ' fi;;\nesac; done\n')
  for tool in ("sudo", "add-apt-repository", "apt-get"):
    (bin_dir / tool).chmod(0o755)
  subprocess.run(["tar", "czf", str(home / "jbert.tar.gz"), "-C", str(tmp_path), "fakehost_bin"], check=True)
  finished = subprocess.run([str(bin_dir / "bash"), "-c", setup_command], env={"HOME": str(home), "PATH": str(bin_dir)},
                            capture_output=True, text=True, timeout=60, check=False)
  return finished, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("have,apt_has,ppa_has,code,want_apt", [
    (("python3.10", "python3.12"), (), (), 0, []),  # the image's 3.12: nothing installed
    (("python3.10",), ("python3.11",), (), 0, ["apt-get install -y -qq python3.11 python3.11-venv"]),
    (("python3.10",), (), ("python3.11",), 0, ["add-apt-repository -y ppa:deadsnakes/ppa"]),
    (("python3.10",), (), (), 4, ["add-apt-repository -y ppa:deadsnakes/ppa"])])
def test_setup_finds_or_installs_a_python_of_3_11_or_later(fake_gcloud, tmp_path, have, apt_has, ppa_has, code,
                                                           want_apt):
  result, calls = run("setup.sh", fake_gcloud, TPU_NAME="t", ZONE="z")
  assert result.returncode == 0, result.stderr
  finished, apt = _python_finder(tmp_path, remote_command(calls[1]), have, apt_has, ppa_has)
  assert finished.returncode == code, finished.stdout + finished.stderr
  assert all(any(w in line for line in apt) for w in want_apt), apt
  if not want_apt:
    assert apt == []
  if code:
    assert finished.stderr.strip().splitlines()[-1] == (
        "tpu/setup.sh: " + subprocess.run(["hostname"], capture_output=True, text=True).stdout.strip()
        + " has no Python >= 3.11 and apt could not install python3.11; install one there and set PYTHON=its name"
        " (jax needs >= 3.11).")


def test_setup_names_a_host_that_cannot_write_the_bucket(fake_gcloud, tmp_path):
  """The bucket probe, refused as GCS refuses a service account without write access: one line naming the host,
  the bucket, the refusal and the fix; exit status 5."""
  result, calls = run("setup.sh", fake_gcloud, TPU_NAME="t", ZONE="z", WORKDIR="gs://bucket/run1")
  assert result.returncode == 0, result.stderr
  refusal = ("google.api_core.exceptions.Forbidden: 403 t-sa@p.iam.gserviceaccount.com does not have "
             "storage.objects.create access to the Google Cloud Storage object.")
  refusing = ('python() { case "$*" in *setup_probe*) echo "Traceback (most recent call last):" >&2; '
              f'echo "{refusal}" >&2; return 1;; *) echo host 0 sees 4 TPU;; esac; }}')
  finished, _ = _python_finder(tmp_path, remote_command(calls[1]), have=("python3.12",), venv_python=refusing)
  host = subprocess.run(["hostname"], capture_output=True, text=True, check=True).stdout.strip()
  assert finished.returncode == 5
  assert finished.stderr.strip().splitlines() == [
      f"tpu/setup.sh: {host} cannot write gs://bucket/run1 ({refusal}); let the TPU VM's service account write the"
      " bucket: BUCKET=gs://... tpu/bucket.sh"]
