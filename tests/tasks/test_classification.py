"""Sequence classification and regression on the shared trainer: losses equal transformers', a generated task
that needs both segments is learnt, local files and bad input, and the metrics equal scikit-learn's/scipy's."""
import json
import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest
import scipy.stats
import sklearn.metrics
import torch
import transformers

import jbert
from jbert.train import trainer as train
from jbert.train import workdir_record
from jbert.data.finetune import classification_metrics
from jbert.model import init_params
from jbert.tasks import build_task
from tests.tasks import finetune_data as fd


@pytest.mark.parametrize("num_labels", [3, 1])
def test_loss_equals_transformers_sequence_classification(tmp_path, num_labels):
  config = jbert.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=32)
  model = jbert.BertForSequenceClassification(config, num_labels=num_labels)
  params = nn.meta.unbox(init_params(model, jax.random.key(3)))
  jbert.save_pretrained(config, params, tmp_path, jbert.BertForSequenceClassification)
  reference = transformers.BertForSequenceClassification.from_pretrained(tmp_path).eval()
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 64, (6, 12)).astype(np.int32)
  mask = (np.arange(12)[None] < rng.integers(4, 13, (6, 1))).astype(np.int32)
  labels = rng.normal(size=6).astype(np.float32) if num_labels == 1 else rng.integers(0, 3, 6).astype(np.int32)
  batch = {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": mask, "label": labels}

  cfg = fd.finetune_config("stsb" if num_labels == 1 else "mnli")
  task = build_task(cfg)
  out = task.apply(model, params, batch, jax.random.key(0), deterministic=True)
  loss = float(task.loss(task.loss_sums(out, batch), task.loss_totals(batch)))
  with torch.no_grad():
    expected = reference(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask),
                         token_type_ids=torch.zeros(ids.shape, dtype=torch.long),
                         labels=torch.tensor(labels if num_labels == 1 else labels.astype(np.int64))).loss.item()
  assert reference.config.problem_type == ("regression" if num_labels == 1 else "single_label_classification")
  assert abs(loss - expected) <= 1e-5 * max(1.0, abs(expected))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  return fd.tiny_checkpoint(tmp_path_factory.mktemp("ckpt"))


@pytest.fixture(scope="module")
def learnt(tmp_path_factory, checkpoint):
  """A tiny random BERT fine-tuned on the generated two-segment task (local CSV files), as users run it."""
  root = tmp_path_factory.mktemp("learnt")
  config = fd.finetune_config("local", init_from=str(checkpoint), num_epochs=3.0, eval_every_steps=100,
                              **fd.local_overrides(root / "data", n_train=2000, n_eval=200,
                                                   **{"optim.learning_rate": 1e-3}))
  workdir = root / "run"
  train.train_and_evaluate(config, str(workdir))
  return workdir


def _metrics(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_a_task_that_needs_both_segments_is_learnt(learnt):
  lines = _metrics(learnt)
  losses = [l["train/loss"] for l in lines if "train/loss" in l]
  assert losses[-1] < 0.5 * losses[0]
  evals = [l for l in lines if "eval/accuracy" in l]
  assert [l["step"] for l in evals] == [100, 188]
  results = json.loads((learnt / "results.json").read_text())
  assert results["metrics"]["validation"]["accuracy"] >= 0.95
  assert evals[-1]["eval/accuracy"] == results["metrics"]["validation"]["accuracy"]
  assert results["step"] == 188 and results["seed"] == 0 and results["task"] == "local"


def test_outputs_predictions_and_an_export_that_transformers_loads_with_label_names(learnt):
  rows = (learnt / "predictions" / "validation.tsv").read_text().splitlines()
  assert rows[0] == "index\tprediction\tp_no\tp_yes" and len(rows) == 201
  dev = (learnt.parent / "data" / "dev.csv").read_text().splitlines()[1:]
  gold = [line.rsplit(",", 1)[1] for line in dev]
  predicted = [r.split("\t")[1] for r in rows[1:]]
  assert [r.split("\t")[0] for r in rows[1:]] == [str(i) for i in range(200)]
  assert np.mean(np.array(predicted) == np.array(gold)) >= 0.95

  model = transformers.BertForSequenceClassification.from_pretrained(learnt / "export").eval()
  assert model.config.id2label == {0: "no", 1: "yes"}
  tok = transformers.BertTokenizer(str(learnt / "export" / "vocab.txt"))
  texts = [line.rsplit(",", 1)[0].split(",") for line in dev[:16]]
  enc = tok([a for a, _ in texts], [b for _, b in texts], return_tensors="pt", padding=True)
  with torch.no_grad():
    labels = model(**enc).logits.argmax(-1).tolist()
  assert [model.config.id2label[i] for i in labels] == predicted[:16]


def test_the_exported_and_the_workdir_checkpoint_load_with_their_head_and_labels(learnt):
  info = jbert.describe(learnt)
  assert info.head.cls is jbert.BertForSequenceClassification and info.label_names == ("no", "yes")
  assert info.num_labels == 2
  _, params = jbert.load_pretrained(learnt, jbert.BertForSequenceClassification)
  _, exported = jbert.load_pretrained(learnt / "export", jbert.BertForSequenceClassification)
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(exported)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_rerunning_a_finished_fine_tuning_does_not_train_again(learnt):
  before = (learnt / "metrics.jsonl").read_text()
  config = fd.finetune_config("local", init_from="/nonexistent/never/read", num_epochs=3.0, eval_every_steps=100,
                              **fd.local_overrides(learnt.parent / "data", n_train=2000, n_eval=200))
  with pytest.raises(ValueError, match="nonexistent"):  # init_from is checked even when resuming
    train.train_and_evaluate(config, str(learnt))
  assert (learnt / "metrics.jsonl").read_text() == before


def test_eval_file_without_labels_is_predicted_not_scored(tmp_path, checkpoint):
  overrides = fd.local_overrides(tmp_path / "data", n_train=64, n_eval=10)
  fd.write_rows(tmp_path / "data" / "dev.csv", fd.context_examples(10, seed=4), fields=("a", "b"))
  config = fd.finetune_config("local", init_from=str(checkpoint), total_steps=2, **overrides)
  train.train_and_evaluate(config, str(tmp_path / "run"))
  results = json.loads((tmp_path / "run" / "results.json").read_text())
  assert results["metrics"] == {}
  assert len((tmp_path / "run" / "predictions" / "validation.tsv").read_text().splitlines()) == 11


@pytest.mark.parametrize("change, message", [
    ({"task.name": "nope"}, r"unknown task 'nope'; known tasks: .*cola.*local.*sst2"),
    ({"task.text_a": "sentence"}, r"column\(s\) \['sentence'\] not in row 0 .*available columns: \['a', 'b', "
                                  r"'label'\].*--config.task.text_a"),
    ({"task.label_names": "no,maybe"}, r"label 'yes'.*not in label_list \['no', 'maybe'\]"),
    ({"task.train_file": "EMPTY"}, r"training split of local .* has no examples"),
    ({"task.train_file": "/no/such.csv"}, r"the train file /no/such.csv does not exist"),
    ({"model.hidden_size": 128}, r"another architecture \(hidden_size: checkpoint 64 vs config 128\)"),
    ({"data.vocab": "BIG"}, r"the tokenizer has 51 ids but init_from=.* has vocab_size=46"),
])
def test_bad_input_is_refused_before_compiling_and_writes_nothing(tmp_path, checkpoint, monkeypatch, change,
                                                                   message):
  overrides = fd.local_overrides(tmp_path / "data", n_train=64, n_eval=16)
  if change.get("task.train_file") == "EMPTY":
    change = {"task.train_file": str(fd.write_rows(tmp_path / "data" / "empty.csv", []))}
  if change.get("data.vocab") == "BIG":
    change = {"data.vocab": str(fd.write_vocab(tmp_path / "big", fd.WORDS + ("x1", "x2", "x3", "x4", "x5")))}
  config = fd.finetune_config("local", init_from=str(checkpoint), **{**overrides, **change})
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled"))
  with pytest.raises((ValueError, FileNotFoundError), match=message):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def test_a_workdir_of_another_head_is_refused(tmp_path, checkpoint):
  overrides = fd.local_overrides(tmp_path / "data", n_train=64, n_eval=16)
  config = fd.finetune_config("local", init_from=str(checkpoint), total_steps=1, **overrides)
  train.train_and_evaluate(config, str(tmp_path / "run"))
  three = {**overrides, "task.label_names": "no,yes,maybe"}
  with pytest.raises(workdir_record.ConfigDriftError, match=r"task.label_names 'no,yes' -> 'no,yes,maybe'"):
    train.train_and_evaluate(fd.finetune_config("local", init_from=str(checkpoint), total_steps=2, **three),
                             str(tmp_path / "run"))
  # Allowing the change does not make the checkpoint's 2-label head a 3-label one.
  allowed = fd.finetune_config("local", init_from=str(checkpoint), total_steps=2, allow_changes="task", **three)
  with pytest.raises(train.TrainingError, match=r"holds a BertForSequenceClassification with num_labels=2, but "
                                                r"this run trains a BertForSequenceClassification with num_labels=3"):
    train.train_and_evaluate(allowed, str(tmp_path / "run"))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_metrics_equal_scikit_learn_and_scipy(seed):
  rng = np.random.default_rng(seed)
  y, p = rng.integers(0, 2, 50), rng.integers(0, 2, 50)
  got = classification_metrics(["accuracy", "f1", "matthews_corr"], p, y)
  assert got["accuracy"] == pytest.approx(sklearn.metrics.accuracy_score(y, p), abs=1e-12)
  assert got["f1"] == pytest.approx(sklearn.metrics.f1_score(y, p), abs=1e-12)
  assert got["matthews_corr"] == pytest.approx(sklearn.metrics.matthews_corrcoef(y, p), abs=1e-12)
  y3, p3 = rng.integers(0, 3, 60), rng.integers(0, 3, 60)
  assert classification_metrics(["matthews_corr"], p3, y3)["matthews_corr"] == pytest.approx(
      sklearn.metrics.matthews_corrcoef(y3, p3), abs=1e-12)
  scores, gold = rng.normal(size=40), rng.integers(0, 6, 40).astype(float)  # integer gold: many ties
  got = classification_metrics(["pearson", "spearman"], scores, gold)
  assert got["pearson"] == pytest.approx(scipy.stats.pearsonr(scores, gold)[0], abs=1e-12)
  assert got["spearman"] == pytest.approx(scipy.stats.spearmanr(scores, gold)[0], abs=1e-12)


def test_metrics_on_degenerate_inputs_equal_scikit_learn():
  one_class = np.ones(10, int)
  with np.errstate(all="ignore"):
    assert classification_metrics(["matthews_corr"], one_class, one_class)["matthews_corr"] == \
        sklearn.metrics.matthews_corrcoef(one_class, one_class)
    assert classification_metrics(["f1"], np.zeros(10, int), np.zeros(10, int))["f1"] == \
        sklearn.metrics.f1_score(np.zeros(10, int), np.zeros(10, int), zero_division=0.0)
  tied = np.arange(10) % 3
  assert classification_metrics(["spearman"], tied, tied[::-1])["spearman"] == pytest.approx(
      scipy.stats.spearmanr(tied, tied[::-1])[0], abs=1e-12)


def test_a_one_label_regressor_workdir_loads_and_converts_without_guessing(tmp_path, checkpoint):
  rows = [{"a": r["a"], "b": r["b"], "label": float(len(r["a"]) % 5)} for r in fd.context_examples(64, seed=5)]
  train_file = fd.write_rows(tmp_path / "train.csv", rows)
  config = fd.finetune_config("local", init_from=str(checkpoint), total_steps=2, **{
      "task.train_file": str(train_file), "task.text_a": "a", "task.text_b": "b", "task.label": "label"})
  train.train_and_evaluate(config, str(tmp_path / "run"))
  info = jbert.describe(tmp_path / "run")
  assert info.head.cls is jbert.BertForSequenceClassification and info.num_labels == 1
  _, params = jbert.load_pretrained(tmp_path / "run", jbert.BertForSequenceClassification)
  assert params["classifier"]["kernel"].shape == (64, 1)
  from jbert import convert  # pylint: disable=import-outside-toplevel
  assert convert.main([str(tmp_path / "run"), str(tmp_path / "hf")]) == 0
  reference = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf")
  assert reference.config.num_labels == 1 and (tmp_path / "hf" / "vocab.txt").exists()
