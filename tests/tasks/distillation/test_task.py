"""Distillation (`jbert/tasks/distillation/task.py`): the losses' known values through the task, the teacher's cached
outputs equal to its predictions, a student of the teacher's layers exported as an ordinary classifier that
transformers and `jbert.predict` load (keep_best's step), a run killed with kill -9 and then preempted resumed by the
same command to the uninterrupted run's losses, config drift refused, and each bad input one line."""
import json
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import types

import jax
import numpy as np
import pytest
import torch
import transformers

import jbert
from jbert import tasks
from jbert.tasks.classification import sources
from jbert.tasks.distillation.task import Distillation
from jbert.runtime import sharding
from jbert.tokenizer import load_tokenizer
from jbert.train import trainer as trainer_lib
import script_module
import trained
from tasks import finetune_data as fd
from tests.test_resume import wait_for

REPO = pathlib.Path(__file__).resolve().parents[3]
STEPS = 16
run_py = script_module.load("run.py")


def _log_softmax(x):
  x = np.asarray(x, np.float64)
  x = x - x.max(-1, keepdims=True)
  return x - np.log(np.exp(x).sum(-1, keepdims=True))


def _task(labels=("no", "yes", "maybe"), **settings):
  """A task without data (losses only), as `from_config` builds it without a tokenizer."""
  dataset = sources.local_dataset("distill", {}, {"text_a": "a", "label": "label"}, labels and list(labels))
  kwargs = dict(teacher="unused", layers=(1,), temperature=2.0, soft_weight=1.0, hard_weight=0.5, hidden_weight=0.0,
                hidden_loss="cosine", layer_map=(0, 2), max_seq_length=4)
  return Distillation(dataset, **{**kwargs, **settings})


def test_soft_hard_hidden_and_the_training_loss_have_their_known_values():
  rng = np.random.default_rng(0)
  b, t, h, c, temp = 3, 4, 5, 3, 2.0
  task = _task(hidden_weight=2.0)
  student, teacher = rng.normal(size=(b, c)).astype(np.float32), rng.normal(size=(b, c)).astype(np.float32)
  hidden = [rng.normal(size=(b, t, h)).astype(np.float32) for _ in range(2)]
  target = rng.normal(size=(b, 2, t, h)).astype(np.float32)
  mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], np.int32)
  batch = {"input_ids": np.ones((b, t), np.int32), "attention_mask": mask, "label": np.array([0, 2, 1], np.int32),
           "teacher_logits": teacher, "teacher_hidden": np.swapaxes(target, 2, 3)}  # [B, K, H, T] as cached
  entries = task.loss(types.SimpleNamespace(logits=student, hidden_states=tuple(hidden)), batch)
  values = tasks.reported(task, entries)

  log_t, log_s = _log_softmax(teacher / temp), _log_softmax(student / temp)
  soft = temp ** 2 * np.mean(np.sum(np.exp(log_t) * (log_t - log_s), -1))
  hard = -np.mean(_log_softmax(student)[np.arange(b), [0, 2, 1]])
  cos = [np.sum(x * y, -1) / np.sqrt(np.sum(x * x, -1) * np.sum(y * y, -1))
         for x, y in zip(hidden, np.moveaxis(target, 1, 0))]  # 2 x [B, T]
  hidden_loss = sum(np.sum((1 - c_) * mask) for c_ in cos) / (2 * mask.sum())
  np.testing.assert_allclose(float(values["soft"]), soft, rtol=1e-5)
  np.testing.assert_allclose(float(values["hard"]), hard, rtol=1e-5)
  np.testing.assert_allclose(float(values["hidden"]), hidden_loss, rtol=1e-5)
  np.testing.assert_allclose(float(values["loss"]), soft + 0.5 * hard + 2.0 * hidden_loss, rtol=1e-5)
  assert float(values["agreement"]) == pytest.approx(np.mean(student.argmax(-1) == teacher.argmax(-1)))
  assert float(values["accuracy"]) == pytest.approx(np.mean(student.argmax(-1) == [0, 2, 1]))
  assert task.objectives == {"soft": 1.0, "hard": 0.5, "hidden": 2.0}
  assert task.kind == "classification"  # what the export records: jbert.predict serves it as a classifier

  mse = _task(hidden_weight=1.0, hidden_loss="mse").loss(types.SimpleNamespace(logits=student,
                                                                               hidden_states=tuple(hidden)), batch)
  expected = sum(np.sum(np.mean((x - y) ** 2, -1) * mask) for x, y in zip(hidden, np.moveaxis(target, 1, 0)))
  np.testing.assert_allclose(float(tasks.reported(task, mse)["hidden"]), expected / (2 * mask.sum()), rtol=1e-5)


def test_a_regressor_learns_the_teachers_value_and_the_gold_one():
  task = _task(labels=None)
  assert task.regression and task.kind == "regression"
  batch = {"input_ids": np.ones((2, 4), np.int32), "label": np.array([1.0, 3.0], np.float32),
           "teacher_logits": np.array([[0.5], [2.0]], np.float32)}
  values = tasks.reported(task, task.loss(types.SimpleNamespace(logits=np.array([[1.5], [1.0]], np.float32)), batch))
  assert float(values["soft"]) == pytest.approx((1.0 ** 2 + 1.0 ** 2) / 2)
  assert float(values["hard"]) == pytest.approx((0.5 ** 2 + 2.0 ** 2) / 2)
  assert float(values["loss"]) == pytest.approx(1.0 + 0.5 * 2.125)


def test_a_regressor_teacher_gives_a_regressor_student_of_its_values(tmp_path):
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  from jbert.model import init_params  # pylint: disable=import-outside-toplevel
  vocab = fd.write_vocab(tmp_path / "teacher")
  config = jbert.BertConfig(vocab_size=len(vocab.read_text().split()), hidden_size=32, num_hidden_layers=2,
                            num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)
  model = jbert.BertForSequenceClassification(config, num_labels=1)
  params = nn.meta.unbox(init_params(model, jax.random.key(3)))
  jbert.save_pretrained(config, params, tmp_path / "teacher", jbert.BertForSequenceClassification)
  rows = [{"a": r["a"], "b": r["b"], "label": f"{i / 7:.3f}"} for i, r in enumerate(fd.context_examples(12, 4))]
  train = fd.write_rows(tmp_path / "train.csv", rows)
  cfg = fd.finetune_config("distill", **{"task.teacher": str(tmp_path / "teacher"), "task.train_file": str(train),
                                         "task.text_a": "a", "task.text_b": "b", "task.label": "label"})
  task = tasks.build_task(cfg, load_tokenizer(str(vocab)))
  assert task.regression and task.kind == "regression" and task.layers == (0,)
  # Built, the task has read its rows but not run the teacher: that waits for the training stream.
  rows = task._train  # pylint: disable=protected-access
  assert "teacher_logits" not in rows and len(rows["input_ids"]) == 12
  features = task.train_features()
  assert features["teacher_logits"].shape == (12, 1) and task.train_features() is features  # computed once
  expected = model.apply({"params": params}, features["input_ids"], token_type_ids=features["token_type_ids"],
                         attention_mask=features["attention_mask"], deterministic=True).logits
  np.testing.assert_allclose(features["teacher_logits"], np.asarray(expected), atol=1e-5)
  np.testing.assert_allclose(features["label"], [i / 7 for i in range(12)], atol=1e-3)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory):
  """The shared tiny pair classifier (2 layers, labels no/yes) as the teacher: its export folder."""
  return trained.classifier(tmp_path_factory)


def settings(teacher, **more) -> dict:
  files = {k: teacher.overrides[k] for k in ("task.train_file", "task.eval_file", "task.text_a", "task.text_b",
                                             "task.label")}
  return {"task.teacher": str(teacher.workdir / "export"), "task.student_layers": "1", "task.hidden_weight": 1.0,
          "total_steps": STEPS, "batch_size": 16, "log_every_steps": 1, "checkpoint_every_steps": 4,
          "eval_every_steps": 4, "keep_best": "loss", "data.max_seq_length": 16, "data.num_shards": 2,
          "optim.learning_rate": 1e-3, **files, **more}


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, teacher):
  from jbert.train import trainer as train  # pylint: disable=import-outside-toplevel
  workdir = tmp_path_factory.mktemp("distilled") / "run"
  train.train_and_evaluate(fd.finetune_config("distill", **settings(teacher)), str(workdir))
  return workdir


def test_the_teachers_cached_outputs_are_its_predictions_and_unlabelled_data_trains_on_them(tmp_path, teacher):
  rows = fd.context_examples(40, seed=5)
  fd.write_rows(tmp_path / "transfer.csv", rows, fields=("a", "b"))
  config = fd.finetune_config("distill", **settings(teacher, **{"task.train_file": str(tmp_path / "transfer.csv")}))
  export = teacher.workdir / "export"
  task = tasks.build_task(config, load_tokenizer(str(export / "vocab.txt")))
  assert not task.labelled and task.objectives == {"soft": 1.0, "hidden": 1.0}
  assert [s.labelled for s in task.eval_sets()] == [True]  # the evaluation file's labels are still scored
  assert set(task.batch_spec(4, 16)) == {"input_ids", "token_type_ids", "attention_mask", "teacher_logits",
                                         "teacher_hidden"}
  predicted = jbert.predict([(r["a"], r["b"]) for r in rows], str(export))
  probabilities = np.exp(_log_softmax(task.train_features()["teacher_logits"]))
  np.testing.assert_allclose(probabilities, [[p["probabilities"][n] for n in ("no", "yes")] for p in predicted],
                             atol=1e-5)
  # The cached hidden states: the embeddings and the teacher's layer-2 output of each row's tokens alone (no
  # padding), exactly the teacher's; a batch gets them [B, K, H, T] at its length, zero past each row.
  features = task.train_features()
  mask = features["attention_mask"]
  lengths = mask.shape[1] - np.argmax(mask[:, ::-1], 1)
  assert task.layer_map == (0, 2) and task.hidden_cache.values.shape == (lengths.sum(), 2, 64)
  assert lengths.sum() < 0.8 * mask.size  # what the dense [N, K, H, T] cache held as padding is gone
  t_config, t_params = jbert.load_pretrained(str(export), jbert.BertForSequenceClassification)
  states = jbert.BertForSequenceClassification(t_config, num_labels=2).apply(
      {"params": t_params}, features["input_ids"], token_type_ids=features["token_type_ids"], attention_mask=mask,
      deterministic=True, output_hidden_states=True).hidden_states
  want = np.swapaxes(np.stack([states[0], states[2]], 1), 2, 3) * mask[:, None, None, :]  # [N, K, H, T]
  np.testing.assert_allclose(task.hidden_cache.batch(np.arange(40), 16), want, atol=1e-5)
  rows = np.array([7, 3])
  cut = int(lengths[rows].max())
  np.testing.assert_array_equal(task.hidden_cache.batch(rows, cut), task.hidden_cache.batch(rows, 16)[..., :cut])
  # The stream hands the step those targets beside each batch's inputs, cut to its bucket, and no row index.
  batch = next(task.train_stream(trainer_lib.data_shards(config, sharding.make_mesh(devices=jax.devices()[:1]))))
  assert set(batch) == set(task.batch_spec(4, 16)) and batch["teacher_hidden"].shape[-1] == batch["input_ids"].shape[1]


@pytest.mark.parametrize("kind", ["workdir", "transformers"])
def test_a_training_workdir_or_a_transformers_folder_teaches_as_the_export_does(tmp_path, teacher, kind):
  export = teacher.workdir / "export"
  folder = teacher.workdir
  if kind == "transformers":  # written by transformers itself, without jbert's record of the task
    folder = tmp_path / "hf"
    transformers.BertForSequenceClassification.from_pretrained(export).save_pretrained(folder)
    record = json.loads((folder / "config.json").read_text())
    record.pop("jbert", None)
    (folder / "config.json").write_text(json.dumps(record))
    shutil.copy(export / "vocab.txt", folder / "vocab.txt")
  tokenizer = load_tokenizer(str(export / "vocab.txt"))
  built = [tasks.build_task(fd.finetune_config("distill", **settings(teacher, **{
      "task.teacher": str(path), "task.hidden_weight": 0.0})), tokenizer) for path in (export, folder)]
  assert tasks.architecture_source(fd.finetune_config("distill", **settings(teacher, **{
      "task.teacher": str(folder)})))[1] == {"num_hidden_layers": 1}
  logits = [task.train_features()["teacher_logits"] for task in built]
  np.testing.assert_allclose(logits[1], logits[0], atol=1e-5)
  assert built[1].label_names == ("no", "yes") and built[1].num_labels == 2


def test_the_student_starts_as_the_teachers_listed_layers(teacher):
  config = fd.finetune_config("distill", **settings(teacher))
  export = str(teacher.workdir / "export")
  source, shape = tasks.architecture_source(config)
  assert (source, shape) == (export, {"num_hidden_layers": 1})
  task = tasks.build_task(config)
  student_config, params = jbert.load_pretrained(export, jbert.BertForSequenceClassification)
  start = task.load_init(export, student_config.replace(num_hidden_layers=1), seed=0, fresh=None)
  bert = params["bert"]
  np.testing.assert_array_equal(start["bert"]["encoder"]["layer_0"]["mlp"]["wi"]["kernel"],
                                bert["encoder"]["layer_1"]["mlp"]["wi"]["kernel"])
  assert set(start["bert"]["encoder"]) == {"layer_0"}
  for path in (("classifier", "kernel"), ("bert", "embeddings", "word_embeddings", "embedding")):
    np.testing.assert_array_equal(start[path[0]][path[1]] if len(path) == 2 else
                                  start["bert"]["embeddings"]["word_embeddings"]["embedding"],
                                  params[path[0]][path[1]] if len(path) == 2 else
                                  bert["embeddings"]["word_embeddings"]["embedding"])


def test_a_scanned_student_starts_as_the_same_layer(teacher):
  config = fd.finetune_config("distill", **settings(teacher, **{"model.scan_layers": True}))
  export = str(teacher.workdir / "export")
  task = tasks.build_task(config)
  student_config, params = jbert.load_pretrained(export, jbert.BertForSequenceClassification)
  start = task.load_init(export, student_config.replace(num_hidden_layers=1, scan_layers=True), seed=0, fresh=None)
  np.testing.assert_array_equal(start["bert"]["encoder"]["layers"]["mlp"]["wi"]["kernel"],
                                params["bert"]["encoder"]["layer_1"]["mlp"]["wi"]["kernel"][None])


def test_distillation_brings_the_student_closer_to_the_teacher_on_the_training_set(tmp_path, teacher):
  """A student from another random model (`init_from`, its layers mapped uniformly), trained on the teacher alone
  (no gold labels, no dropout): the teacher-matching objectives over all 256 training rows fall. (A student from
  the teacher's own layers starts next to it, where the tiny teacher leaves nothing to show.)"""
  from jbert.train import trainer as train  # pylint: disable=import-outside-toplevel
  other = fd.tiny_checkpoint(tmp_path / "other", seed=1)
  config = fd.finetune_config("distill", **settings(teacher, **{
      "init_from": str(other), "task.student_layers": "", "task.hard_weight": 0.0, "keep_best": None,
      "model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0}))
  train.train_and_evaluate(config, str(tmp_path / "run"))
  task = tasks.build_task(config, load_tokenizer(str(teacher.workdir / "export" / "vocab.txt")))
  student_config, end = jbert.load_pretrained(tmp_path / "run" / "export", jbert.BertForSequenceClassification)
  start = task.load_init(str(other), student_config, seed=0, fresh=None)
  features = task.train_features()
  batch = {k: features[k] for k in task.batch_spec(1, 16) if k != "teacher_hidden"}
  batch["teacher_hidden"] = task.hidden_cache.batch(np.arange(256), 16)  # every row, as the stream rebuilds them
  model = task.model(student_config)
  values = [tasks.reported(task, task.loss(task.apply(model, p, batch, jax.random.key(0), deterministic=True),
                                           batch)) for p in (start, end)]
  assert float(values[1]["hidden"]) < 0.9 * float(values[0]["hidden"]), values
  assert float(values[1]["soft"]) < float(values[0]["soft"]), values


def test_the_export_is_a_smaller_classifier_that_transformers_and_predict_load_alike(distilled, teacher):
  assert sorted(trained.losses(distilled)) == list(range(1, STEPS + 1))
  lines = [json.loads(l) for l in (distilled / "metrics.jsonl").read_text().splitlines()]
  assert {"train/soft", "train/hard", "train/hidden", "train/agreement", "train/accuracy"} <= set(lines[0])
  export = distilled / "export"
  record = json.loads((export / "config.json").read_text())
  assert record["num_hidden_layers"] == 1 and record["jbert"] == {"task": "classification"}
  assert record["id2label"] == {"0": "no", "1": "yes"}
  dev = [line.split(",") for line in teacher.dev.read_text().splitlines()[1:17]]
  predicted = jbert.predict([(a, b) for a, b, _ in dev], str(export))
  model = transformers.BertForSequenceClassification.from_pretrained(export).eval()
  tok = transformers.BertTokenizer(str(export / "vocab.txt"))
  enc = tok([a for a, _, _ in dev], [b for _, b, _ in dev], return_tensors="pt", padding=True)
  with torch.no_grad():
    reference = torch.softmax(model(**enc).logits.double(), -1).numpy()
  np.testing.assert_allclose([[p["probabilities"]["no"], p["probabilities"]["yes"]] for p in predicted], reference,
                             atol=1e-5)
  results = json.loads((distilled / "results.json").read_text())
  assert set(results["metrics"]["validation"]) >= {"accuracy", "loss"}
  # keep_best as every task: the step of the lowest evaluation loss is what export/ holds.
  evals = {l["step"]: l["eval/loss"] for l in lines if "eval/loss" in l}
  assert sorted(evals) == [4, 8, 12, 16]
  best = min(evals, key=evals.get)
  assert results["best"] == {"metric": "loss", "mode": "min", "value": evals[best], "step": best}
  assert json.loads((distilled / "best" / "best.json").read_text()) == results["best"]
  assert ((export / "model.safetensors").read_bytes() == (distilled / "best" / "model.safetensors").read_bytes())


def test_kill_9_then_sigterm_then_the_same_command_resumes_to_the_uninterrupted_run(tmp_path, distilled, teacher):
  command = [sys.executable, "run.py", "--config=configs/finetune.py:distill", f"--workdir={tmp_path}",
             *(f"--config.{k}={v}" for k, v in settings(teacher).items())]
  proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  wait_for(tmp_path / "checkpoints" / "8", proc)
  proc.send_signal(signal.SIGKILL)
  assert proc.wait() == -signal.SIGKILL
  # The same command, preempted (SIGTERM) as soon as it has restored step 8 (the run is too short to aim later): it
  # stops at step 8 or 9, saved, and prints the command to resume.
  proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  lines = []
  for line in proc.stderr:
    lines.append(line)
    if f"(step 8 of {STEPS})" in line:
      proc.send_signal(signal.SIGTERM)
      break
  err = "".join(lines) + proc.communicate(timeout=240)[1]
  said = re.search(r"stopped at step (\d+) after SIGTERM; resume with: python run\.py "
                   r"--config=configs/finetune\.py:distill --workdir=", err)
  assert proc.returncode == 0 and said, err[-3000:]
  stopped = int(said.group(1))
  assert 8 <= stopped < STEPS, err[-3000:]
  assert (tmp_path / "checkpoints" / str(stopped)).exists() and not (tmp_path / "results.json").exists()
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0, done.stderr[-3000:]
  assert "task distill: the teacher's outputs of 256 rows" in done.stderr  # a run with steps left runs the teacher
  assert trained.losses(tmp_path) == trained.losses(distilled)
  ours, uninterrupted = (json.loads((w / "results.json").read_text()) for w in (tmp_path, distilled))
  assert ours["metrics"] == uninterrupted["metrics"] and ours["best"] == uninterrupted["best"]


@pytest.mark.parametrize("key, value", [("task.temperature", 4.0), ("task.teacher", "OTHER")])
def test_a_rerun_with_another_teacher_or_distillation_setting_is_refused(tmp_path, capsys, distilled, teacher, key,
                                                                          value):
  workdir = tmp_path / "run"
  shutil.copytree(distilled, workdir)
  if value == "OTHER":
    value = str(tmp_path / "teacher")
    shutil.copytree(teacher.workdir / "export", value)
  config = fd.finetune_config("distill", **settings(teacher, **{key: value, "total_steps": STEPS + 4}))
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_:
    run_py.execute(config, str(workdir))
  err = capsys.readouterr().err
  assert exit_.value.code == 2 and err.count("\n") == 1 and key in err and "allow_changes" in err, err


def test_a_learning_rate_allowed_on_the_finished_run_says_complete_and_rewrites_nothing(tmp_path, capsys, distilled,
                                                                                        teacher):
  from tests.test_workdir_record import hashes  # pylint: disable=import-outside-toplevel
  workdir = tmp_path / "run"
  shutil.copytree(distilled, workdir)
  before = hashes(workdir)
  capsys.readouterr()
  run_py.execute(fd.finetune_config("distill", **settings(teacher, **{
      "optim.learning_rate": 5e-5, "allow_changes": "optim.learning_rate"})), str(workdir))
  assert capsys.readouterr().out == (
      f"run.py: already complete at step {STEPS} ({workdir}), and nothing was changed: optim.learning_rate 0.001 -> "
      f"5e-05 would only change training, which is over; raise --config.total_steps above {STEPS} to train further "
      "with it, or pass another --workdir.\n")
  assert hashes(workdir) == before
  run_py.execute(fd.finetune_config("distill", **settings(teacher)), str(workdir))
  assert capsys.readouterr().out.startswith(f"run.py: already complete at step {STEPS} ({workdir}); raise")
  assert hashes(workdir) == before


def test_a_finished_run_of_epochs_says_complete_without_running_the_teacher(tmp_path, distilled, teacher):
  """The command a user reruns on a finished run whose length is set by epochs (one epoch of the 256 rows in
  batches of 16 is its 16 steps), as it was and with a training change allowed: complete, and the teacher's pass
  (minutes on a real run) never ran: no log line of it and no program compiled (the compile cache stays empty)."""
  from tests.test_workdir_record import hashes  # pylint: disable=import-outside-toplevel
  workdir, cache = tmp_path / "run", tmp_path / "xla"
  shutil.copytree(distilled, workdir)
  before = hashes(workdir)
  complete = f"run.py: already complete at step {STEPS} ({workdir})"
  for more, said in [({}, f"{complete}; raise --config.total_steps to train further, or pass another --workdir.\n"),
                     ({"optim.learning_rate": 5e-5, "allow_changes": "optim.learning_rate"},
                      f"{complete}, and nothing was changed: optim.learning_rate 0.001 -> 5e-05 would only change "
                      f"training, which is over; raise --config.total_steps above {STEPS} to train further with it, "
                      "or pass another --workdir.\n")]:
    keys = {k: v for k, v in settings(teacher, num_epochs=1.0, **more).items() if k != "total_steps"}  # None
    command = [sys.executable, "run.py", "--config=configs/finetune.py:distill", f"--workdir={workdir}",
               f"--compile_cache={cache}", *(f"--config.{k}={v}" for k, v in keys.items())]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert (done.returncode, done.stdout) == (0, said), done.stderr[-3000:]
    assert "the teacher's outputs of" not in done.stderr, done.stderr[-3000:]
    assert hashes(workdir) == before
    assert not [p for p in cache.rglob("*") if p.is_file()]


def test_outputs_written_again_on_the_finished_run_do_not_run_the_teacher(tmp_path, distilled, teacher):
  """An evaluation file changed deliberately on the finished run: its outputs are written again from the final
  checkpoint's (best) parameters, which needs no training batch and so no teacher pass."""
  workdir = tmp_path / "run"
  shutil.copytree(distilled, workdir)
  dev = shutil.copy(teacher.dev, tmp_path / "dev.csv")
  keys = settings(teacher, **{"task.eval_file": dev, "allow_changes": "task.eval_file"})
  command = [sys.executable, "run.py", "--config=configs/finetune.py:distill", f"--workdir={workdir}",
             *(f"--config.{k}={v}" for k, v in keys.items())]
  done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert done.returncode == 0 and "already complete" not in done.stdout, done.stderr[-3000:]
  assert "the teacher's outputs of" not in done.stderr, done.stderr[-3000:]
  ours, before = (json.loads((w / "results.json").read_text()) for w in (workdir, distilled))
  assert ours["config"]["task"]["eval_file"] == str(dev) and ours["step"] == STEPS
  assert ours["best"] == before["best"] and set(ours["metrics"]) == set(before["metrics"]) == {"validation"}
  ours, before = ours["metrics"]["validation"], before["metrics"]["validation"]
  assert ours.pop("confusion_matrix") == before.pop("confusion_matrix")
  assert ours == pytest.approx(before)


def test_the_tokenizer_is_said_to_come_from_the_teacher(teacher, caplog):
  from jbert.train import architecture, plan  # pylint: disable=import-outside-toplevel
  config = fd.finetune_config("distill", **settings(teacher))
  source, _ = tasks.architecture_source(config)
  caplog.set_level("INFO", logger="jbert")
  architecture.build_tokenizer(config.data, source, key=plan.source_key(config, source))
  assert f"tokenizer: {teacher.workdir / 'export' / 'vocab.txt'} (from task.teacher)" in caplog.text
  with_student = fd.finetune_config("distill", **settings(teacher, **{"init_from": str(teacher.checkpoint),
                                                                      "task.student_layers": ""}))
  assert plan.source_key(with_student, tasks.architecture_source(with_student)[0]) == "init_from"


def _bad_label_file(tmp_path):
  rows = [{"a": "w0 w1", "b": "w30", "label": "maybe"}, *fd.context_examples(8, seed=3)]
  return {"task.train_file": str(fd.write_rows(tmp_path / "bad.csv", rows))}


@pytest.mark.parametrize("case, message", [
    ("missing", "run.py: task.teacher={tmp}/nowhere does not exist; pass a fine-tuned classifier (a jbert export or "
                "workdir, or a Hugging Face folder with a classification head)."),
    ("pretrained", "run.py: task.teacher={ckpt} is a BertForPreTraining, not a BertForSequenceClassification: "
                   "distillation needs a fine-tuned sequence classifier or regressor as the teacher (fine-tune one "
                   "first with configs/finetune.py)."),
    ("label_names", "run.py: task.label_names names 3 classes but the teacher {export} has 2; name the teacher's "
                    "classes in its id order, or drop task.label_names."),
    ("label_value", "run.py: row 0 of {tmp}/bad.csv has label 'maybe', which is not in task.label_names ['no', "
                    "'yes']; add it to --config.task.label_names (class names in id order). The teacher {export} "
                    "has 2 classes no, yes: distil on labels of the teacher's classes, or drop task.label to train "
                    "on its outputs alone."),
    ("layers", "run.py: student layers [0, 5]: the teacher has 2 layers, so 5 is out of range; give strictly "
               "increasing teacher layer indices in 0..1, e.g. 0 for every other layer."),
    ("both", "run.py: task.student_layers=1 and init_from={tmp}/other both set the student; drop one of them."),
    ("vocabulary", "run.py: init_from={tmp}/other has another vocabulary than the teacher {export} (26 pieces, the "
                   "teacher's 46; 20 of the ids both have hold other pieces, the first id 6: 'v0', the teacher's "
                   "'w0'); the rows are tokenised once for both, so distil into a student with the teacher's "
                   "vocabulary, or start it from the teacher's layers (task.student_layers)."),
    # As many pieces as the teacher's: what differs is the pieces, not their count.
    ("same_size", "run.py: init_from={tmp}/other has another vocabulary than the teacher {export} (1 of the ids both "
                  "have hold other pieces, the first id 45: 'x39', the teacher's 'w39'); the rows are tokenised once "
                  "for both, so distil into a student with the teacher's vocabulary, or start it from the teacher's "
                  "layers (task.student_layers)."),
])
def test_bad_teachers_labels_and_layers_are_one_line_and_create_nothing(tmp_path, capsys, teacher, case, message):
  export = str(teacher.workdir / "export")
  change = {"missing": {"task.teacher": str(tmp_path / "nowhere")},
            "pretrained": {"task.teacher": str(teacher.checkpoint)},
            "label_names": {"task.label_names": "a,b,c"},
            "label_value": _bad_label_file(tmp_path) if case == "label_value" else {},
            "layers": {"task.student_layers": "0,5"},
            "both": {"init_from": str(tmp_path / "other")},
            "vocabulary": {"init_from": str(tmp_path / "other"), "task.student_layers": ""},
            "same_size": {"init_from": str(tmp_path / "other"), "task.student_layers": ""}}[case]
  if case in ("both", "vocabulary"):
    fd.tiny_checkpoint(tmp_path / "other", words=tuple(f"v{i}" for i in range(20)))
  if case == "same_size":
    fd.tiny_checkpoint(tmp_path / "other", words=(*fd.WORDS[:-1], "x39"))
  config = fd.finetune_config("distill", **settings(teacher, **change))
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_:
    run_py.execute(config, str(tmp_path / "run"))
  err = capsys.readouterr().err
  assert exit_.value.code == 2 and err.count("\n") == 1, err
  assert err.rstrip("\n") == message.format(tmp=tmp_path, ckpt=teacher.checkpoint, export=export)
  assert not (tmp_path / "run").exists()


def test_a_hidden_state_cache_over_its_cap_or_the_memory_is_refused_in_one_line_before_it_is_allocated(
    tmp_path, capsys, teacher, monkeypatch):
  from jbert.tasks.distillation import teacher_cache  # pylint: disable=import-outside-toplevel
  config = fd.finetune_config("distill", **settings(teacher))
  tokenizer = load_tokenizer(str(teacher.workdir / "export" / "vocab.txt"))
  built = tasks.build_task(config, tokenizer)
  built.train_features()
  tokens = built.hidden_cache.values.shape[0]  # the 256 rows' tokens, no padding
  assert 256 * 5 < tokens < 256 * 16
  cache = tokens * 2 * 64 * 4 + 256 * 2 * 4  # 2 states (embeddings, layer 2) x 64 float32s a token; the logits
  what = (f"run.py: task.hidden_weight>0 caches the teacher's hidden states of the training rows' tokens: "
          f"{cache / 2**20:.1f} MiB (256 rows, {tokens} tokens x 2 states x 64 float32)")
  ways = "set task.hidden_weight=0, lower data.max_seq_length or distil on fewer rows.\n"
  for key, memory, said in [
      ("teacher_cache_mib", 2**30, f", over task.teacher_cache_mib=0.5; raise it (up to 50% of the 1.0 GiB "
                                   f"available), {ways}"),
      ("memory", cache * 1.5, f", more than 50% of the {cache * 1.5 / 2**20:.1f} MiB available; {ways}")]:
    monkeypatch.setattr(teacher_cache, "memory_available", lambda memory=memory: int(memory))
    more = {"task.teacher_cache_mib": 0.5} if key == "teacher_cache_mib" else {}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
      run_py.execute(fd.finetune_config("distill", **settings(teacher, **more)), str(tmp_path / "run"))
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err == what + said, err
    assert not (tmp_path / "run").exists()
  monkeypatch.setattr(teacher_cache, "memory_available", lambda: int(cache * 2.5))  # fits in half of it
  built = tasks.build_task(config, tokenizer)
  built.train_features()
  assert built.hidden_cache.nbytes >= cache - 256 * 2 * 4


def test_a_student_from_init_from_maps_its_hidden_states_uniformly(teacher):
  config = fd.finetune_config("distill", **settings(teacher, **{"init_from": str(teacher.checkpoint),
                                                                "task.student_layers": ""}))
  assert tasks.architecture_source(config) == (str(teacher.checkpoint), {})
  task = tasks.build_task(config)
  assert task.layers is None and task.layer_map == (0, 1, 2) and task.init_path(str(teacher.checkpoint)) == str(
      teacher.checkpoint)
