"""Sequence classification and regression on the shared trainer: losses equal transformers', a generated task
that needs both segments is learnt, local files and bad input, and the metrics equal scikit-learn's/scipy's."""
import csv
import json
import pathlib

import flax.linen as nn
import jax
import numpy as np
import pytest
import scipy.special
import scipy.stats
import sklearn.metrics
import torch
import transformers

import jbert
from jbert.train import trainer as train
from jbert.train import workdir_record
from jbert.tasks.classification.metrics import classification_metrics, classifier_report, evaluation_loss
from jbert.model import init_params
from jbert.tasks import build_task
from jbert.tasks.base import training_loss
from tests.tasks import finetune_data as fd
import shared_runs


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
  loss = float(training_loss(task, task.loss(out, batch)))
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
def learnt(tmp_path_factory):
  """A tiny random BERT fine-tuned on the generated two-segment task (local CSV files), as users run it; made
  once per test run (shared_runs)."""
  def build(root):
    checkpoint = fd.tiny_checkpoint(root / "ckpt")
    config = fd.finetune_config("local", init_from=str(checkpoint), num_epochs=3.0, eval_every_steps=100,
                                **fd.local_overrides(root / "data", n_train=2000, n_eval=200,
                                                     **{"optim.learning_rate": 1e-3}))
    train.train_and_evaluate(config, str(root / "run"))
    return root / "run"
  return shared_runs.once(tmp_path_factory, "classification_learnt", build)


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


def test_progress_counts_real_tokens_and_logs_the_padding_fraction(learnt):
  import ml_collections  # pylint: disable=import-outside-toplevel
  recorded = json.loads((learnt / "config.json").read_text())["config"]
  stream = train.plan(ml_collections.ConfigDict(recorded)).batches  # the run's batches again
  masks = [next(stream)["attention_mask"] for _ in range(188)]
  previous = 1  # the first step (compilation) stays out of the rates
  for line in (l for l in _metrics(learnt) if "train/loss" in l):
    window = masks[previous:line["step"]]  # step s trained on batch s - 1
    real, padded = sum(int(m.sum()) for m in window), sum(m.size for m in window)
    assert line["train/padding_fraction"] == pytest.approx(1 - real / padded, abs=1e-12)
    assert line["train/tokens_per_sec"] == pytest.approx(line["train/steps_per_sec"] * real / len(window),
                                                         rel=1e-9)
    previous = line["step"]
  assert previous == 188


def test_outputs_predictions_and_an_export_that_transformers_loads_with_label_names(learnt):
  with open(learnt / "predictions" / "validation.tsv", encoding="utf-8", newline="") as f:
    header, *rows = list(csv.reader(f, delimiter="\t"))
  assert header == ["index", "text_a", "text_b", "label", "prediction", "p_no", "p_yes"] and len(rows) == 200
  dev = (learnt.parent / "data" / "dev.csv").read_text().splitlines()[1:]
  # The input texts and the gold label stand beside each prediction, in the file's order.
  assert [r[1:4] for r in rows] == [line.split(",") for line in dev]
  gold = [line.rsplit(",", 1)[1] for line in dev]
  predicted = [r[4] for r in rows]
  assert [r[0] for r in rows] == [str(i) for i in range(200)]
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
  with pytest.raises(FileNotFoundError, match="^init_from=/nonexistent/never/read does not exist"):  # even resuming
    train.train_and_evaluate(config, str(learnt))
  assert (learnt / "metrics.jsonl").read_text() == before


def test_eval_file_without_labels_is_predicted_not_scored(tmp_path, checkpoint):
  overrides = fd.local_overrides(tmp_path / "data", n_train=64, n_eval=10)
  fd.write_rows(tmp_path / "data" / "dev.csv", fd.context_examples(10, seed=4), fields=("a", "b"))
  config = fd.finetune_config("local", init_from=str(checkpoint), total_steps=2, **overrides)
  train.train_and_evaluate(config, str(tmp_path / "run"))
  results = json.loads((tmp_path / "run" / "results.json").read_text())
  assert results["metrics"] == {}
  rows = (tmp_path / "run" / "predictions" / "validation.tsv").read_text().splitlines()
  assert rows[0] == "index\ttext_a\ttext_b\tprediction\tp_no\tp_yes" and len(rows) == 11  # no gold column


@pytest.mark.parametrize("change, message", [
    ({"task.name": "nope"}, r"unknown task 'nope'; known tasks: .*cola.*local.*sst2"),
    ({"task.text_a": "sentence"}, r"column\(s\) \['sentence'\] not in row 0 .*available columns: \['a', 'b', "
                                  r"'label'\].*--config.task.text_a"),
    ({"task.label_names": "no,maybe"}, r"label 'yes'.*not in task.label_names \['no', 'maybe'\]"),
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


def _labelled_files(directory: pathlib.Path, label) -> dict:
  """local_overrides with the generated rows' yes/no labels replaced by `label(row index, is_yes)`."""
  rows = [{**r, "label": label(i, r["label"] == "yes")} for i, r in enumerate(fd.context_examples(16, seed=1))]
  train_file = fd.write_rows(directory / "train.csv", rows)
  return {"task.train_file": str(train_file), "task.text_a": "a", "task.text_b": "b", "task.label": "label"}


@pytest.mark.parametrize("label, change, names, console", [
    (lambda i, yes: int(yes), {"task.label_names": "negative,positive"}, ("negative", "positive"), None),
    (lambda i, yes: int(yes), {"task.label_names": "0,1"}, ("0", "1"), None),
    (lambda i, yes: int(yes), {}, ("0", "1"),
     "task local: 2 classes named by their integer labels: 0,1 (name them with task.label_names)."),
    (lambda i, yes: i % 3 + 0.5, {}, None,
     "task local: the labels of {train} are non-integer numbers: training a regressor (say so with "
     "task.regression=True; name classes with task.label_names)."),
    (lambda i, yes: int(yes), {"task.regression": True}, None,
     "task local: regression on column 'label' (task.regression=True)."),
])
def test_integer_labels_are_named_or_counted_and_regression_is_chosen_aloud(tmp_path, caplog, label, change, names,
                                                                             console):
  files = _labelled_files(tmp_path, label)
  config = fd.finetune_config("local", **{**files, **change})
  with caplog.at_level("INFO", logger="jbert"):
    task = build_task(config, jbert.load_tokenizer(fd.write_vocab(tmp_path / "vocab")))
  assert task.label_names == names and task.regression == (names is None)
  expected = [label(i, r["label"] == "yes") for i, r in enumerate(fd.context_examples(16, seed=1))]
  np.testing.assert_allclose(task._train["label"], expected)  # pylint: disable=protected-access
  said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("task local:")]
  assert said == ([console.format(train=files["task.train_file"])] if console else [])


def test_word_labels_without_names_are_refused_with_the_names_to_give(tmp_path):
  files = _labelled_files(tmp_path, lambda i, yes: "pos" if yes else "neg")
  with pytest.raises(ValueError) as error:
    build_task(fd.finetune_config("local", **files), jbert.load_tokenizer(fd.write_vocab(tmp_path / "vocab")))
  assert str(error.value) == (f"the labels of {files['task.train_file']} (column 'label') are not numbers (2 distinct, "
                              "e.g. ['neg', 'pos']); name the classes in id order with "
                              "--config.task.label_names=neg,pos.")


def test_a_utf8_csv_with_a_bom_fine_tunes_as_embed_and_predict_read_it(tmp_path, checkpoint, caplog):
  rows = [{"sentence": f"{r['a']} {r['b']}", "label": int(r["label"] == "yes")} for r in fd.context_examples(32, 1)]
  plain = fd.write_rows(tmp_path / "plain.csv", rows, fields=("sentence", "label"))
  bom = tmp_path / "bom.csv"
  bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))
  config = fd.finetune_config("local", init_from=str(checkpoint), total_steps=1, **{
      "task.train_file": str(bom), "task.eval_file": str(bom), "task.text_a": "sentence", "task.label": "label"})
  with caplog.at_level("INFO", logger="jbert"):
    train.train_and_evaluate(config, str(tmp_path / "run"))
  results = json.loads((tmp_path / "run" / "results.json").read_text())
  assert results["step"] == 1 and set(results["metrics"]["validation"]) >= {"accuracy"}
  # The progress line shows the task's train accuracy beside the loss.
  trained = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
  assert f"step 1/1 | loss {trained['train/loss']:.3f} | acc {trained['train/accuracy']:.3f} | lr " in caplog.text
  assert json.loads((tmp_path / "run" / "export" / "config.json").read_text())["id2label"] == {"0": "0", "1": "1"}


def test_results_report_f1_precision_recall_confusion_and_loss_equal_to_scikit_learn(learnt):
  with open(learnt / "predictions" / "validation.tsv", encoding="utf-8", newline="") as f:
    rows = list(csv.DictReader(f, delimiter="\t"))
  names = ["no", "yes"]
  gold = [names.index(r["label"]) for r in rows]
  predicted = [names.index(r["prediction"]) for r in rows]
  probabilities = [[float(r["p_no"]), float(r["p_yes"])] for r in rows]
  got = json.loads((learnt / "results.json").read_text())["metrics"]["validation"]
  assert sorted(got) == ["accuracy", "confusion_matrix", "f1", "loss", "precision", "recall"]
  assert got["precision"] == pytest.approx(sklearn.metrics.precision_score(gold, predicted), abs=1e-12)
  assert got["recall"] == pytest.approx(sklearn.metrics.recall_score(gold, predicted), abs=1e-12)
  assert got["f1"] == pytest.approx(sklearn.metrics.f1_score(gold, predicted), abs=1e-12)
  assert got["confusion_matrix"] == sklearn.metrics.confusion_matrix(gold, predicted).tolist()
  assert got["loss"] == pytest.approx(sklearn.metrics.log_loss(gold, probabilities), abs=1e-4)  # p_ to 6 digits
  # metrics.jsonl logs the scalars of each evaluation; the matrix stays in results.json.
  last = [l for l in _metrics(learnt) if "eval/accuracy" in l][-1]
  assert {k: last[k] for k in ("eval/f1", "eval/precision", "eval/recall", "eval/loss")} == {
      f"eval/{k}": got[k] for k in ("f1", "precision", "recall", "loss")}
  assert "eval/confusion_matrix" not in last


@pytest.mark.parametrize("seed", [0, 1])
def test_classifier_report_and_loss_equal_scikit_learn(seed):
  rng = np.random.default_rng(seed)
  for num_labels, average in ((2, "binary"), (3, "macro"), (4, "macro")):
    y, p = rng.integers(0, num_labels, 50), rng.integers(0, num_labels, 50)
    if num_labels == 4:  # class 3 in neither array: left out of the macro mean, as sklearn does
      y, p = np.minimum(y, 2), np.minimum(p, 2)
    got = classifier_report(p, y, num_labels)
    precision, recall, f1, _ = sklearn.metrics.precision_recall_fscore_support(y, p, average=average,
                                                                               zero_division=0.0)
    assert (got["precision"], got["recall"], got["f1"]) == pytest.approx((precision, recall, f1), abs=1e-12)
    assert got["confusion_matrix"] == sklearn.metrics.confusion_matrix(y, p, labels=range(num_labels)).tolist()
    logits = rng.normal(size=(50, num_labels)) * 3
    assert evaluation_loss(logits, y, regression=False) == pytest.approx(
        sklearn.metrics.log_loss(y, scipy.special.softmax(logits, -1), labels=range(num_labels)), abs=1e-12)
  scores, gold = rng.normal(size=(40, 1)), rng.normal(size=40)
  assert evaluation_loss(scores, gold, regression=True) == pytest.approx(
      sklearn.metrics.mean_squared_error(gold, scores[:, 0]), abs=1e-12)
  # Nothing predicted positive (and no positive gold): 0 where sklearn divides by zero.
  zeros = np.zeros(10, int)
  assert classifier_report(zeros, zeros, 2) == {"precision": 0.0, "recall": 0.0, "f1": 0.0,
                                                "confusion_matrix": [[10, 0], [0, 0]]}


def test_prediction_files_hold_texts_and_gold_labels_for_classes_and_scores(tmp_path, vocab_file):
  from jbert.tasks.classification import sources  # pylint: disable=import-outside-toplevel
  from jbert.tasks.classification.task import SequenceClassification  # pylint: disable=import-outside-toplevel
  tokenizer = jbert.load_tokenizer(vocab_file)
  # A tab and a quote inside texts: the TSV quotes them, and csv reads back what the file held.
  rows = [{"a": 'ba "be"\tbi', "b": "bo", "label": "yes"}, {"a": "bu", "b": "da, de", "label": "no"}]
  dev, columns = tmp_path / "dev.jsonl", {"text_a": "a", "text_b": "b", "label": "label"}
  for names, label_of in ((("no", "yes"), lambda r: r["label"]), (None, lambda r: float(r["label"] == "yes") + 0.5)):
    dev.write_text("".join(json.dumps({**r, "label": label_of(r)}) + "\n" for r in rows), encoding="utf-8")
    task = SequenceClassification(sources.local_dataset("local", {"validation": str(dev)}, columns, names),
                                  max_seq_length=16, tokenizer=tokenizer)
    (eval_set,) = task.eval_sets()
    logits = np.array([[0.0, 2.0], [1.0, -1.0]]) if names else np.array([[0.25], [1.75]])
    (path,) = task.write_outputs(eval_set, {"logits": logits}, str(tmp_path / ("classes" if names else "scores")))
    with open(path, encoding="utf-8", newline="") as f:
      got = list(csv.reader(f, delimiter="\t"))
    texts = [["0", 'ba "be"\tbi', "bo"], ["1", "bu", "da, de"]]
    if names:
      assert got == [["index", "text_a", "text_b", "label", "prediction", "p_no", "p_yes"],
                     texts[0] + ["yes", "yes", "0.119203", "0.880797"],
                     texts[1] + ["no", "no", "0.880797", "0.119203"]]
    else:
      assert got == [["index", "text_a", "text_b", "label", "prediction"],
                     texts[0] + ["1.5", "0.250000"], texts[1] + ["0.5", "1.750000"]]


def test_a_regression_split_with_negative_targets_is_scored_with_its_mse(tmp_path, vocab_file):
  from jbert.tasks.classification import sources  # pylint: disable=import-outside-toplevel
  from jbert.tasks.classification.task import SequenceClassification  # pylint: disable=import-outside-toplevel
  targets = [-1.5, -0.25, 0.5, 2.0]
  dev = tmp_path / "dev.jsonl"
  dev.write_text("".join(json.dumps({"a": w, "label": t}) + "\n" for w, t in zip(("ba", "be", "bi", "bo"), targets)))
  dataset = sources.local_dataset("local", {"validation": str(dev)}, {"text_a": "a", "label": "label"})
  task = SequenceClassification(dataset, max_seq_length=8, tokenizer=jbert.load_tokenizer(vocab_file))
  (eval_set,) = task.eval_sets()
  assert eval_set.labelled  # -1 is a GLUE test split's "no label" for classes, a value like any other here
  scores = np.array([[-1.0], [0.0], [1.0], [1.5]])
  got = task.evaluate(eval_set, {"logits": scores})
  assert sorted(got) == ["loss", "pearson", "spearman"]
  assert got["loss"] == pytest.approx(sklearn.metrics.mean_squared_error(targets, scores[:, 0]), abs=1e-12)
  assert got["pearson"] == pytest.approx(scipy.stats.pearsonr(scores[:, 0], targets)[0], abs=1e-7)
