"""A rerun trains what the workdir's files say: a changed config stops it (naming each key, old and new) before
any file changes; safe and explicitly allowed changes are recorded; a finished run is not redone; outputs are
replaced whole or not at all; a change allowed on a finished run that only training would use rewrites nothing
(or, beside outputs to write again, is refused); unfinished Orbax saves of a killed run are removed on start."""
import hashlib
import json
import pathlib
import shutil
import subprocess
import sys

import jax
import pytest

from jbert import weights
from jbert.train import trainer as train
from jbert.train import workdir_record
from tests.tasks import finetune_data as fd
import script_module
import trained

TOTAL = trained.CLASSIFIER_STEPS
REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  """The shared tiny classifier (tests/trained.py): its checkpoint, data and config keys, and its finished run."""
  return trained.classifier(tmp_path_factory)


def config_for(inputs, **more):
  return fd.finetune_config("local", **inputs.settings(**more))


def hashes(workdir: pathlib.Path) -> dict[str, str]:
  """sha256 of every file in the workdir (checkpoints included), by relative path."""
  return {str(p.relative_to(workdir)): hashlib.sha256(p.read_bytes()).hexdigest()
          for p in sorted(workdir.rglob("*")) if p.is_file()}


def history(workdir: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (workdir / "history.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def finished(inputs):
  """A finished tiny classifier's workdir, copied per test by `workdir`."""
  return inputs.workdir


@pytest.fixture
def workdir(finished, tmp_path):
  return pathlib.Path(shutil.copytree(finished, tmp_path / "run"))


def test_first_run_records_its_config_and_start(finished, inputs):
  record = json.loads((finished / "config.json").read_text())
  assert record["config"]["task"]["label_names"] == "no,yes"
  assert record["config"]["optim"]["learning_rate"] == 1e-3
  assert record["config"]["total_steps"] == TOTAL
  assert [(h["event"], h["step"], h["changes"]) for h in history(finished)] == [("start", 0, [])]
  assert json.loads((finished / "results.json").read_text())["step"] == TOTAL


def test_reordered_label_names_stop_the_rerun_and_change_nothing(workdir, inputs, monkeypatch):
  before = hashes(workdir)
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled"))  # refused before any compile
  with pytest.raises(workdir_record.ConfigDriftError) as error:
    train.train_and_evaluate(config_for(inputs, **{"task.label_names": "yes,no"}), str(workdir))
  message = str(error.value)
  assert "\n" not in message
  assert message == (
      f"{workdir} was trained to step {TOTAL} with another config: task.label_names 'no,yes' -> 'yes,no'. "
      "Resuming would train and report a model no file describes: pass a new --workdir, or "
      "--config.allow_changes=task.label_names to change it deliberately (recorded in history.jsonl).")
  assert hashes(workdir) == before  # results.json, predictions/*, export/config.json, checkpoints: untouched
  assert json.loads((workdir / "export" / "config.json").read_text())["id2label"] == {"0": "no", "1": "yes"}


def test_a_deliberate_label_change_on_a_finished_run_rewrites_its_outputs_and_is_recorded(workdir, inputs):
  metrics = (workdir / "metrics.jsonl").read_text()
  train.train_and_evaluate(config_for(inputs, **{"task.label_names": "yes,no"}, allow_changes="task.label_names"),
                           str(workdir))
  assert json.loads((workdir / "export" / "config.json").read_text())["id2label"] == {"0": "yes", "1": "no"}
  assert json.loads((workdir / "results.json").read_text())["config"]["task"]["label_names"] == "yes,no"
  last = history(workdir)[-1]
  assert ("task.label_names", "no,yes", "yes,no", "allow_changes") in [
      (c["key"], c["old"], c["new"], c["allowed_by"]) for c in last["changes"]]
  assert (workdir / "metrics.jsonl").read_text() == metrics  # evaluated again, not trained


def test_changed_learning_rate_is_refused_then_allowed_by_name_and_recorded(workdir, inputs, capsys):
  more = {"total_steps": TOTAL + 4, "optim.learning_rate": 2e-3, "seed": 3}
  before = hashes(workdir)
  with pytest.raises(workdir_record.ConfigDriftError,
                     match=r"another config: optim.learning_rate 0.001 -> 0.002; seed 0 -> 3\. .*"
                           r"--config.allow_changes=optim.learning_rate,seed to change them"):
    train.train_and_evaluate(config_for(inputs, **more), str(workdir))
  assert hashes(workdir) == before
  with pytest.raises(workdir_record.ConfigDriftError, match=r"names optim.learnin_rate, which the config has no"):
    train.train_and_evaluate(config_for(inputs, **more, allow_changes="optim.learnin_rate,seed"), str(workdir))
  assert hashes(workdir) == before

  train.train_and_evaluate(config_for(inputs, **more, allow_changes="optim.learning_rate,seed"), str(workdir))
  last = history(workdir)[-1]
  assert (last["event"], last["step"]) == ("resume", TOTAL)
  assert {c["key"]: (c["old"], c["new"], c["allowed_by"]) for c in last["changes"]} == {
      "optim.learning_rate": (1e-3, 2e-3, "allow_changes"), "seed": (0, 3, "allow_changes"),
      "total_steps": (TOTAL, TOTAL + 4, "safe"), "allow_changes": ("", "optim.learning_rate,seed", "safe"),
      "optim.warmup_steps": (2, 3, "total_steps")}  # 10% of total_steps, rounded
  assert json.loads((workdir / "config.json").read_text())["config"]["optim"]["learning_rate"] == 2e-3
  assert json.loads((workdir / "results.json").read_text())["step"] == TOTAL + 4
  # The new config is now the workdir's: the same command without the override is a finished run.
  capsys.readouterr()
  assert train.train_and_evaluate(config_for(inputs, **more), str(workdir)) == {}
  assert f"already complete at step {TOTAL + 4}" in capsys.readouterr().out


def test_raised_total_steps_and_cadences_need_no_override_and_are_recorded(workdir, inputs):
  train.train_and_evaluate(config_for(inputs, total_steps=TOTAL + 4, log_every_steps=2, eval_every_steps=2),
                           str(workdir))
  changes = {c["key"]: (c["old"], c["new"], c["allowed_by"]) for c in history(workdir)[-1]["changes"]}
  assert changes == {"total_steps": (TOTAL, TOTAL + 4, "safe"), "log_every_steps": (1, 2, "safe"),
                     "eval_every_steps": (0, 2, "safe"), "optim.warmup_steps": (2, 3, "total_steps")}
  steps = [json.loads(l)["step"] for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert steps[-1] == TOTAL + 4 and TOTAL + 2 in steps


def test_finished_run_rerun_says_complete_and_changes_no_file(workdir, inputs, capsys):
  before = hashes(workdir)
  capsys.readouterr()
  assert train.train_and_evaluate(config_for(inputs), str(workdir)) == {}
  assert capsys.readouterr().out == (f"run.py: already complete at step {TOTAL} ({workdir}); raise "
                                     "--config.total_steps to train further, or pass another --workdir.\n")
  assert hashes(workdir) == before


def _run_py(workdir, inputs, **more):
  """run.py on `workdir` with the shared classifier's config keys (and `more`) as a user types them."""
  command = [sys.executable, "run.py", "--config=configs/finetune.py:local", f"--workdir={workdir}",
             *(f"--config.{k}={v}" for k, v in inputs.settings(**more).items())]
  return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_a_training_change_allowed_on_a_finished_run_says_complete_and_rewrites_nothing(workdir, inputs):
  """What a finished run records stays true: a learning rate it was never trained with is not written into
  config.json, results.json or history.jsonl, and the original command still finds the run complete."""
  before = hashes(workdir)
  changed = _run_py(workdir, inputs, **{"optim.learning_rate": 5e-5, "allow_changes": "optim.learning_rate"})
  assert changed.returncode == 0, changed.stderr[-3000:]
  assert changed.stdout == (
      f"run.py: already complete at step {TOTAL} ({workdir}), and nothing was changed: optim.learning_rate 0.001 -> "
      f"5e-05 would only change training, which is over; raise --config.total_steps above {TOTAL} to train further "
      "with it, or pass another --workdir.\n")
  assert hashes(workdir) == before  # config.json, results.json, metrics.jsonl, history.jsonl, export/, checkpoints
  original = _run_py(workdir, inputs)
  assert (original.returncode, original.stdout) == (0, f"run.py: already complete at step {TOTAL} ({workdir}); raise "
                                                       "--config.total_steps to train further, or pass another "
                                                       "--workdir.\n"), original.stderr[-3000:]
  assert hashes(workdir) == before


def test_a_training_change_beside_outputs_to_write_again_is_refused_and_writes_nothing(workdir, inputs):
  """Outputs written again from the final step (a deliberate relabelling, or a results.json an interrupted run
  left behind) would record the training change too: refused in one line, nothing written; without the training
  change they are written, recording the old learning rate."""
  before = hashes(workdir)
  both = config_for(inputs, **{"task.label_names": "yes,no", "optim.learning_rate": 5e-5},
                    allow_changes="task.label_names,optim.learning_rate")
  with pytest.raises(workdir_record.ConfigDriftError) as error:
    train.train_and_evaluate(both, str(workdir))
  assert str(error.value) == (
      f"{workdir} is trained to its last step {TOTAL}, and its outputs are to be written again from it; "
      "optim.learning_rate 0.001 -> 5e-05 would only change training, which is over, yet the outputs would record it: "
      f"drop it, or raise --config.total_steps above {TOTAL} to train with it.")
  assert hashes(workdir) == before
  (workdir / "results.json").unlink()  # outputs an interrupted run did not finish
  lower = config_for(inputs, **{"optim.learning_rate": 5e-5}, allow_changes="optim.learning_rate")
  with pytest.raises(workdir_record.ConfigDriftError, match=rf"is trained to its last step {TOTAL}, .*drop it"):
    train.train_and_evaluate(lower, str(workdir))
  assert not (workdir / "results.json").exists() and json.loads((workdir / "config.json").read_text()) == json.loads(
      (inputs.workdir / "config.json").read_text())
  train.train_and_evaluate(config_for(inputs), str(workdir))
  assert json.loads((workdir / "results.json").read_text())["config"]["optim"]["learning_rate"] == 1e-3


def test_total_steps_below_the_reached_step_says_the_run_is_past_it(workdir, inputs, capsys):
  before = hashes(workdir)
  capsys.readouterr()
  assert train.train_and_evaluate(config_for(inputs, total_steps=TOTAL - 4), str(workdir)) == {}
  assert capsys.readouterr().out == (
      f"run.py: already past total_steps={TOTAL - 4}: {workdir} holds step {TOTAL}, and its outputs are those of step "
      f"{TOTAL}; raise --config.total_steps above {TOTAL} to train further, or pass another --workdir.\n")
  assert hashes(workdir) == before


def test_unfinished_orbax_saves_are_removed_on_start_and_the_run_resumes(workdir, inputs, caplog):
  partial = workdir / "checkpoints" / "7.orbax-checkpoint-tmp-1234"
  (partial / "state").mkdir(parents=True)
  (partial / "state" / "junk").write_bytes(b"half a save")
  caplog.set_level("INFO", logger="jbert")
  train.train_and_evaluate(config_for(inputs, total_steps=TOTAL + 4), str(workdir))
  assert not partial.exists()
  assert (f"removed 7.orbax-checkpoint-tmp-1234 in {workdir / 'checkpoints'}: the unfinished saves of an "
          "interrupted run") in caplog.text
  assert f"state: resumed from checkpoint step {TOTAL} (step {TOTAL} of {TOTAL + 4})" in caplog.text
  assert json.loads((workdir / "results.json").read_text())["step"] == TOTAL + 4


def test_outputs_interrupted_mid_write_keep_the_previous_ones_whole(workdir, inputs, monkeypatch):
  before = hashes(workdir)
  exported, previous = [n for n in before if n.startswith("export/")], ["results.json", "predictions/validation.tsv"]
  save_pretrained = weights.save_pretrained

  def export_fails_midway(config, params, out_dir, *args, **kwargs):
    save_pretrained(config, params, out_dir, *args, **kwargs)
    (pathlib.Path(out_dir) / "model.safetensors").write_bytes(b"half")
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(weights, "save_pretrained", export_fails_midway)
  with pytest.raises(OSError, match="No space left"):
    train.train_and_evaluate(config_for(inputs, total_steps=TOTAL + 4), str(workdir))
  after = hashes(workdir)
  assert {n: after.get(n) for n in exported} == {n: before[n] for n in exported}  # the old export, whole
  assert after["results.json"] == before["results.json"]
  assert not [p for p in after if ".tmp" in p or ".old" in p]  # no temporary file or folder left behind

  monkeypatch.setattr(weights, "save_pretrained", save_pretrained)
  dump = json.dump

  def results_fail_midway(obj, f, **kwargs):
    if "results.json" not in getattr(f, "name", ""):
      return dump(obj, f, **kwargs)
    f.write(json.dumps(obj)[:40])
    raise OSError(28, "No space left on device")

  monkeypatch.setattr(json, "dump", results_fail_midway)
  with pytest.raises(OSError, match="No space left"):
    train.train_and_evaluate(config_for(inputs, total_steps=TOTAL + 4), str(workdir))
  after = hashes(workdir)
  assert after["results.json"] == before["results.json"]
  assert json.loads((workdir / "results.json").read_text())["step"] == TOTAL
  assert not [p for p in after if ".tmp" in p or ".old" in p]

  # Outputs older than the checkpoint are written again from it, without training.
  monkeypatch.setattr(json, "dump", dump)
  train.train_and_evaluate(config_for(inputs, total_steps=TOTAL + 4), str(workdir))
  assert json.loads((workdir / "results.json").read_text())["step"] == TOTAL + 4
  assert all(hashes(workdir)[n] != before[n] for n in previous)


def test_pretraining_rerun_with_another_batch_size_or_corpus_is_one_line_exit_2(tmp_path_factory, tmp_path):
  from tests.test_run_cli import run  # pylint: disable=import-outside-toplevel
  _, finished = trained.pretrained(tmp_path_factory)  # test_train.small_config: batch 16, synthetic data, 12 steps
  workdir = pathlib.Path(shutil.copytree(finished, tmp_path / "run"))
  before = hashes(workdir)
  # run.py with small_config's model and data keys, but another batch size and corpus (and more steps, a change
  # that needs no override).
  again = run("--config=configs/tiny.py", f"--workdir={workdir}", "--config.batch_size=32",
              "--config.data.source=text", "--config.total_steps=16", "--config.eval_batches=2",
              "--config.data.max_seq_length=32", "--config.data.max_predictions_per_seq=5", timeout=600)
  assert (again.returncode, again.stdout) == (2, "")
  assert again.stderr.splitlines()[-1] == (
      f"run.py: {workdir} was trained to step 12 with another config: batch_size 16 -> 32; data.source 'synthetic' "
      "-> 'text'. Resuming would train and report a model no file describes: pass a new --workdir, or "
      "--config.allow_changes=batch_size,data.source to change them deliberately (recorded in history.jsonl).")
  assert len(again.stderr.strip().splitlines()) == 1
  assert hashes(workdir) == before


def test_a_workdir_without_config_json_is_compared_with_its_checkpoint_config(workdir, inputs):
  (workdir / "config.json").unlink()
  before = hashes(workdir)
  with pytest.raises(workdir_record.ConfigDriftError, match=r"another config: optim.learning_rate 0.001 -> 0.002\. "):
    train.train_and_evaluate(config_for(inputs, **{"optim.learning_rate": 2e-3}), str(workdir))
  assert hashes(workdir) == before


def test_a_workdir_without_config_json_whose_checkpoint_config_is_damaged_resumes_with_a_warning(workdir, inputs,
                                                                                                 caplog):
  (workdir / "config.json").unlink()
  (workdir / "checkpoints" / str(TOTAL) / "config" / "metadata").write_text('{"seed"')
  caplog.set_level("INFO", logger="jbert")
  train.train_and_evaluate(config_for(inputs, total_steps=TOTAL + 4), str(workdir))
  assert "this run's config is not compared with the one that trained the workdir" in caplog.text
  assert json.loads((workdir / "results.json").read_text())["step"] == TOTAL + 4
  assert json.loads((workdir / "config.json").read_text())["config"]["total_steps"] == TOTAL + 4


def test_a_damaged_config_json_is_named_with_the_way_out(workdir, inputs):
  (workdir / "config.json").write_text('{"config": {"seed"')
  before = hashes(workdir)
  with pytest.raises(workdir_record.ConfigDriftError, match=r"config.json cannot be read \(.*\); it records the "
                                                           r"config that trained this workdir: repair or delete it"):
    train.train_and_evaluate(config_for(inputs), str(workdir))
  assert hashes(workdir) == before


def _config(**values):
  import ml_collections  # pylint: disable=import-outside-toplevel
  return ml_collections.ConfigDict({"seed": 0, "allow_changes": "", "log_every_steps": 10, **values})


@pytest.mark.parametrize("new_warmup, allowed", [(20, True), (15, False)])
def test_a_warmup_derived_from_total_steps_follows_it_and_an_explicit_one_does_not(new_warmup, allowed):
  recorded = _config(total_steps=100, optim={"warmup_fraction": 0.1, "warmup_steps": 10}).to_dict()
  config = _config(total_steps=200, optim={"warmup_fraction": 0.1, "warmup_steps": new_warmup})
  if allowed:
    changes = workdir_record.compare(recorded, config, 100, "DIR")
    assert [(c.key, c.old, c.new, c.allowed_by) for c in changes] == [
        ("optim.warmup_steps", 10, 20, "total_steps"), ("total_steps", 100, 200, "safe")]
  else:
    with pytest.raises(workdir_record.ConfigDriftError, match=r"optim.warmup_steps 10 -> 15\. "):
      workdir_record.compare(recorded, config, 100, "DIR")


def test_lowered_total_steps_above_the_reached_step_needs_the_override_and_a_section_covers_its_keys():
  recorded = _config(total_steps=100, optim={"learning_rate": 1e-3, "b1": 0.9}).to_dict()
  lower = _config(total_steps=80, optim={"learning_rate": 1e-3, "b1": 0.9})
  with pytest.raises(workdir_record.ConfigDriftError, match=r"DIR was trained to step 50 with another config: "
                                                           r"total_steps 100 -> 80\. .*allow_changes=total_steps "):
    workdir_record.compare(recorded, lower, 50, "DIR")
  optim = _config(total_steps=100, optim={"learning_rate": 2e-3, "b1": 0.8}, allow_changes="optim")
  assert [(c.key, c.allowed_by) for c in workdir_record.compare(recorded, optim, 50, "DIR")] == [
      ("allow_changes", "safe"), ("optim.b1", "allow_changes"), ("optim.learning_rate", "allow_changes")]


def test_bucketing_orders_the_data_so_a_change_or_a_record_from_before_it_needs_the_override():
  recorded = _config(total_steps=100, data={"max_seq_length": 128, "bucketing": True}).to_dict()
  fixed = _config(total_steps=100, data={"max_seq_length": 128, "bucketing": False})
  with pytest.raises(workdir_record.ConfigDriftError, match=r"data.bucketing True -> False\. "
                                                           r".*allow_changes=data.bucketing "):
    workdir_record.compare(recorded, fixed, 50, "DIR")
  # A workdir recorded before the key existed fed fixed-length batches: resuming it bucketed changes the order.
  before = _config(total_steps=100, data={"max_seq_length": 128}).to_dict()
  bucketed = _config(total_steps=100, data={"max_seq_length": 128, "bucketing": True})
  with pytest.raises(workdir_record.ConfigDriftError, match=r"data.bucketing False -> True\. "):
    workdir_record.compare(before, bucketed, 50, "DIR")
  assert workdir_record.compare(before, fixed, 50, "DIR") == []
  allowed = _config(total_steps=100, data={"max_seq_length": 128, "bucketing": True}, allow_changes="data.bucketing")
  assert [(c.key, c.old, c.new, c.allowed_by) for c in workdir_record.compare(before, allowed, 50, "DIR")] == [
      ("allow_changes", "", "data.bucketing", "safe"), ("data.bucketing", False, True, "allow_changes")]
  # Pretraining configs have no such key on either side: nothing to compare.
  pretraining = _config(total_steps=100, data={"max_seq_length": 128})
  assert workdir_record.compare(before, pretraining, 50, "DIR") == []


def test_packing_changes_the_batches_so_a_change_or_a_record_from_before_it_needs_the_override():
  packed = _config(total_steps=100, data={"max_seq_length": 128, "packing": True, "max_sequences_per_row": 8})
  plain = _config(total_steps=100, data={"max_seq_length": 128, "packing": False, "max_sequences_per_row": 8})
  with pytest.raises(workdir_record.ConfigDriftError, match=r"data.packing True -> False\. "
                                                           r".*allow_changes=data.packing "):
    workdir_record.compare(packed.to_dict(), plain, 50, "DIR")
  # A pretraining workdir recorded before the key existed fed one sequence per row: resuming it packed (the new
  # default) would change its batches; unpacked it goes on as before.
  before = _config(total_steps=100, data={"max_seq_length": 128}).to_dict()
  with pytest.raises(workdir_record.ConfigDriftError, match=r"data.packing False -> True\. "):
    workdir_record.compare(before, packed, 50, "DIR")
  assert workdir_record.compare(before, plain, 50, "DIR") == []
  slots = _config(total_steps=100, data={"max_seq_length": 128, "packing": True, "max_sequences_per_row": 4})
  with pytest.raises(workdir_record.ConfigDriftError, match=r"data.max_sequences_per_row 8 -> 4\. "):
    workdir_record.compare(packed.to_dict(), slots, 50, "DIR")


def test_fine_tunings_unset_scan_layers_follows_the_workdirs_checkpoints_then_the_platform(workdir, inputs,
                                                                                          tmp_path, monkeypatch):
  from jbert.train import plan as plan_lib
  config = config_for(inputs, **{"model.scan_layers": None})
  from configs import finetune
  assert finetune.get_config("sst2").model.scan_layers is None  # configs/finetune.py leaves it to the platform
  assert plan_lib.resolve_scan_layers(config).model.scan_layers is False  # CPU: unrolled
  monkeypatch.setattr(jax, "default_backend", lambda: "tpu")
  assert plan_lib.resolve_scan_layers(config, str(tmp_path / "new")).model.scan_layers is True
  # The shared run trained unrolled: its layout, not the platform's default, decides a rerun's.
  assert workdir_record.recorded_value(str(workdir), "model.scan_layers") is False
  assert plan_lib.resolve_scan_layers(config, str(workdir)).model.scan_layers is False
  assert config.model.scan_layers is None  # resolved in a copy
  # run.py's early completion check resolves as the trainer does (`plan.resolve`): the unset value is no change.
  assert plan_lib.resolve(config, str(workdir)).model.scan_layers is False
  before = hashes(workdir)
  assert script_module.load("run.py")._finished(config, str(workdir)) == (  # pylint: disable=protected-access
      f"run.py: already complete at step {TOTAL} ({workdir}); raise --config.total_steps to train further, or pass "
      "another --workdir.")
  assert hashes(workdir) == before
