"""Ctrl-C and SIGTERM during training (the loop's side, a real run stopped and resumed: tests/test_resume.py)."""
import signal

import pytest

from jbert.train import stop as stop_lib


@pytest.fixture
def interactive():
  """SIGINT as an interactive Python has it (a pytest-xdist worker may have it ignored)."""
  previous = signal.signal(signal.SIGINT, signal.default_int_handler)
  yield
  signal.signal(signal.SIGINT, previous)


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
