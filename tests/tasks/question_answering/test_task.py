"""The SQuAD task on the shared trainer: loss parity with transformers, a generated task learned end to end,
SQuAD 2.0 on mocked TFDS with the official scores, and bad input refused before anything compiles."""
import json
import logging
import pathlib

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
import torch
import transformers

import jbert
from jbert.train import trainer as train
from jbert.model import BertConfig, BertForQuestionAnswering
from jbert.tasks import QuestionAnswering, build_task
from jbert.tasks.base import reported, training_loss
from jbert.tokenizer import load_tokenizer
from preemption import train_until_sigterm
import script_module
import trained

from tests.tasks import squad_data

REPO = pathlib.Path(__file__).resolve().parents[3]

official = script_module.load("tests/tasks/question_answering/squad_official.py")


def tiny_config(name, tmp_path, **overrides):
  """A from-scratch tiny BERT on 32-token windows of the generated data (vocab.txt written in tmp_path)."""
  return squad_data.tiny_config(name, squad_data.write_vocab(tmp_path / "vocab.txt"), **overrides)


def read_json(path):
  return json.loads(pathlib.Path(path).read_text(encoding="utf-8"))


def test_loss_matches_transformers_with_clamped_positions(tmp_path):
  """Same weights and batch: transformers' BertForQuestionAnswering loss (positions clamped to [0, T], T
  ignored), also when the global batch is split into micro-batches normalised by the global denominators."""
  bert_config = BertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=128, max_position_embeddings=32, scan_layers=False)
  config = tiny_config("squad", tmp_path, **{"data.max_seq_length": 16})
  task = QuestionAnswering.from_config(config)
  model = task.model(bert_config)
  params = jax.jit(lambda rng: nn.meta.unbox(model.init(rng, jnp.zeros((1, 8), jnp.int32))["params"]))(
      jax.random.key(3))
  jbert.save_pretrained(bert_config, params, tmp_path / "hf")
  torch_model = transformers.BertForQuestionAnswering.from_pretrained(tmp_path / "hf").eval()

  rng = np.random.default_rng(0)
  b, t = 8, 16
  mask = (np.arange(t) < rng.integers(9, t + 1, size=(b, 1))).astype(np.int32)
  batch = {"input_ids": rng.integers(5, 99, size=(b, t)).astype(np.int32) * mask,
           "token_type_ids": (np.arange(t) >= 6).astype(np.int32) * mask, "attention_mask": mask,
           # T and beyond are ignored (only for start in rows 2, 3; for end in row 5); -3 becomes [CLS].
           "start_positions": np.array([7, 0, t, t + 9, 3, 11, -3, 8], np.int32),
           "end_positions": np.array([9, 0, 12, 4, 3, t, 14, 8], np.int32)}

  @jax.jit
  def losses(params, batch):
    """The loss of the batch, and of each half normalised by the whole batch's denominators (as micro-batches)."""
    outputs = task.apply(model, params, batch, jax.random.key(0), deterministic=True)
    entries = task.loss(outputs, batch)
    denominators = {k: e.denominator for k, e in entries.items()}
    halves = [training_loss(task, task.loss(task.apply(model, params, part, jax.random.key(0), deterministic=True),
                                            part), denominators)
              for part in ({k: v[:4] for k, v in batch.items()}, {k: v[4:] for k, v in batch.items()})]
    return training_loss(task, entries), halves, outputs, denominators, entries

  loss, halves, outputs, denominators, entries = losses(params, batch)
  assert {k: float(v) for k, v in denominators.items()} == {"start_loss": 6.0, "start_accuracy": 6.0,
                                                            "end_loss": 7.0, "end_accuracy": 7.0}
  with torch.no_grad():
    reference = torch_model(**{k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()})
  np.testing.assert_allclose(outputs.start_logits, reference.start_logits.numpy(), atol=1e-5)
  np.testing.assert_allclose(outputs.end_logits, reference.end_logits.numpy(), atol=1e-5)
  assert abs(float(loss) - reference.loss.item()) <= 1e-5
  assert abs(float(halves[0] + halves[1]) - float(loss)) <= 1e-5
  assert abs(float(reported(task, entries)["loss"]) - reference.loss.item()) <= 1e-5


def test_marked_span_is_learned_and_scored_as_the_official_script(tmp_path):
  """SQuAD 1.1 format from local files: a from-scratch tiny BERT finds the marked span (EM >= 90%) in a few
  hundred steps; results.json, the prediction files and the official v1.1 script agree."""
  train_file = squad_data.write_squad_json(tmp_path / "train.json", squad_data.marked_span_examples(1000, seed=1))
  dev_examples = squad_data.marked_span_examples(200, seed=2)
  dev_file = squad_data.write_squad_json(tmp_path / "dev.json", dev_examples)
  workdir = tmp_path / "run"
  config = tiny_config("squad", tmp_path, total_steps=150, **{"task.train_file": train_file,
                                                              "task.eval_file": dev_file})
  train.train_and_evaluate(config, str(workdir))

  losses = [l["train/loss"] for l in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
            if "train/loss" in l]
  assert losses[-1] < 0.2 * losses[0]
  results = read_json(workdir / "results.json")
  metrics = results["metrics"]["validation"]
  assert metrics["exact_match"] >= 90 and metrics["total"] == 200
  directory = workdir / "predictions" / "validation"
  assert sorted(results["files"]) == [str(directory / "nbest_predictions.json"),
                                      str(directory / "predictions.json")]
  predictions = read_json(directory / "predictions.json")
  assert list(predictions) == [ex["id"] for ex in dev_examples]
  scored = official.evaluate_v1(squad_data.to_squad_json(dev_examples)["data"], predictions)
  assert scored == {"exact_match": metrics["exact_match"], "f1": metrics["f1"]}
  # Answers are the original text between character offsets: "< w3 w7 >", spaces and markers included.
  gold = {ex["id"]: ex["answers"]["text"][0] for ex in dev_examples}
  assert sum(predictions[q] == gold[q] for q in gold) == round(2 * metrics["exact_match"])
  nbest = read_json(directory / "nbest_predictions.json")
  for qid, entries in nbest.items():
    assert 1 <= len(entries) <= 20 and entries[0]["text"] == predictions[qid]
    assert len({e["text"] for e in entries}) == len(entries)
    scores = [e["start_logit"] + e["end_logit"] for e in entries]
    assert scores == sorted(scores, reverse=True)
    assert abs(sum(e["probability"] for e in entries) - 1) < 1e-6
  # The exported model is a transformers BertForQuestionAnswering.
  assert transformers.BertForQuestionAnswering.from_pretrained(workdir / "export").config.architectures == [
      "BertForQuestionAnswering"]


def test_squad_v2_on_mock_tfds_from_a_transformers_checkpoint(tmp_path):
  """SQuAD 2.0 through TFDS (mocked with generated examples), fine-tuned from a transformers checkpoint:
  results.json holds the official v2.0 scores of the written files, HasAns/NoAns and the threshold search."""
  splits = {"train": squad_data.marked_span_examples(96, seed=3, unanswerable_every=3),
            "validation": squad_data.marked_span_examples(48, seed=4, unanswerable_every=3)}
  hf_config = transformers.BertConfig(vocab_size=len(squad_data.VOCAB), hidden_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)
  torch.manual_seed(0)
  transformers.BertModel(hf_config, add_pooling_layer=False).save_pretrained(tmp_path / "hf")
  squad_data.write_vocab(tmp_path / "hf" / "vocab.txt")
  config = tiny_config("squad_v2", tmp_path, total_steps=12, init_from=str(tmp_path / "hf"))
  config.model.preset = config.data.vocab = None
  for key in ("hidden_size", "num_attention_heads", "intermediate_size", "max_position_embeddings"):
    config.model[key] = None
  workdir = tmp_path / "run"
  with tfds.testing.mock_data(as_data_source_fn=lambda self, split, **kwargs: splits[split]):
    train.train_and_evaluate(config, str(workdir))

  metrics = read_json(workdir / "results.json")["metrics"]["validation"]
  directory = workdir / "predictions" / "validation"
  predictions = read_json(directory / "predictions.json")
  null_odds = read_json(directory / "null_odds.json")
  nbest = read_json(directory / "nbest_predictions.json")
  dataset = squad_data.to_squad_json(splits["validation"])["data"]
  scored = official.evaluate_v2(dataset, predictions)
  assert {("exact_match" if k == "exact" else k): v for k, v in scored.items()} == {
      k: v for k, v in metrics.items() if not k.startswith("best_")}
  assert metrics["HasAns_total"] == 32 and metrics["NoAns_total"] == 16
  # The threshold search: the official script over the best non-null span of every question and null_odds.json.
  best_spans = {q: next((e["text"] for e in entries if e["text"]), "") for q, entries in nbest.items()}
  searched = official.evaluate_v2(dataset, best_spans, null_odds)
  assert {k: metrics[k] for k in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")} == {
      k: searched[k] for k in ("best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh")}
  # predictions.json applies the default threshold 0.0 to the same odds.
  assert predictions == {q: "" if null_odds[q] > 0.0 else best_spans[q] for q in predictions}
  logged = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert {"eval/HasAns_f1", "eval/NoAns_exact", "eval/best_f1_thresh"} <= set(logged[-1])

  # The same command with another threshold predicts again from the final checkpoint, without training.
  threshold = float(np.median(list(null_odds.values())))
  config.task.null_score_diff_threshold = threshold
  with tfds.testing.mock_data(as_data_source_fn=lambda self, split, **kwargs: splits[split]):
    train.train_and_evaluate(config, str(workdir))
  again = read_json(directory / "predictions.json")
  assert again == {q: "" if null_odds[q] > threshold else best_spans[q] for q in predictions}
  assert 0 < sum(a == "" for a in again.values()) < len(again)
  rescored = official.evaluate_v2(dataset, again)
  assert read_json(workdir / "results.json")["metrics"]["validation"]["f1"] == rescored["f1"]
  assert [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()] == logged


def test_random_mock_squad_answers_are_reported_and_an_unusable_train_split_refused(tmp_path, monkeypatch):
  compiled = []
  monkeypatch.setattr(jax, "jit", lambda *a, **k: compiled.append(a) or pytest.fail("compiled"))
  with tfds.testing.mock_data(num_examples=4):
    with pytest.raises(ValueError, match=r"TFDS squad/v1.1 train: none of its 4 examples can be trained on \(0 "
                                         r"without context tokens, 4 with an answer not at its answer_start\)"):
      train.train_and_evaluate(tiny_config("squad", tmp_path), str(tmp_path / "run"))
  assert not compiled and not (tmp_path / "run").exists()


def test_bad_examples_are_reported_by_id_and_skipped_in_training(tmp_path, caplog):
  examples = squad_data.marked_span_examples(6, seed=5)
  examples[1]["answers"]["answer_start"] = [examples[1]["answers"]["answer_start"][0] + 1]
  examples[2]["context"], examples[2]["answers"] = "   ", {"text": [" "], "answer_start": [0]}
  examples[3]["question"] = "where is the marked span ? " * 3
  path = squad_data.write_squad_json(tmp_path / "train.json", examples)
  dev = squad_data.write_squad_json(tmp_path / "dev.json", squad_data.marked_span_examples(3, seed=6))
  config = tiny_config("squad", tmp_path, **{"task.train_file": path, "task.eval_file": dev})
  with caplog.at_level(logging.INFO, logger="jbert"):
    task = build_task(config, load_tokenizer(config.data.vocab))
  assert sorted(set(task._train["example_id"].tolist())) == [0, 3, 4, 5]  # pylint: disable=protected-access
  windows = len(task._train["input_ids"])  # pylint: disable=protected-access
  assert windows > 4  # some contexts need two windows
  assert (f"{path}: {windows} training windows from 4 of its 6 questions (max_seq_length "
          f"{config.data.max_seq_length}, doc_stride {config.task.doc_stride} tokens between window starts, "
          "max_query_length 8).") in caplog.text
  assert f"{path}: 1 of 6 questions are longer than max_query_length=8 tokens and were cut to it (s5-3)." in caplog.text
  assert f"{path}: 1 examples have a context without any token (s5-2); skipped." in caplog.text
  assert (f"{path}: 1 examples have an answer whose text is not at its answer_start in the context (s5-1); "
          "skipped.") in caplog.text


@pytest.mark.parametrize("overrides, error, message", [
    ({"task.eval_file": "/nonexistent/dev.json"}, FileNotFoundError,
     r"task squad: the validation file /nonexistent/dev.json \(--config.task.eval_file\) does not exist"),
    ({"task.max_query_length": 29}, ValueError,
     r"max_seq_length=32 leaves no room for the context after a 29-token question"),
    ({"task.n_best_size": 0}, ValueError, r"n_best_size=0 and max_answer_length=30 must both be >= 1"),
])
def test_bad_settings_fail_before_compiling(tmp_path, monkeypatch, overrides, error, message):
  compiled = []
  monkeypatch.setattr(jax, "jit", lambda *a, **k: compiled.append(a) or pytest.fail("compiled"))
  with pytest.raises(error, match=message):
    train.train_and_evaluate(tiny_config("squad", tmp_path, **overrides), str(tmp_path / "run"))
  assert not compiled and not (tmp_path / "run").exists()


@pytest.mark.parametrize("train_examples, dev_examples, message", [
    (squad_data.marked_span_examples(4, seed=6, unanswerable_every=3), squad_data.marked_span_examples(2, seed=7),
     r"train.json: example 's6-0' has no answer: it is a SQuAD 2.0 unanswerable question. Train and score such "
     r"data with configs/finetune.py:squad_v2"),
    (squad_data.marked_span_examples(4, seed=6), squad_data.marked_span_examples(3, seed=7, unanswerable_every=2),
     r"dev.json: example 's7-0' has no answer"),
    (squad_data.marked_span_examples(4, seed=6), [], r"dev.json has no questions"),
])
def test_bad_files_fail_before_compiling(tmp_path, monkeypatch, train_examples, dev_examples, message):
  files = {"task.train_file": squad_data.write_squad_json(tmp_path / "train.json", train_examples),
           "task.eval_file": squad_data.write_squad_json(tmp_path / "dev.json", dev_examples)}
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled"))
  with pytest.raises(ValueError, match=message):
    train.train_and_evaluate(tiny_config("squad", tmp_path, **files), str(tmp_path / "run"))
  assert not (tmp_path / "run").exists()


def _losses(workdir):
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return {l["step"]: l["train/loss"] for l in map(json.loads, lines) if "train/loss" in l}


def test_preempted_then_resumed_bit_identically(tmp_path_factory, tmp_path, caplog):
  """SIGTERM mid-run, then the same config again: the doc-stride windows, dropout and the SQuAD 2.0 outputs
  resume exactly (kill -9 is tested on the shared fine-tuning path in test_finetune_durability.py)."""
  reference = trained.squad_v2(tmp_path_factory)  # uninterrupted; jbert.predict's tests use it too
  config, total = reference.config(), trained.SQUAD_STEPS
  assert sorted(reference.losses) == list(range(1, total + 1))

  workdir = tmp_path / "stopped"
  train_until_sigterm(config, workdir, workdir / "checkpoints" / "8")
  assert not (workdir / "results.json").exists()
  saved = max(int(p.name) for p in (workdir / "checkpoints").iterdir() if p.name.isdigit())
  assert 8 <= saved == max(_losses(workdir)) < total
  with caplog.at_level(logging.INFO):
    train.train_and_evaluate(config, str(workdir))
  assert f"resumed from checkpoint step {saved}" in caplog.text
  assert _losses(workdir) == reference.losses  # exact float equality at every step, before and after the stop
  for name in ("predictions.json", "null_odds.json", "nbest_predictions.json"):
    assert (read_json(workdir / "predictions" / "validation" / name)
            == read_json(reference.workdir / "predictions" / "validation" / name))
