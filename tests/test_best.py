"""keep_best (jbert/train/best.py): the best evaluation's parameters are kept in WORKDIR/best, outlive a resume, and
are what the finished run reports, predicts and exports; bad settings are refused before anything is written."""
import copy
import json

import jax
import numpy as np
import pytest

import jbert
from jbert.train import best as best_lib
from jbert.train import trainer as train
from tests.tasks import finetune_data as fd


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return fd.tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))

_EVALUATE = train.evaluate


def _config(checkpoint, data, **overrides):
  """64 training pairs (2 steps an epoch), evaluated and logged every 2 steps. The runs take total_steps=8 where
  the test allows: the learning-rate schedule is compiled into the train step, so each total costs a compile."""
  return fd.finetune_config("local", init_from=str(checkpoint), eval_every_steps=2, log_every_steps=2,
                            **fd.local_overrides(data, n_train=64, n_eval=16, **{"optim.learning_rate": 1e-3},
                                                 **overrides))


def _force_accuracies(monkeypatch, values):
  """Training evaluations report the given accuracies in turn; returns [(params, true results)] of every
  evaluation, the end-of-run one (labelled_only=False) included."""
  calls, values = [], iter(values)

  def evaluate(run, steps, params, eval_sets, *, labelled_only=True):
    results, predictions = _EVALUATE(run, steps, params, eval_sets, labelled_only=labelled_only)
    calls.append((jax.device_get(params), copy.deepcopy(results)))
    if labelled_only:
      results["validation"]["accuracy"] = next(values)
    return results, predictions
  monkeypatch.setattr(train, "evaluate", evaluate)
  return calls


def _assert_same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _evals(workdir):
  lines = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  return [(l["step"], l["eval/accuracy"]) for l in lines if "eval/accuracy" in l]


def test_the_best_step_is_exported_reported_and_kept_across_a_resume(tmp_path, checkpoint, monkeypatch):
  workdir = tmp_path / "run"
  calls = _force_accuracies(monkeypatch, [0.6, 0.9, 0.7, 0.5])
  train.train_and_evaluate(_config(checkpoint, tmp_path / "data", total_steps=8, keep_best="accuracy"),
                           str(workdir))
  assert _evals(workdir) == [(2, 0.6), (4, 0.9), (6, 0.7), (8, 0.5)]
  step4, step8 = calls[1][0], calls[3][0]
  assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(step4), jax.tree.leaves(step8)))
  results = json.loads((workdir / "results.json").read_text())
  assert results["best"] == {"metric": "accuracy", "mode": "max", "value": 0.9, "step": 4}
  assert results["step"] == 8  # trained to the end; the outputs are of step 4
  _assert_same(calls[4][0], step4)  # the final evaluation and predictions ran on step 4's parameters
  assert results["metrics"] == calls[1][1] == calls[4][1]
  _, exported = jbert.load_pretrained(workdir / "export", jbert.BertForSequenceClassification)
  _assert_same(exported, step4)
  assert json.loads((workdir / "best" / "best.json").read_text()) == results["best"]
  assert sorted(p.name for p in workdir.iterdir() if p.name.startswith("best")) == ["best"]

  # Resumed with more steps: the later evaluations (0.8, 0.4) do not beat the recorded 0.9 of step 4.
  calls = _force_accuracies(monkeypatch, [0.8, 0.4])
  train.train_and_evaluate(_config(checkpoint, tmp_path / "data", total_steps=12, keep_best="accuracy"),
                           str(workdir))
  assert _evals(workdir)[-2:] == [(10, 0.8), (12, 0.4)]
  results = json.loads((workdir / "results.json").read_text())
  assert results["best"]["step"] == 4 and results["step"] == 12
  _, exported = jbert.load_pretrained(workdir / "export", jbert.BertForSequenceClassification)
  _assert_same(exported, step4)


def test_a_lower_is_better_metric_and_an_interrupted_swap(tmp_path, checkpoint, monkeypatch):
  workdir = tmp_path / "run"
  calls = _force_accuracies(monkeypatch, [0.5] * 4)
  # loss is inferred as lower-is-better: the step of the lowest logged eval loss is kept.
  train.train_and_evaluate(_config(checkpoint, tmp_path / "data", total_steps=8, keep_best="loss"), str(workdir))
  losses = [r["validation"]["loss"] for _, r in calls[:4]]
  record = json.loads((workdir / "best" / "best.json").read_text())
  assert record == {"metric": "loss", "mode": "min", "value": min(losses), "step": 2 * (1 + losses.index(min(losses)))}
  # A kill between the renames of a save left best.old and no best: the next start puts it back.
  (workdir / "best").rename(workdir / "best.old")
  (workdir / "best.tmp").mkdir()
  keeper = best_lib.BestKeeper.from_config(_config(checkpoint, tmp_path / "data", keep_best="loss"), str(workdir))
  assert (keeper.value, keeper.step) == (record["value"], record["step"])
  keeper.recover()
  assert sorted(p.name for p in workdir.iterdir() if p.name.startswith("best")) == ["best"]
  assert json.loads((workdir / "best" / "best.json").read_text()) == record


@pytest.mark.parametrize("overrides, message", [
    ({"keep_best": "accuracy", "keep_best_mode": "maximum"},
     r"keep_best_mode='maximum' must be one of \['max', 'min'\] \(or None: min for losses, max otherwise\)\.$"),
    ({"keep_best": "accuracy", "task.eval_file": None},
     r"keep_best='accuracy' needs a labelled evaluation split; set --config.task.eval_file"),
])
def test_settings_that_cannot_keep_a_best_are_refused_before_anything_is_written(tmp_path, checkpoint, overrides,
                                                                                  message):
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(_config(checkpoint, tmp_path / "data", total_steps=2, **overrides), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_an_unknown_metric_names_the_logged_ones_and_another_metric_than_recorded_is_refused(tmp_path, checkpoint):
  workdir = tmp_path / "run"
  with pytest.raises(ValueError, match=r"keep_best='acc' is not an evaluation metric of this task; it logs "
                                       r"\['accuracy', 'f1', 'loss', 'precision', 'recall'\]"):
    train.train_and_evaluate(_config(checkpoint, tmp_path / "data", total_steps=8, keep_best="acc"), str(workdir))
  assert not (workdir / "best").exists()
  train.train_and_evaluate(_config(checkpoint, tmp_path / "data", total_steps=8, keep_best="accuracy"),
                           str(workdir))
  before = (workdir / "best" / "best.json").read_text()
  # Another metric is a change of the run's config first; made deliberately, the kept best still refuses it.
  with pytest.raises(ValueError, match=r"keep_best 'accuracy' -> 'loss'.*--config.allow_changes=keep_best"):
    train.train_and_evaluate(_config(checkpoint, tmp_path / "data", total_steps=12, keep_best="loss"), str(workdir))
  with pytest.raises(ValueError, match=r"best.json keeps the best by accuracy \(max\), but this run asks for "
                                       r"keep_best=loss \(min\); set --config.keep_best=accuracy, or remove "):
    train.train_and_evaluate(_config(checkpoint, tmp_path / "data", total_steps=12, keep_best="loss",
                                     allow_changes="keep_best"), str(workdir))
  assert (workdir / "best" / "best.json").read_text() == before


def test_a_damaged_record_is_named_and_left_as_it_is(tmp_path):
  import ml_collections  # pylint: disable=import-outside-toplevel
  (tmp_path / "best").mkdir()
  (tmp_path / "best" / "best.json").write_text('{"metric": "accuracy"')
  config = ml_collections.ConfigDict({"keep_best": "accuracy", "keep_best_mode": None})
  with pytest.raises(ValueError, match=r"best/best.json cannot be read \(JSONDecodeError.*\); remove .*/best to start "
                                       r"keeping the best anew"):
    best_lib.BestKeeper.from_config(config, str(tmp_path))
  assert (tmp_path / "best" / "best.json").read_text() == '{"metric": "accuracy"'
  assert best_lib.BestKeeper.from_config(ml_collections.ConfigDict({"keep_best": None}), str(tmp_path)) is None
  assert [best_lib.infer_mode(m) for m in ("accuracy", "loss", "validation_matched/loss", "f1")] == [
      "max", "min", "min", "max"]
