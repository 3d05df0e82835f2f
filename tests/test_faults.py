"""Fault injection against the real Orbax writer on local disk, through `train_and_evaluate` on the tiny config.

Each test breaks something a real run meets (a second run on the workdir, read-only or full checkpoint storage
with SIGTERM on top, a damaged newest checkpoint or data-iterator state) and asserts the outcome: the message, the
step restored, and losses bit-identical to an uninterrupted run after the recovery. Read-only and full storage
are real mounts or permissions where possible (`storage_faults.MODE`); kill -9 during saves is in test_resume.py.
"""
import logging
import os
import re
import shutil
import signal
import time

import pytest

import storage_faults
import trained
from jbert.checkpoint import manager as ckpt_lib
from jbert.train import trainer as train
from jbert.checkpoint import lock as workdir_lock
from test_train import read_metrics, small_config
from test_workdir_lock import hold_in_subprocess

RUN = trained.PRETRAINING


def losses(workdir):
  return {l["step"]: l["train/loss"] for l in read_metrics(workdir) if "train/loss" in l}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """An uninterrupted run: its losses, and its workdir (checkpoints 8, 10, 12) for the tests to copy; made once
per test run, not per worker."""
  result, workdir = trained.pretrained(tmp_path_factory)
  assert sorted(result) == list(range(1, 13))
  return result, workdir


def record_saves(monkeypatch, on_save=None):
  """{step: time.time() when its save was called}, in call order; `on_save(step)` runs before the save."""
  calls = {}
  real = ckpt_lib.Checkpointer.save

  def save(self, step, *args, **kwargs):
    calls[step] = time.time()
    if on_save is not None:
      on_save(step, self)
    return real(self, step, *args, **kwargs)

  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", save)
  return calls


def save_failures(caplog):
  """{step: log record} of the saves reported as failed while training went on."""
  pattern = re.compile(r"the checkpoint of step (\d+) could not be written")
  return {int(m.group(1)): r for r in caplog.records if (m := pattern.search(r.getMessage()))}


def test_a_second_run_is_refused_at_once_naming_the_holder_and_a_killed_holder_never_blocks(reference, tmp_path,
                                                                                            caplog):
  caplog.set_level(logging.INFO, logger="jbert")
  workdir = tmp_path / "run"
  shutil.copytree(reference[1], workdir)
  before = sorted(p.relative_to(workdir) for p in workdir.rglob("*"))
  holder = hold_in_subprocess(workdir)
  try:
    start = time.monotonic()
    with pytest.raises(workdir_lock.WorkdirBusyError, match=rf"is in use by another run: pid {holder.pid} on host "
                                                            rf"\S+, started \S+ \(it holds {workdir}/.jbert.lock\)"):
      train.train_and_evaluate(small_config(**RUN), str(workdir))
    assert time.monotonic() - start < 60  # before any compilation or file write
    assert sorted(p.relative_to(workdir) for p in workdir.rglob("*")) == before
  finally:
    holder.send_signal(signal.SIGKILL)
    holder.wait()
  train.train_and_evaluate(small_config(**RUN), str(workdir))  # the same command resumes (at its last step)
  assert "resumed from checkpoint step 12" in caplog.text
  assert losses(workdir) == reference[0]


def test_full_storage_fails_each_save_fast_under_its_own_step_and_the_run_resumes_exactly(
    reference, tmp_path, monkeypatch, caplog):
  workdir = tmp_path / "run"
  (workdir / "checkpoints").mkdir(parents=True)
  disk = storage_faults.FillableDisk(workdir / "checkpoints")

  def fill_after_step_4(step, ckpt):
    if step == 6:
      ckpt.wait()  # step 4 complete, then the disk is full
      disk.fill()

  try:
    calls = record_saves(monkeypatch, fill_after_step_4)
    with pytest.raises(ckpt_lib.CheckpointError, match=r"the checkpoint of step 12 could not be written to .*The "
                                                       r"run stops without it: .*resume from step 4\."):
      train.train_and_evaluate(small_config(**RUN), str(workdir))
    assert list(calls) == [2, 4, 6, 8, 10, 12]  # after each failure, the next save still ran
    failed = save_failures(caplog)
    assert sorted(failed) == [6, 8, 10]
    for step, record in failed.items():
      assert record.created - calls[step] < 10, f"step {step} reported {record.created - calls[step]:.1f} s late"
      assert "Training goes on with the state in memory" in record.getMessage()
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4"]  # no partial writes left
    monkeypatch.undo()
    disk.grow()
    train.train_and_evaluate(small_config(**RUN), str(workdir))  # the same command, once there is space
  finally:
    disk.close()
  assert losses(workdir) == reference[0]


def test_read_only_storage_then_sigterm_stops_within_the_grace_with_a_true_message(tmp_path, monkeypatch, caplog):
  workdir = tmp_path / "run"
  stack = []
  sent = []

  def break_storage_then_preempt(step, ckpt):
    if step == 6:
      ckpt.wait()  # let step 4 finish first, so that it is the newest complete checkpoint
      stack.append(storage_faults.read_only(ckpt.directory))
      stack[-1].__enter__()
      sent.append(time.monotonic())
      os.kill(os.getpid(), signal.SIGTERM)

  record_saves(monkeypatch, break_storage_then_preempt)
  try:
    with pytest.raises(ckpt_lib.CheckpointError, match=r"the checkpoint of step 7 could not be written to .*(Read-"
                                                       r"only file system|Permission denied).*The run stops without "
                                                       r"it: .*resume from step 4\."):
      train.train_and_evaluate(small_config(**RUN), str(workdir))
    assert time.monotonic() - sent[0] < 30  # TPU preemption grants 30 s
  finally:
    for context in stack:
      context.__exit__(None, None, None)
  failed = save_failures(caplog)
  assert sorted(failed) == [6] and "Training goes on" in failed[6].getMessage()
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4"]
  assert max(losses(workdir)) == 7


def test_damaged_newest_checkpoints_are_named_set_aside_and_the_run_resumes_exactly(reference, tmp_path, caplog):
  caplog.set_level(logging.INFO, logger="jbert")
  workdir = tmp_path / "run"
  shutil.copytree(reference[1], workdir)
  checkpoints = workdir / "checkpoints"
  array_file = max((checkpoints / "12" / "state" / "ocdbt.process_0" / "d").iterdir(),
                   key=lambda p: p.stat().st_size)
  os.truncate(array_file, 1000)
  (checkpoints / "10" / "data" / "shard_0.json").write_text('{"garbled')
  train.train_and_evaluate(small_config(**RUN), str(workdir))  # the same command
  assert re.search(rf"checkpoint step 12 in {checkpoints} is damaged: state/ocdbt.process_0/d/{array_file.name} is "
                   r"truncated \(1000 bytes left\): array \S+ cannot be read", caplog.text)
  assert re.search(r"checkpoint step 10 in .* is damaged: data/shard_0.json \(the data-iterator state\) is not "
                   r"valid JSON", caplog.text)
  assert "resumed from checkpoint step 8" in caplog.text
  assert sorted(p.name for p in checkpoints.iterdir()) == ["10", "10.damaged", "12", "12.damaged", "8"]
  assert (checkpoints / "12.damaged" / array_file.relative_to(checkpoints / "12")).stat().st_size == 1000
  assert losses(workdir) == reference[0]
