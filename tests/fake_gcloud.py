"""A fake `gcloud` for the tpu/*.sh tests: it records every call's arguments, answers `describe` from a scripted
queue, and (FAKE_GCLOUD_EXEC=1) runs an ssh call's --command here, as one worker of the slice would, and a
`delete` ends that worker's run as a deleted VM would."""
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]

# One file per call, its arguments NUL-separated (an ssh command spans lines). A `describe` prints the first line
# of $FAKE_ANSWERS (dropped once read, the last one kept): NOT_FOUND fails as gcloud does for a missing resource.
# The verb FAKE_GCLOUD_FAILS names (create, ...) fails as gcloud does when the zone has no capacity.
_SCRIPT = r'''#!/usr/bin/env bash
printf "%s\0" "$@" > LOG/$(ls LOG | wc -l)
if [[ -n "${FAKE_ANSWERS:-}" ]] && printf '%s\n' "$@" | grep -qx describe; then
  answer="$(head -n 1 "$FAKE_ANSWERS")"
  if [[ $(wc -l < "$FAKE_ANSWERS") -gt 1 ]]; then sed -i 1d "$FAKE_ANSWERS"; fi
  if [[ "$answer" == NOT_FOUND ]]; then echo "ERROR: (gcloud) NOT_FOUND: Resource not found" >&2; exit 1; fi
  echo "$answer"
  exit 0
fi
if [[ "$4" == "${FAKE_GCLOUD_FAILS:-}" ]]; then
  echo "ERROR: (gcloud.compute.tpus.tpu-vm.$4) There is no more capacity in the zone" >&2
  exit 1
fi
if [[ "${FAKE_GCLOUD_EXEC:-0}" == 1 && "$4" == delete && -f ~/jbert_train.pid ]]; then
  # The slice goes with its processes (train.sh's session: run.py and the bash waiting for it) and its disk.
  pgid="$(ps -o pgid= -p "$(cat ~/jbert_train.pid)" | tr -d ' ')"
  if [[ -n "$pgid" ]]; then kill -9 -- "-$pgid"; fi
  rm -f ~/jbert_train.pid ~/jbert_train.exit
fi
if [[ "${FAKE_GCLOUD_EXEC:-0}" == 1 && "$4" == ssh ]]; then
  for a in "$@"; do [[ "$a" == --command=* ]] && exec bash -c "${a#--command=}"; done
fi
'''


def make(tmp_path: pathlib.Path):
  """(the folder holding `gcloud` and the workers' `python`, the folder of recorded calls)."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  log = tmp_path / "calls"
  log.mkdir()
  script = bin_dir / "gcloud"
  script.write_text(_SCRIPT.replace("LOG", str(log)))
  script.chmod(0o755)
  (bin_dir / "python").symlink_to(sys.executable)  # the worker's venv python
  return bin_dir, log


def run(script, fake_gcloud, args=(), answers=(), scripts=ROOT / "tpu", timeout=60, **env):
  """(the finished `bash tpu/SCRIPT ARGS`, the gcloud calls it made); `answers` queue the describes' replies."""
  bin_dir, log = fake_gcloud
  full_env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/tmp"), **env}
  if answers:
    queue = log.parent / "answers"
    queue.write_text("".join(f"{a}\n" for a in answers))
    full_env["FAKE_ANSWERS"] = str(queue)
  result = subprocess.run(["bash", str(pathlib.Path(scripts) / script), *args], env=full_env, capture_output=True,
                          text=True, timeout=timeout, check=False)
  return result, calls(log)


def calls(log: pathlib.Path) -> list[list[str]]:
  return [(log / name).read_text().split("\0")[:-1] for name in sorted(os.listdir(log), key=int)]


def remote_command(call: list[str]) -> str:
  """The --command of an ssh call."""
  return next(a for a in call if a.startswith("--command="))[len("--command="):]


def assert_parses(command: str) -> None:
  """`bash -n`: the remote command as every host's shell will read it."""
  check = subprocess.run(["bash", "-n"], input=command, capture_output=True, text=True, check=False)
  assert check.returncode == 0, (check.stderr, command)


def worker_home(tmp_path: pathlib.Path, run_py: str) -> pathlib.Path:
  """A worker's home as tpu/setup.sh leaves it: ~/jbert with `run_py` as run.py, an (empty) venv to activate."""
  home = tmp_path / "home"
  (home / "jbert").mkdir(parents=True)
  (home / "jbert" / "run.py").write_text(run_py)
  (home / "jbert-venv" / "bin").mkdir(parents=True)
  (home / "jbert-venv" / "bin" / "activate").write_text("")
  return home
