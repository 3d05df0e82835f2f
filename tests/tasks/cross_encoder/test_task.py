"""The cross_encoder preset: its losses equal sentence-transformers' (and torch's) on the same weights and pairs,
its export loads in sentence-transformers' CrossEncoder with the scores of jbert.predict and of the run's
prediction file, its metrics equal scikit-learn's, and bad labels are refused before anything compiles."""
import csv
import json
import shutil

import jax
import numpy as np
import pytest
import sklearn.metrics
import torch

import jbert
from jbert.inference.prediction import Predictor
from jbert.tasks import build_task
from jbert.tasks.cross_encoder import task as cross_encoder
from jbert.tasks.base import training_loss
from jbert.train import trainer as train
from tests.tasks import finetune_data as fd
from tests.tasks.conftest import tiny_config
import shared_runs


def _files(directory, n_train=64, n_eval=16, label=lambda yes: int(yes)):
  """The generated two-segment pairs with 0/1 (or `label`) targets, and the config keys naming them."""
  def rows(n, seed):
    return [{**r, "label": label(r["label"] == "yes")} for r in fd.context_examples(n, seed=seed)]
  return {"task.train_file": str(fd.write_rows(directory / "train.csv", rows(n_train, 1))),
          "task.eval_file": str(fd.write_rows(directory / "dev.csv", rows(n_eval, 2))),
          "task.text_a": "a", "task.text_b": "b", "task.label": "label"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A tiny cross-encoder trained a few steps by the trainer, as users run the preset (made once per run)."""
  def build(root):
    vocab = fd.write_vocab(root / "vocab")
    config = tiny_config("cross_encoder", str(vocab), total_steps=4, **_files(root / "data"))
    train.train_and_evaluate(config, str(root / "run"))
    return root
  return shared_runs.once(tmp_path_factory, "cross_encoder_trained", build)


def _pairs(root):
  with open(root / "run" / "predictions" / "validation.tsv", encoding="utf-8", newline="") as f:
    header, *rows = list(csv.reader(f, delimiter="\t"))
  return header, rows


def test_the_export_loads_in_sentence_transformers_with_the_scores_of_jbert(trained, tmp_path):
  from sentence_transformers import CrossEncoder  # pylint: disable=import-outside-toplevel
  header, rows = _pairs(trained)
  assert header == ["index", "text_a", "text_b", "label", "score", "logit"] and len(rows) == 16
  pairs = [(r[1], r[2]) for r in rows]
  export = trained / "run" / "export"
  reference = CrossEncoder(str(export), device="cpu")
  assert reference.num_labels == 1 and isinstance(reference.activation_fn, torch.nn.Sigmoid)
  assert reference.max_length == 32  # the run's data.max_seq_length
  expected = reference.predict(pairs, batch_size=8)
  predicted = jbert.predict(pairs, str(export), batch_size=4)
  assert set(predicted[0]) == {"score", "logit"}
  np.testing.assert_allclose([p["score"] for p in predicted], expected, atol=1e-5)
  np.testing.assert_allclose([float(r[4]) for r in rows], expected, atol=1e-5)
  np.testing.assert_allclose([1 / (1 + np.exp(-p["logit"])) for p in predicted], expected, atol=1e-6)
  # The export and the workdir record the kind that trained them, which jbert.predict looks up; the same weights
  # in a plain transformers folder are a one-label regressor, served as transformers reads one.
  assert json.loads((export / "config.json").read_text())["jbert"] == {"task": "cross_encoder"}
  assert Predictor(trained / "run").kind == Predictor(export).kind == "cross_encoder"
  plain = shutil.copytree(export, tmp_path / "plain", ignore=shutil.ignore_patterns("*sentence*", "modules.json"))
  record = json.loads((plain / "config.json").read_text())
  del record["jbert"]
  (plain / "config.json").write_text(json.dumps(record))
  values = jbert.predict(pairs, str(plain), batch_size=4, max_length=32)
  np.testing.assert_allclose([p["value"] for p in values], [p["logit"] for p in predicted], atol=1e-5)
  results = json.loads((trained / "run" / "results.json").read_text())["metrics"]["validation"]
  assert sorted(results) == ["accuracy", "average_precision", "f1", "loss", "precision", "recall"]
  gold = np.array([float(r[3]) for r in rows])
  assert results["average_precision"] == pytest.approx(sklearn.metrics.average_precision_score(gold, expected),
                                                       abs=1e-6)
  assert results["accuracy"] == pytest.approx(np.mean((expected > 0.5) == gold), abs=1e-12)
  assert results["loss"] == pytest.approx(torch.nn.BCEWithLogitsLoss()(
      torch.tensor([float(r[5]) for r in rows]), torch.tensor(gold)).item(), abs=1e-6)


@pytest.mark.parametrize("loss", ["bce", "mse"])
def test_the_loss_equals_sentence_transformers_on_the_same_weights_and_pairs(trained, loss):
  from sentence_transformers.cross_encoder import CrossEncoder, losses  # pylint: disable=import-outside-toplevel
  vocab = str(trained / "vocab" / "vocab.txt")
  soft = loss == "mse"  # scores in [0, 1] for the MSE, 0/1 labels for the BCE
  config = tiny_config("cross_encoder", vocab, **{"task.loss": loss, **_files(
      trained / f"data_{loss}", n_train=8, label=(lambda yes: 0.75 if yes else 0.25) if soft else int)})
  task = build_task(config, jbert.load_tokenizer(vocab))
  batch = {k: v for k, v in task._train.items() if k != "example_id"}  # pylint: disable=protected-access
  export = trained / "run" / "export"
  bert_config, params = jbert.load_pretrained(export, jbert.BertForSequenceClassification)
  model = task.model(bert_config)
  @jax.jit
  def loss_and_logits(params, batch):
    outputs = task.apply(model, params, batch, jax.random.key(0), deterministic=True)
    return training_loss(task, task.loss(outputs, batch)), outputs.logits
  got, logits = loss_and_logits(params, batch)
  got = float(got)

  reference = CrossEncoder(str(export), device="cpu").eval()
  module = (losses.MSELoss(reference, activation_fn=torch.nn.Sigmoid()) if soft
            else losses.BinaryCrossEntropyLoss(reference))
  with open(config.task.train_file, encoding="utf-8", newline="") as f:
    rows = list(csv.DictReader(f))
  with torch.no_grad():
    expected = module([[r["a"] for r in rows], [r["b"] for r in rows]],
                      torch.tensor([float(r["label"]) for r in rows])).item()
  assert got == pytest.approx(expected, abs=1e-5)
  if not soft:
    logits = torch.tensor(np.asarray(logits)[:, 0])
    assert got == pytest.approx(torch.nn.BCEWithLogitsLoss()(logits, torch.tensor(batch["label"])).item(), abs=1e-6)


def test_average_precision_equals_scikit_learn_with_ties():
  rng = np.random.default_rng(0)
  for _ in range(20):
    labels = rng.integers(0, 2, 30)
    scores = rng.integers(0, 6, 30) / 5.0  # many ties
    assert cross_encoder.average_precision(scores, labels) == pytest.approx(
        sklearn.metrics.average_precision_score(labels, scores), abs=1e-12)
  assert cross_encoder.average_precision(np.ones(3), np.zeros(3)) == 0.0


def test_scored_pairs_report_pearson_and_spearman():
  gold = np.array([0.1, 0.4, 0.35, 0.8])
  logits = np.array([[-2.0], [0.5], [0.0], [3.0]])
  got = cross_encoder.evaluate("mse", logits, gold)
  assert sorted(got) == ["loss", "pearson", "spearman"] and got["spearman"] == pytest.approx(1.0)
  assert got["loss"] == pytest.approx(np.mean((1 / (1 + np.exp(-logits[:, 0])) - gold) ** 2), abs=1e-12)


@pytest.mark.parametrize("change, message", [
    ({"task.loss": "hinge"}, "task.loss='hinge'; a cross-encoder trains with one of bce, mse"),
    ({"task.text_b": None}, "task cross_encoder needs --config.task.text_a=COLUMN and --config.task.label=COLUMN "
                            "(and --config.task.text_b=COLUMN for the second text)."),
    ({"labels": 5}, "task cross_encoder: row 0 of {train} has label 5.0, outside [0, 1]; a cross-encoder's labels "
                    "are 0/1 or scores in [0, 1]: rescale the column (STS-B's 0-5 scores divided by 5)."),
])
def test_bad_settings_and_labels_are_refused_when_the_task_is_built(tmp_path, vocab_file, change, message):
  change = dict(change)
  scale = change.pop("labels", 1)
  files = _files(tmp_path, n_train=8, n_eval=4, label=lambda yes: scale * int(yes))
  config = tiny_config("cross_encoder", vocab_file, **{**files, **change})
  with pytest.raises(ValueError) as error:
    build_task(config, jbert.load_tokenizer(vocab_file))
  assert str(error.value).startswith(message.format(train=files["task.train_file"]))
