"""`python run.py` as a newcomer meets it: each command-line mistake is one line on stderr (with the usage line
where the command is incomplete) and creates nothing; a short CPU run prints jbert's lines and no library
start-up noise; running a finished run again says so at once."""
import os
import pathlib
import subprocess
import sys

import pytest

import device_children

REPO = pathlib.Path(__file__).resolve().parents[1]
USAGE = "usage: python run.py --config=configs/NAME.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]"
NOISE = ("libtpu", "Unable to initialize backend", "[Gloo]", "Traceback")


def run(*args, timeout=120):
  # One CPU device (more only slow a 2-step run down); the suite's compilation cache comes with os.environ.
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=device_children.xla_flags(1))
  return subprocess.run([sys.executable, "run.py", *map(str, args)], cwd=REPO, env=env, capture_output=True,
                        text=True, timeout=timeout)


def one_line_error(result) -> str:
  assert result.returncode == 2 and result.stdout == ""
  assert "Traceback" not in result.stderr
  lines = result.stderr.splitlines()
  assert len(lines) == 1, result.stderr
  return lines[0]


@pytest.mark.parametrize("args, message", [
    ([], "run.py: --config and --workdir are required."),
    (["--config=configs/tiny.py"], "run.py: --workdir is required."),
    (["--workdir={w}"], "run.py: --config is required."),
])
def test_missing_flags_say_which_and_print_the_usage(tmp_path, args, message):
  result = run(*(a.format(w=tmp_path / "w") for a in args))
  assert result.returncode == 2 and result.stderr.splitlines() == [message, USAGE]
  assert not (tmp_path / "w").exists()


def test_wrong_config_path_is_one_line_naming_it(tmp_path):
  line = one_line_error(run("--config=configs/tinny.py", f"--workdir={tmp_path / 'w'}", "--config.seed=1"))
  assert line == (f"run.py: --config=configs/tinny.py: no config file configs/tinny.py (relative to {REPO}); the "
                  "configs here are configs/base.py, configs/electra.py, configs/finetune.py, configs/large.py, "
                  "configs/modernbert.py, configs/phase2.py, configs/roberta.py, configs/tiny.py.")
  assert not (tmp_path / "w").exists()


def test_mistyped_key_lists_the_keys_of_the_config_loaded_nearest_first(tmp_path):
  config = tmp_path / "mine.py"
  config.write_text("import ml_collections\n\n\ndef get_config():\n  return ml_collections.ConfigDict("
                    "{'steps': 1, 'stride': 2, 'data': {'path': 'x', 'size': 3}})\n")
  line = one_line_error(run(f"--config={config}", f"--workdir={tmp_path / 'w'}", "--config.step=5"))
  assert line == (f'run.py: invalid config override --config.step=5: {config} has no key step. Did you mean '
                  f'"steps"? Its keys: steps, stride, data.*.')
  line = one_line_error(run(f"--config={config}", f"--workdir={tmp_path / 'w'}", "--config.data.paths=y"))
  assert line.endswith('has no key data.paths. Did you mean "data.path"? Its keys: data.path, data.size.')
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("args, message", [
    (["--config=configs/tiny.py", "--config.batchsize=8"],
     'run.py: invalid config override --config.batchsize=8: configs/tiny.py has no key batchsize. Did you mean '
     '"batch_size"? Its keys: batch_size, allow_changes, allow_data_restart, async_checkpointing, '
     'checkpoint_every_steps, data.*, '),
    (["--config=configs/tiny.py", "--config.total_steps=many"],
     "run.py: invalid flag or config override: flag --config.total_steps=many: invalid literal for int()"),
    (["--config=configs/phase2.py:medium"],
     "run.py: --config=configs/phase2.py:medium: loading it failed: configs/phase2.py:medium: the argument names "
     "the phase-1 config, one of ['base', 'large', 'tiny']."),
    (["--config=configs/tiny.py", "--workdri=/tmp"], "run.py: --workdir is required."),
    (["--config=configs/tiny.py", "--config.seed.x=1"],
     "run.py: invalid config override --config.seed.x=1: configs/tiny.py has no key seed.x. seed is a value.\n"),
    (["--config=configs/tiny.py", "stray"],
     "run.py: unexpected arguments ['stray']; every setting is a flag (--workdir=DIR, --config.KEY=VALUE).\n" + USAGE),
])
def test_other_mistakes_are_one_line(tmp_path, args, message):
  result = run(*args, *([] if "--workdri=/tmp" in args else [f"--workdir={tmp_path / 'w'}"]))
  assert result.returncode == 2 and result.stderr.startswith(message), result.stderr
  assert "Traceback" not in result.stderr and not (tmp_path / "w").exists()


def test_cpu_run_shows_jbert_lines_without_library_noise_and_a_rerun_says_it_is_complete(tmp_path):
  args = ["--config=configs/tiny.py", f"--workdir={tmp_path}", "--config.total_steps=2", "--config.batch_size=8",
          "--config.log_every_steps=1", "--config.eval_every_steps=0", "--config.data.max_seq_length=32",
          "--config.data.max_predictions_per_seq=5", "--config.async_checkpointing=False"]
  first = run(*args, timeout=600)
  assert first.returncode == 0, first.stderr[-3000:]
  output = first.stdout + first.stderr
  assert not [n for n in NOISE if n in output], output[-3000:]
  assert "step 2/2 | loss" in output and "state: fresh initialisation (step 0 of 2)" in output
  again = run(*args, timeout=600)
  assert again.returncode == 0 and "step 1/2" not in again.stdout + again.stderr
  assert again.stdout == (f"run.py: already complete at step 2 ({tmp_path}); raise --config.total_steps to train "
                          "further, or pass another --workdir.\n")
