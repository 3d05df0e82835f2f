"""Ctrl-C and SIGTERM during training (the loop's side, a real run stopped and resumed: tests/test_resume.py), and
while the programs compile: run.py leaves at once, and a stop while the loop waits for a compile keeps what was
trained, exactly resumable; a wait for a compile stays out of the logged step rate."""
import concurrent.futures
import json
import os
import pathlib
import queue
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

from jbert.runtime import ahead
from jbert.train import stop as stop_lib
from jbert.train import trainer as train
from tests.tasks import finetune_data as fd
import script_module
import trained

REPO = pathlib.Path(__file__).resolve().parents[1]
run_py = script_module.load("run.py")


def test_ctrl_c_asks_as_sigterm_does_and_a_second_one_aborts(caplog, interactive):
  stop = stop_lib.StopRequest()
  try:
    with caplog.at_level("WARNING", logger="jbert"):
      signal.raise_signal(signal.SIGINT)
      signal.raise_signal(signal.SIGTERM)  # only repeats the request
    assert stop.requested and stop.reason == "Ctrl-C"
    assert [r.getMessage() for r in caplog.records] == [
        "Ctrl-C: finishing the current step, saving a checkpoint and exiting; Ctrl-C again aborts at once."]
    with pytest.raises(KeyboardInterrupt):
      signal.raise_signal(signal.SIGINT)
  finally:
    stop.restore()
  assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
  assert stop.stopped_message(8, "python run.py --config=configs/tiny.py --workdir=/tmp/w") == (
      "stopped at step 8 after Ctrl-C; resume with: python run.py --config=configs/tiny.py --workdir=/tmp/w")
  ignored = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a background job of a non-interactive shell
  try:
    stop = stop_lib.StopRequest()
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN  # stays ignored
    signal.raise_signal(signal.SIGTERM)
    stop.restore()
    assert stop.stopped_message(3, None) == "stopped at step 3 after SIGTERM; rerun the same command to resume."
  finally:
    signal.signal(signal.SIGINT, ignored)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
  return trained.classifier(tmp_path_factory)


class Console:
  """A run.py process whose stderr is read line by line in a thread, so that a test can act on a line. Start it
  under `interactive`: a process started with SIGINT ignored keeps it ignored."""

  def __init__(self, args):
    self.proc = subprocess.Popen([sys.executable, *args], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
    self.lines: queue.Queue = queue.Queue()
    self.text = ""
    threading.Thread(target=lambda: [self.lines.put(line) for line in self.proc.stderr], daemon=True).start()

  def wait_for(self, text: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while text not in self.text:
      try:
        self.text += self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
      except queue.Empty:
        pytest.fail(f"no {text!r} in {timeout} s: {self.text[-3000:]}")

  def exit_after(self, signum) -> tuple[int, float]:
    """Sends `signum`; (exit status, seconds until the process ended)."""
    start = time.monotonic()
    self.proc.send_signal(signum)
    status = self.proc.wait(timeout=120)
    elapsed = time.monotonic() - start
    time.sleep(0.1)  # the reader's last lines
    while not self.lines.empty():
      self.text += self.lines.get()
    return status, elapsed


def compiling_run(workdir, classifier) -> Console:
  """The shared classifier's run.py command without the compile cache, once its compiles have started."""
  args = ["run.py", "--config=configs/finetune.py:local", f"--workdir={workdir}", "--compile_cache=off",
          *(f"--config.{k}={v}" for k, v in classifier.settings().items())]
  console = Console(args)
  console.wait_for("compiling in the background: ")  # the stop handlers are in; the programs are compiling
  return console


def test_sigterm_while_the_programs_compile_exits_at_once_naming_the_resume_command(tmp_path, classifier,
                                                                                   interactive):
  console = compiling_run(tmp_path, classifier)
  status, elapsed = console.exit_after(signal.SIGTERM)
  assert status == 0 and elapsed < 2, (elapsed, console.text[-3000:])
  assert re.search(r"stopped at step 0 after SIGTERM; resume with: python run\.py --config=configs/finetune.py:local "
                   rf"--workdir={re.escape(str(tmp_path))} --compile_cache=off", console.text), console.text[-3000:]
  assert "Traceback" not in console.text
  assert not [p for p in (tmp_path / "checkpoints").iterdir()]  # no step was trained: nothing to save


def test_a_second_ctrl_c_while_the_programs_compile_exits_at_once(tmp_path, classifier, interactive):
  console = compiling_run(tmp_path, classifier)
  console.proc.send_signal(signal.SIGINT)
  console.wait_for("Ctrl-C: finishing the current step, saving a checkpoint and exiting; Ctrl-C again aborts at once.")
  status, elapsed = console.exit_after(signal.SIGINT)
  assert elapsed < 2, (elapsed, console.text[-3000:])
  # Aborted (130), or stopped by the first Ctrl-C in the moment before the second (0): either way, at once.
  assert status in (0, 130) and "Traceback" not in console.text, console.text[-3000:]
  if status == 130:
    assert console.text.splitlines()[-1] == (
        "run.py: interrupted; rerun the same command to go on from the last checkpoint it saved.")


def test_a_stop_while_the_loop_waits_for_a_compile_saves_what_was_trained_and_resumes_exactly(tmp_path, classifier,
                                                                                            monkeypatch, caplog):
  """The program of step 7 (whose batch is taken), then the final evaluation's, still compile when SIGTERM comes:
  the first stop keeps steps 1-6 (the data rewound to step 7's batch), the second the last step; the next rerun
  writes the outputs. Losses and results equal the uninterrupted run's."""
  config = fd.finetune_config("local", **classifier.settings())
  calls = {}
  run_program = ahead.Ahead.__call__

  def still_compiling_at(which, nth):
    """The `nth` call of the programs `which(key)` selects meets a compile that never ends, and SIGTERM."""
    def call(self, *args):
      key = self._key(*args)  # pylint: disable=protected-access
      if which(key):
        calls[which] = calls.get(which, 0) + 1
        if calls[which] == nth:
          os.kill(os.getpid(), signal.SIGTERM)
          self._pool.wait(concurrent.futures.Future())  # pylint: disable=protected-access
      return run_program(self, *args)
    monkeypatch.setattr(ahead.Ahead, "__call__", call)

  previous = signal.signal(signal.SIGTERM, lambda *_: None)  # a stray SIGTERM must not end pytest
  steps = lambda: sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
  caplog.set_level("WARNING", logger="jbert")
  try:
    gradient = lambda key: isinstance(key, tuple) and all(isinstance(k, int) for k in key)  # (rows, length)
    still_compiling_at(gradient, 7)  # the gradient of step 7
    train.train_and_evaluate(config, str(tmp_path))
    assert "stopped at step 6 after SIGTERM" in caplog.text and steps() == [6]  # max_checkpoints_to_keep=1
    assert sorted(trained.losses(tmp_path)) == list(range(1, 7)) and not (tmp_path / "results.json").exists()
    still_compiling_at(lambda key: isinstance(key, tuple) and not gradient(key), 1)  # the first evaluation batch
    train.train_and_evaluate(config, str(tmp_path))
    assert f"stopped at step {trained.CLASSIFIER_STEPS} after SIGTERM" in caplog.text
    assert steps()[-1] == trained.CLASSIFIER_STEPS and not (tmp_path / "results.json").exists()
  finally:
    signal.signal(signal.SIGTERM, previous)
  monkeypatch.undo()
  train.train_and_evaluate(config, str(tmp_path))
  assert trained.losses(tmp_path) == classifier.losses
  assert json.loads((tmp_path / "results.json").read_text())["metrics"] == json.loads(
      (classifier.workdir / "results.json").read_text())["metrics"]


def test_a_wait_for_a_background_compile_stays_out_of_the_logged_step_rate(tmp_path, classifier, monkeypatch):
  """The gradient program of step 7 is still compiling for 3 s when the loop needs it: the rate logged at step 7
  (and so the ETA and tokens/s) counts the step's own time, not the wait, which made the first ETAs of a
  fine-tuning run several times too long."""
  config = fd.finetune_config("local", **classifier.settings())
  run_program, calls = ahead.Ahead.__call__, []

  def call(self, *args):
    key = self._key(*args)  # pylint: disable=protected-access
    if isinstance(key, tuple) and all(isinstance(k, int) for k in key):  # a gradient program: (rows, length)
      calls.append(key)
      if len(calls) == 7:
        compiled = concurrent.futures.Future()
        threading.Timer(3.0, compiled.set_result, (None,)).start()
        self._pool.wait(compiled)  # pylint: disable=protected-access
    return run_program(self, *args)
  monkeypatch.setattr(ahead.Ahead, "__call__", call)
  start = time.monotonic()
  train.train_and_evaluate(config, str(tmp_path))
  assert time.monotonic() - start > 3 and len(calls) >= 7
  logged = {l["step"]: l for l in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines())
            if "train/steps_per_sec" in l}
  # Counted, the wait alone would make it below 1/3 step per second.
  assert logged[7]["train/steps_per_sec"] > 1.0, logged[7]
  assert logged[7]["train/tokens_per_sec"] > 16, logged[7]  # a step's real tokens at that rate, not per 3 s


def test_a_second_ctrl_c_during_the_stop_save_aborts_at_once_and_the_rerun_resumes_from_the_save_before(
    tmp_path, classifier, monkeypatch, capsys, caplog, interactive):
  """Ctrl-C lands after step 8's save; the save of the step the stop finishes is where the second Ctrl-C lands.
  run.py ends at once with its one line and status 130, nothing half-written is listed, and the same command
  resumes from step 8 to the uninterrupted losses."""
  from jbert.checkpoint import manager  # pylint: disable=import-outside-toplevel
  config = fd.finetune_config("local", **classifier.settings())
  save = manager.Checkpointer.save

  def save_then_ctrl_c(self, step, state, **kwargs):
    if kwargs.get("final"):
      signal.raise_signal(signal.SIGINT)  # the second: KeyboardInterrupt here, before anything is written
    save(self, step, state, **kwargs)
    if step == 8:
      signal.raise_signal(signal.SIGINT)  # the first: finish the step, save, exit
  monkeypatch.setattr(manager.Checkpointer, "save", save_then_ctrl_c)
  caplog.set_level("WARNING", logger="jbert")
  with pytest.raises(SystemExit) as exit_:
    run_py.execute(config, str(tmp_path))
  err = capsys.readouterr().err
  assert exit_.value.code == 130, err[-3000:]
  assert err.splitlines()[-1] == ("run.py: interrupted; rerun the same command to go on from the last checkpoint it "
                                  "saved.")
  assert "Ctrl-C: finishing the current step, saving a checkpoint and exiting; Ctrl-C again aborts at once." in (
      caplog.text)
  assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["8"]
  assert max(trained.losses(tmp_path)) == 9 and not (tmp_path / "results.json").exists()
  monkeypatch.undo()
  run_py.execute(config, str(tmp_path))
  assert trained.losses(tmp_path) == classifier.losses
