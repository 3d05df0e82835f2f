"""`run.py` past its flags: every mistake a user can make (a value out of range, a missing or non-text data file, a
label or column the files lack, a busy workdir, a non-finite step, a full disk) is one line on stderr and exit
status 2, leaving the files as they were; JBERT_TRACEBACK=1 and bugs keep the traceback. Called in-process through
`run.execute`, what `main` runs once the flags parse."""
import contextlib
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

import script_module
import storage_faults
from tasks import finetune_data as fd
from jbert.checkpoint import lock as workdir_lock
from jbert.train import trainer as train

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from configs import tiny  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

run_py = script_module.load("run.py")


def pretraining(**overrides):
  """configs/tiny.py shrunk to seconds of CPU, then `overrides` (dotted keys)."""
  config = tiny.get_config()
  settings = {"batch_size": 8, "total_steps": 2, "log_every_steps": 1, "eval_every_steps": 0,
              "checkpoint_every_steps": 0, "async_checkpointing": False, "data.max_seq_length": 32,
              "data.max_predictions_per_seq": 5, **overrides}
  config.update_from_flattened_dict(settings)
  return config


def snapshot(root: pathlib.Path) -> dict[str, str]:
  """Every path under `root` with the SHA-256 of its bytes (folders: "dir")."""
  return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(root.rglob("*"))}


def refusal(capsys, config, workdir) -> str:
  """The one stderr line of a run that exits with status 2."""
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_:
    run_py.execute(config, str(workdir))
  assert exit_.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err, err
  return err.rstrip("\n")


@pytest.mark.parametrize("change, message", [
    ({"optim.learning_rate": -1.0},
     "--config.optim.learning_rate=-1.0 must be positive, e.g. 1e-4 for pretraining or 2e-5 for fine-tuning."),
    ({"total_steps": -5}, "--config.total_steps=-5 must be positive (the optimiser steps of the run)."),
    ({"batch_size": 0}, "--config.batch_size=0 must be positive (the global sequences per optimiser step, e.g. 32)."),
    ({"optim.warmup_steps": -1}, "--config.optim.warmup_steps=-1 must be >= 0 (0: no warmup)."),
    ({"model.hidden_dropout_prob": 1.5},
     "--config.model.hidden_dropout_prob=1.5 must lie in [0, 1) (a probability of dropping; 0.1 is BERT's)."),
    ({"data.max_seq_length": 2}, "--config.data.max_seq_length=2 is too short; use at least 3 (128 is BERT's)."),
    ({"data.max_sequences_per_row": 100000},
     "--config.data.max_sequences_per_row=100000 exceeds what a row of 32 tokens can hold: 6 sequences of the "
     "shortest, 5 tokens; set it to at most 6 (unset, it is one per 8 tokens: 4)."),
    ({"log_every_steps": -1}, "log_every_steps=-1 must be >= 0 (0: only at the last step)."),
])
def test_values_out_of_range_are_one_line_and_create_nothing(tmp_path, capsys, change, message):
  assert refusal(capsys, pretraining(**change), tmp_path / "run") == f"run.py: {message}"
  assert snapshot(tmp_path) == {}


def test_pretraining_text_that_is_missing_or_not_text_is_named_and_left_as_it_was(tmp_path, capsys):
  vocab = fd.write_vocab(tmp_path / "vocab")
  data = tmp_path / "data"
  data.mkdir()
  (data / "nul.txt").write_bytes(b"\0" * 3000)
  (data / "latin1.bin").write_bytes(bytes(range(128, 256)) * 20)
  before = snapshot(tmp_path)
  text = {"data.source": "text", "data.vocab": str(vocab)}
  line = refusal(capsys, pretraining(**text, **{"data.text_files": f"{data}/*.md"}), tmp_path / "run")
  assert line == f"run.py: text_files: no file matches the glob '{data}/*.md'; check the path."
  for name, count in (("nul.txt", 3000), ("latin1.bin", 2560)):
    line = refusal(capsys, pretraining(**text, **{"data.text_files": str(data / name)}), tmp_path / "run")
    assert line == (f"run.py: {data / name} is not UTF-8 text: {count} of the first {count} characters are NUL, "
                    "control characters or bytes that are not UTF-8 (a binary file, or text in another encoding); "
                    "convert it to UTF-8 (e.g. `iconv -f latin1 -t utf-8`) or leave it out of the data files.")
  assert snapshot(tmp_path) == before


def test_a_vocabulary_with_repeated_tokens_is_refused_naming_them(tmp_path, capsys):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ba", "be", "ba", ".", "be"]) + "\n")
  before = snapshot(tmp_path)
  line = refusal(capsys, pretraining(**{"data.vocab": str(vocab)}), tmp_path / "run")
  assert line == (f"run.py: vocabulary {vocab} repeats 2 token(s): 'ba' (lines 6, 8), 'be' (lines 7, 10); each "
                  "token must be on one line only: remove the repeats (a token's id is its line number, from 0).")
  assert snapshot(tmp_path) == before


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return fd.tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.mark.parametrize("change, message", [
    ({"task.label_names": "no,maybe"},
     "row 0 of {data}/train.csv has label 'yes', which is not in task.label_names ['no', 'maybe']; add it to "
     "--config.task.label_names (class names in id order)."),
    ({"task.text_a": "sentence"},
     "task local: column(s) ['sentence'] not in row 0 of {data}/train.csv (line 2); available columns: ['a', 'b', "
     "'label']. Set --config.task.text_a to a column of the file."),
    ({"init_from": "/nonexistent/model"},
     "init_from=/nonexistent/model does not exist; set --config.init_from to a checkpoint (a Hugging Face or jbert "
     "model dir, a TF1 checkpoint or a training workdir)."),
    ({"task.regression": True}, "task.regression=True and task.label_names='no,yes' contradict each other: a "
                                "regressor has no classes; drop one of them."),
    ({"task.crf": True}, "task.crf=True does nothing for task local with task.kind=classification (sequence "
                         "classification): it is not one of its settings. task.crf is read by named-entity "
                         "recognition with a CRF (conll2003, local with task.kind=ner). Drop it, or train a task "
                         "that reads it."),
])
def test_fine_tuning_mistakes_are_one_line_naming_the_key(tmp_path, capsys, checkpoint, change, message):
  overrides = fd.local_overrides(tmp_path / "data", n_train=16, n_eval=8)
  before = snapshot(tmp_path)
  config = fd.finetune_config("local", **{"init_from": str(checkpoint), **overrides, **change})
  line = refusal(capsys, config, tmp_path / "run")
  assert line == "run.py: " + message.format(data=tmp_path / "data")
  assert snapshot(tmp_path) == before


def test_damaged_init_from_weights_found_after_the_workdir_is_made_leave_nothing_behind(tmp_path, capsys):
  damaged = fd.tiny_checkpoint(tmp_path / "ckpt")
  (damaged / "model.safetensors").write_bytes(b"garbage" * 100)
  overrides = fd.local_overrides(tmp_path / "data", n_train=16, n_eval=8)
  before = snapshot(tmp_path)
  line = refusal(capsys, fd.finetune_config("local", init_from=str(damaged), **overrides), tmp_path / "run")
  # Found from the header before anything is built (jbert.weights.sizes): 8 bytes of "garbage" as its length.
  assert line == (f"run.py: {damaged / 'model.safetensors'} is not a readable safetensors file (its header claims "
                  "7,450,474,826,515,505,511 bytes in a file of 700): it is truncated or corrupt; download or convert "
                  "it again.")
  assert snapshot(tmp_path) == before  # no workdir, lock file, metrics or tokenizer copy


HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
os.write(fd, sys.argv[2].encode())
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
print("held", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("content, holder", [
    ('{"host": "h1", "pid": 4242, "started": "2026-01-01T00:00:00+00:00"}',
     "pid 4242 on host h1, started 2026-01-01T00:00:00+00:00"),
    ("<<not a record>>", "an unknown run (its lock file holds 16 bytes that are not a jbert run record)"),
])
def test_a_busy_workdir_is_one_line_naming_the_holder_and_left_as_it_was(tmp_path, capsys, content, holder):
  workdir = tmp_path / "run"
  workdir.mkdir()
  lock_file = workdir / workdir_lock.LOCK_FILE
  proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock_file), content], stdout=subprocess.PIPE, text=True)
  try:
    assert proc.stdout.readline().strip() == "held"
    before = snapshot(tmp_path)
    line = refusal(capsys, pretraining(), workdir)
    assert snapshot(tmp_path) == before
  finally:
    proc.kill()
    proc.wait()
  assert line == (f"run.py: {workdir} is in use by another run: {holder} (it holds {lock_file}). Two runs on one "
                  "workdir overwrite each other's checkpoints and metrics: wait for it to finish, stop it, or use "
                  "another --workdir.")


@pytest.mark.parametrize("where", ["read_only_parent", "under_a_file"])
def test_an_unwritable_local_workdir_is_one_line_through_the_command(tmp_path, where):
  """The command a user runs, on a workdir whose parent is read-only (a read-only bind mount as root, which
  ignores permission bits; `chmod a-w` as another user) or is a file: one line naming the lock file it could not
  create and the fix, exit status 2, nothing written."""
  parent = tmp_path / "parent"
  if where == "under_a_file":
    parent.write_text("a file, kept as it is\n")
    context, reason = contextlib.nullcontext(), "Not a directory"
  else:
    if storage_faults.MODE == "simulated":
      pytest.skip("no read-only storage on this machine: root without mounts (simulated faults reach Orbax only)")
    parent.mkdir()
    context = storage_faults.read_only(parent)
    reason = "Permission denied" if storage_faults.MODE == "chmod" else "Read-only file system"
  before = snapshot(tmp_path)
  with context:
    result = subprocess.run([sys.executable, "run.py", "--config=configs/tiny.py", f"--workdir={parent / 'run'}",
                             "--config.batch_size=8", "--config.total_steps=2", "--config.data.max_seq_length=32",
                             "--config.data.max_predictions_per_seq=5"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
  assert (result.returncode, result.stdout) == (2, ""), result.stderr[-3000:]
  lines = [line for line in result.stderr.splitlines() if not re.match(r"I\d{4} ", line)]  # not the INFO lines
  assert lines == [f"run.py: cannot create {parent / 'run' / '.jbert.lock'} ({reason}); choose a writable --workdir."]
  assert snapshot(tmp_path) == before


def test_a_non_finite_step_is_one_line_and_saves_nothing(tmp_path, capsys):
  blowup = {"optim.learning_rate": 1e39, "optim.warmup_steps": 0, "checkpoint_every_steps": 1}
  line = refusal(capsys, pretraining(**blowup), tmp_path / "run")
  assert line.startswith("run.py: non-finite training state at step 1 (loss ")
  assert line.endswith("nothing of it was saved. No checkpoint was written before it: rerun with a lower learning "
                       "rate (or fixed data) to start afresh.")
  assert not list((tmp_path / "run" / "checkpoints").iterdir())


def test_a_full_disk_at_the_final_save_is_one_line_naming_the_checkpoint(tmp_path, capsys):
  workdir = tmp_path / "run"
  (workdir / "checkpoints").mkdir(parents=True)
  disk = storage_faults.FillableDisk(workdir / "checkpoints")
  try:
    disk.fill()
    line = refusal(capsys, pretraining(), workdir)
    assert [p.name for p in (workdir / "checkpoints").iterdir() if not p.name.startswith(".")] == []
  finally:
    disk.close()
  assert line.startswith(f"run.py: the checkpoint of step 2 could not be written to {workdir / 'checkpoints'}: ")
  assert "No space left on device" in line
  assert line.endswith("The run stops without it: fix the storage (free space, permissions), then rerun the same "
                       "command to resume from the start (no checkpoint is complete).")


def test_jbert_traceback_and_bugs_keep_the_exception(tmp_path, monkeypatch):
  monkeypatch.setenv("JBERT_TRACEBACK", "1")
  with pytest.raises(ValueError, match=r"^--config.total_steps=-5 must be positive"):
    run_py.execute(pretraining(total_steps=-5), str(tmp_path / "run"))
  monkeypatch.delenv("JBERT_TRACEBACK")

  def bug(config, workdir, **kwargs):
    raise KeyError("a bug in jbert")
  monkeypatch.setattr(train, "train_and_evaluate", bug)
  with pytest.raises(KeyError, match="a bug in jbert"):
    run_py.execute(pretraining(), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_a_second_ctrl_c_is_one_line_and_exit_status_130(tmp_path, monkeypatch, capsys):
  def interrupted(config, workdir, **kwargs):
    raise KeyboardInterrupt  # what jbert.train.stop.StopRequest raises on a second Ctrl-C
  monkeypatch.setattr(train, "train_and_evaluate", interrupted)
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_:
    run_py.execute(pretraining(), str(tmp_path / "run"))
  assert exit_.value.code == 130
  assert capsys.readouterr().err == ("run.py: interrupted; rerun the same command to go on from the last checkpoint "
                                     "it saved.\n")


def test_none_sets_the_keys_that_may_be_none_through_the_command(tmp_path):
  """`--config.KEY=None` (or `--config.KEY None`) on a key the config declares optional: absl's parsers refused it
  for numbers and read it as the text "None" for strings. The run trains with the None's meaning: warmup_steps
  from warmup_fraction (0.1 of 10 steps), no init_from."""
  workdir = tmp_path / "run"
  result = subprocess.run([sys.executable, "run.py", "--config=configs/tiny.py", f"--workdir={workdir}",
                           "--config.optim.warmup_steps=None", "--config.init_from", "None", "--config.batch_size=8",
                           "--config.total_steps=10", "--config.eval_every_steps=0", "--config.data.max_seq_length=32",
                           "--config.data.max_predictions_per_seq=5"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  recorded = json.loads((workdir / "config.json").read_text())["config"]
  assert (recorded["optim"]["warmup_steps"], recorded["init_from"], recorded["total_steps"]) == (1, None, 10)


def test_none_for_optional_keys_the_last_override_winning(tmp_path):
  """What run.py's parser makes of None, in a process of its own (absl's flags are global): a fine-tuning
  config's optional keys (total_steps, keep_best, model.scan_layers, optim.grad_clip_norm: an int, a str, a bool,
  a float) take None, and the last override of a key wins, None or not."""
  script = ("import json, sys, run; run.parse_flags(['run.py', *sys.argv[1:]]); c = run._CONFIG.value; "
            "print(json.dumps([c.total_steps, c.keep_best, c.model.scan_layers, c.optim.warmup_steps, "
            "c.optim.grad_clip_norm]))")
  result = subprocess.run([sys.executable, "-c", script, "--config=configs/finetune.py:local", f"--workdir={tmp_path}",
                           "--config.total_steps=5", "--config.total_steps=None", "--config.keep_best=None",
                           "--config.model.scan_layers", "None", "--config.optim.warmup_steps=None",
                           "--config.optim.warmup_steps=7", "--config.optim.grad_clip_norm=None"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 0, result.stderr[-3000:]
  assert json.loads(result.stdout.splitlines()[-1]) == [None, None, None, 7, None]


@pytest.mark.parametrize("override, message", [
    ("--config.total_steps=None", "invalid config override --config.total_steps=None: total_steps cannot be None in "
     "configs/tiny.py; give it an integer (configs/tiny.py has 600)."),
    ("--config.model.dtype=None", "invalid config override --config.model.dtype=None: model.dtype cannot be None in "
     "configs/tiny.py; give it a string (configs/tiny.py has 'float32')."),
    ("--config.data.max_seq_length=None",
     "--config.data.max_seq_length=None: it takes a value, the tokens per sequence (128 is BERT's)."),
])
def test_none_for_a_key_that_takes_no_none_is_one_line_through_the_command(tmp_path, override, message):
  """A key with a value of its own in the config (a plain one, or a data key others are computed from) refuses
  None in one line naming what it takes, exit status 2, nothing created."""
  result = subprocess.run([sys.executable, "run.py", "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}",
                           override], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert (result.returncode, result.stdout, result.stderr) == (2, "", f"run.py: {message}\n")
  assert not (tmp_path / "run").exists()


def test_the_command_exits_2_with_one_line_and_help_describes_both_kinds_of_training(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")

  def refused(change: str, environment: dict[str, str]) -> str:
    """run.py's stderr for tiny.py with `change`, after checking it exits 2, prints nothing else, creates nothing."""
    result = subprocess.run([sys.executable, "run.py", "--config=configs/tiny.py", f"--workdir={tmp_path / 'run'}",
                             change], cwd=REPO, env=environment, capture_output=True, text=True, timeout=300)
    assert (result.returncode, result.stdout) == (2, "")
    assert not (tmp_path / "run").exists()
    return result.stderr

  assert refused("--config.optim.learning_rate=-1", env) == (
      "run.py: --config.optim.learning_rate=-1.0 must be positive, e.g. 1e-4 for pretraining or 2e-5 for "
      "fine-tuning.\n")
  # Found once JAX has started its backends: no "Unable to initialize backend 'tpu'" line before it on a CPU host.
  no_platform = {k: v for k, v in env.items() if k != "JAX_PLATFORMS"}
  assert refused("--config.mesh.tensor=3", no_platform) == (
      "run.py: mesh: cannot fill -1: 1 devices are not divisible by the product of the other axes (3). Set "
      "mesh.data/fsdp/tensor so their product divides 1.\n")
  shown = subprocess.run([sys.executable, "run.py", "--help"], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
  assert shown.returncode == 0
  assert shown.stdout.startswith("Train BERT: pretraining and fine-tuning, one command")
  for flag in ("--config:", "--workdir:", "--coordinator_address:", "--num_processes:", "--process_id:",
               "--compile_cache:"):
    assert flag in shown.stdout
  assert "configs/finetune.py:local" in shown.stdout and "JBERT_TRACEBACK=1" in shown.stdout
