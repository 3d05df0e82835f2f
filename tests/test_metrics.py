"""metrics.jsonl contents, TensorBoard events read back, resume truncation, errors, and the progress line."""
import glob
import json
import os
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from jbert.runtime import metrics


def _events(path):
  """Events of one TFRecord file: [u64 length][u32 crc][data][u32 crc] per record."""
  with open(path, "rb") as f:
    data = f.read()
  out, pos = [], 0
  while pos < len(data):
    (length,) = struct.unpack("<Q", data[pos:pos + 8])
    out.append(event_pb2.Event.FromString(data[pos + 12:pos + 12 + length]))
    pos += 12 + length + 4
  return out


def _scalars(workdir):
  found = []
  for path in sorted(glob.glob(os.path.join(workdir, "tensorboard", "events.out.tfevents.*"))):
    for event in _events(path):
      found += [(event.step, v.tag, round(v.simple_value, 6)) for v in event.summary.value]
  return found


def _lines(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return f.read().splitlines()


def test_jsonl_holds_exactly_what_was_written_after_each_write(tmp_path):
  writer = metrics.MetricWriter(str(tmp_path))
  writer.write(1, {"train/loss": np.float32(2.5), "train/mlm_accuracy": jnp.array(0.25),
                   "train/examples": np.int64(32), "train/finite": np.bool_(True)})
  assert _lines(tmp_path) == [  # readable before close: flushed per write
      '{"step": 1, "train/loss": 2.5, "train/mlm_accuracy": 0.25, "train/examples": 32, "train/finite": true}']
  writer.write(np.int32(2), {"eval/loss": 1.75})
  writer.close()
  records = [json.loads(line) for line in _lines(tmp_path)]
  assert records[1] == {"step": 2, "eval/loss": 1.75}
  assert type(records[0]["train/loss"]) is float and type(records[0]["train/examples"]) is int


def test_tensorboard_events_hold_the_scalars(tmp_path):
  with metrics.MetricWriter(str(tmp_path)) as writer:
    writer.write(10, {"train/loss": 3.5, "train/learning_rate": 1e-4})
    writer.write(20, {"train/loss": 3.25})
  assert _scalars(tmp_path) == [(10, "train/loss", 3.5), (10, "train/learning_rate", 1e-4), (20, "train/loss", 3.25)]


def test_reopening_appends(tmp_path):
  for step in (1, 2):
    with metrics.MetricWriter(str(tmp_path)) as writer:
      writer.write(step, {"train/loss": float(step)})
  assert [json.loads(line)["step"] for line in _lines(tmp_path)] == [1, 2]


def test_truncate_after_drops_later_steps_and_purges_tensorboard(tmp_path):
  with metrics.MetricWriter(str(tmp_path)) as writer:
    for step in range(1, 6):
      writer.write(step, {"train/loss": float(step)})
  with open(tmp_path / "metrics.jsonl", "a", encoding="utf-8") as f:
    f.write('{"step": 6, "train/lo')  # torn by a kill
  with metrics.MetricWriter(str(tmp_path)) as writer:  # the resumed run restarts at the step-3 checkpoint
    writer.truncate_after(3)
    writer.write(4, {"train/loss": 40.0})
  assert [json.loads(line) for line in _lines(tmp_path)] == [
      {"step": 1, "train/loss": 1.0}, {"step": 2, "train/loss": 2.0}, {"step": 3, "train/loss": 3.0},
      {"step": 4, "train/loss": 40.0}]
  starts = [e.step for path in glob.glob(str(tmp_path / "tensorboard" / "events.out.tfevents.*"))
            for e in _events(path) if e.HasField("session_log")]
  assert starts == [4]  # TensorBoard hides the earlier run's events from step 4 on


def test_unwritable_workdir_is_reported_at_construction(tmp_path):
  blocker = tmp_path / "a_file"
  blocker.write_text("")
  workdir = str(blocker / "run")
  with pytest.raises(OSError, match=f"cannot write metrics to {workdir}/metrics.jsonl.*--workdir"):
    metrics.MetricWriter(workdir)


def test_disabled_writer_touches_nothing(tmp_path):
  writer = metrics.MetricWriter(str(tmp_path / "run"), enabled=False)
  writer.write(1, {"train/loss": 1.0})
  writer.truncate_after(0)
  writer.close()
  assert not (tmp_path / "run").exists()


def test_non_scalar_metric_is_named(tmp_path):
  with metrics.MetricWriter(str(tmp_path)) as writer:
    with pytest.raises(ValueError, match="'train/loss' has shape \\(2,\\)"):
      writer.write(1, {"train/loss": np.zeros(2)})


def test_remote_log_rewrites_the_whole_file(tmp_path, monkeypatch):
  monkeypatch.setattr(metrics, "_is_remote", lambda path: True)  # exercise the object-store path locally
  (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
  with metrics.MetricWriter(str(tmp_path)) as writer:
    writer.truncate_after(1)
    writer.write(2, {"train/loss": 0.5})
  assert _lines(tmp_path) == ['{"step": 1}', '{"step": 2, "train/loss": 0.5}']


def test_gcs_workdir_without_google_cloud_storage(monkeypatch):
  monkeypatch.setattr(metrics, "_tensorboardx_has_gcs", lambda: False)
  with pytest.raises(ImportError, match="pip install google-cloud-storage"):
    metrics.MetricWriter("gs://bucket/run")


def test_format_progress():
  scalars = {"train/loss": 6.1234, "train/mlm_accuracy": 0.1234, "train/tokens_per_sec": 52_100.0,
             "train/padding_fraction": 0.0314, "train/mfu": 0.412}
  line = metrics.format_progress(1200, 10_000, scalars, steps_per_sec=3.4, eta_s=2590.2,
                                 mfu_label="measured CPU matmul peak")
  assert line == ("step 1200/10000 | loss 6.123 | mlm_acc 0.123 | 3.4 steps/s | ETA 0:43:10 | 52.1k tok/s | "
                  "pad 3.1% | MFU 41.2% of measured CPU matmul peak")
  assert metrics.format_progress(5, 10, {"nsp_accuracy": 0.5, "learning_rate": 1e-4}) == (
      "step 5/10 | nsp_acc 0.500 | lr 1.00e-04")


def test_progress_tracks_the_last_interval():
  now = [100.0]
  progress = metrics.Progress(total_steps=1000, start_step=200, clock=lambda: now[0])
  now[0] = 130.0  # step 201, with compilation, took 30 s
  progress.start(201)
  now[0] = 150.0
  assert progress.update(301) == 5.0  # 100 steps in 20 s
  now[0] = 160.0
  assert progress.update(401) == 10.0  # the last interval only
  assert progress.eta_s(401) == 59.9
  assert progress.line(401, {"train/loss": 1.0}) == "step 401/1000 | loss 1.000 | 10 steps/s | ETA 0:01:00"


def test_first_step_after_resume_is_left_out_of_the_rate():
  # Resumed at 500 of 600: the first step takes 55 s (restore + compile), the rest run at 10 steps/s.
  now = [0.0]
  progress = metrics.Progress(total_steps=600, start_step=500, clock=lambda: now[0])
  now[0] = 55.0
  progress.start(501)
  assert progress.update(501) == 0.0 and progress.eta_s(501) is None  # log_every_steps=1: nothing measured yet
  now[0] = 59.9
  assert progress.update(550) == pytest.approx(10.0)
  assert progress.eta_s(550) == pytest.approx(5.0)
  assert progress.line(550, {}) == "step 550/600 | 10 steps/s | ETA 0:00:05"


def test_without_start_the_first_interval_includes_the_first_step():
  now = [0.0]
  progress = metrics.Progress(total_steps=600, start_step=500, clock=lambda: now[0])
  now[0] = 59.9
  assert progress.update(550) == pytest.approx(50 / 59.9)  # 0.83 steps/s: the ETA the issue saw, 60 s not 5
  assert progress.eta_s(550) == pytest.approx(59.9)
  assert progress.line(550, {"train/loss": 2.0}) == "step 550/600 | loss 2.000 | 0.835 steps/s | ETA 0:01:00"


def test_waits_for_background_compiles_stay_out_of_the_rate_and_the_eta():
  """A fine-tuning run of 750 steps at 3.5 steps/s whose steps 3 and 6 wait 40 s each for a bucket length's
  program: the first line said `ETA 0:24:08` (2.6 min for 9 steps) when 3.6 min were left."""
  now = [0.0]
  progress = metrics.Progress(total_steps=750, start_step=0, clock=lambda: now[0])
  now[0] = 30.0  # the first step compiles
  progress.start(1)
  for step in range(2, 10):
    now[0] += 1 / 3.5
    if step in (3, 6):
      now[0] += 40.0
      progress.exclude(40.0)
  assert progress.update(9) == pytest.approx(3.5)
  assert progress.line(9, {}) == "step 9/750 | 3.5 steps/s | ETA 0:03:32"
  now[0] += 10 / 3.5  # the next interval has no wait: nothing left over from the last
  assert progress.update(19) == pytest.approx(3.5)


def test_format_progress_shows_the_tasks_accuracies():
  classification = {"train/loss": 0.6931, "train/accuracy": 0.53125, "train/grad_norm": 1.5, "train/learning_rate": 2e-5}
  assert metrics.format_progress(40, 100, classification) == "step 40/100 | loss 0.693 | acc 0.531 | lr 2.00e-05"
  squad = {"train/start_accuracy": 0.25, "train/end_accuracy": 0.5, "train/loss": 3.0}
  assert metrics.format_progress(1, 2, squad) == "step 1/2 | loss 3.000 | end_acc 0.500 | start_acc 0.250"
  assert metrics.format_progress(1, 2, {"train/loss": 0.1}) == "step 1/2 | loss 0.100"  # regression: its loss


def test_console_lines_by_the_clock_between_logged_steps():
  now = [0.0]
  progress = metrics.Progress(total_steps=1000, start_step=0, clock=lambda: now[0], first_line_s=15.0,
                              line_every_s=60.0)
  now[0] = 40.0  # the first step compiles for 40 s
  assert progress.start(1) == 40.0
  assert not progress.due()  # the clock restarts with training
  now[0] = 54.9
  assert not progress.due()
  now[0] = 55.0
  assert progress.due()  # 15 s into training: the first line
  assert progress.update(31) == 2.0 and progress.eta_s(31) == 484.5
  now[0] = 100.0
  assert not progress.due()
  progress.update(100)  # a line of log_every_steps restarts the wait too
  now[0] = 159.9
  assert not progress.due()
  now[0] = 160.0
  assert progress.due()
  progress.start(200)  # a resume starts over: the short first wait again
  now[0] = 175.0
  assert progress.due()


def test_format_eval_pretraining():
  scalars = {"eval/mlm_loss": 2.8904, "eval/mlm_accuracy": 0.41204, "eval/nsp_loss": 0.32, "eval/nsp_accuracy": 0.871,
             "eval/loss": 3.2104}
  assert metrics.format_eval(1200, scalars) == (
      "eval step 1200 | loss 3.210 | mlm_loss 2.890 | mlm_acc 0.4120 | nsp_loss 0.320 | nsp_acc 0.8710")


def test_format_eval_fine_tuning():
  assert metrics.format_eval(300, {"eval/accuracy": np.float32(0.853125), "eval/f1": 0.9}) == (
      "eval step 300 | accuracy 0.8531 | f1 0.9000")
  mnli = {"eval/validation_matched/accuracy": 0.84312, "eval/validation_mismatched/accuracy": 0.851,
          "eval/validation_matched/loss": 0.4567, "eval/examples": np.int64(9815)}
  assert metrics.format_eval(4000, mnli) == (
      "eval step 4000 | validation_matched/accuracy 0.8431 | validation_mismatched/accuracy 0.8510 | "
      "validation_matched/loss 0.457 | examples 9815")
  assert metrics.format_eval(7, {"pearson": 0.5, "spearman": 0.25}) == "eval step 7 | pearson 0.5000 | spearman 0.2500"
