"""NER through the shared trainer: transformers' loss, a generated task learnt end to end, CoNLL-2003 from TFDS,
exact resume after preemption, and bad files refused before anything compiles."""
import json
import logging
import pathlib

import jax
import numpy as np
import pytest
import seqeval.metrics as seqeval_metrics
import tensorflow_datasets as tfds
import torch
import transformers

from jbert.train import trainer as train
from jbert.tasks.token_classification.features import CONLL2003_NER_TAGS, IGNORE_INDEX
from jbert.model import BertConfig
from jbert.tasks import TokenClassification, build_task
from jbert.tasks.base import training_loss
from jbert.tokenizer import load_tokenizer
from preemption import train_until_sigterm
from tasks.conftest import WORDS

# The generated task: a marker word (tagged O) announces the entity after it: "per" one PER word, "loc" one
# LOC word, "org" two ORG words. Words get a "##s" piece at random, so labels sit on first sub-tokens.
ENTITIES = {"per": ["B-PER"], "loc": ["B-LOC"], "org": ["B-ORG", "I-ORG"]}


def marked_sentences(rng, n, min_words=4, max_words=14):
  sentences = []
  for _ in range(n):
    tokens, tags = [], []
    length = rng.integers(min_words, max_words + 1)
    while len(tokens) < length:
      marker = rng.choice(["per", "loc", "org", None, None, None])
      entity = ENTITIES.get(marker, [])
      tokens += [marker] * bool(marker) + [WORDS[rng.integers(len(WORDS))] + "s" * (rng.random() < 0.3)
                                           for _ in range(len(entity) or 1)]
      tags += ["O"] * bool(marker) + (entity or ["O"])
    sentences.append({"tokens": tokens, "tags": tags})
  return sentences


def write_conll(path, sentences, tagged=True):
  lines = ["-DOCSTART- -X- -X- O", ""]
  for s in sentences:
    lines += [f"{w} X X {t}" if tagged else w for w, t in zip(s["tokens"], s["tags"])] + [""]
  path.write_text("\n".join(lines), encoding="utf-8")
  return str(path)


def write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  return str(path)


def read_predictions(path):
  """Sentences of a predictions file as lists of columns."""
  blocks = pathlib.Path(path).read_text(encoding="utf-8").strip("\n").split("\n\n")
  return [list(zip(*(line.split(" ") for line in block.splitlines()))) for block in blocks]


def test_loss_and_predictions_equal_transformers(make_config, hf_twin):
  task = build_task(make_config("conll2003"))
  config = BertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=128, max_position_embeddings=64)
  params, hf = hf_twin(task.model(config), transformers.BertForTokenClassification)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 99, (6, 16)).astype(np.int32)
  mask = (np.arange(16) < rng.integers(6, 17, (6, 1))).astype(np.int32)
  labels = rng.integers(0, 9, (6, 16)).astype(np.int32)
  # Ignored: [CLS], padding and about a third of the rest (later sub-tokens of words).
  labels[(mask == 0) | (rng.random((6, 16)) < 0.3)] = IGNORE_INDEX
  labels[:, 0] = IGNORE_INDEX
  batch = {"input_ids": ids, "token_type_ids": np.zeros_like(ids), "attention_mask": mask, "labels": labels}
  model = task.model(config)

  @jax.jit
  def run(batch, denominators):  # (logits, loss normalised by `denominators`, predicted tags)
    outputs = task.apply(model, params, batch, jax.random.key(0), deterministic=True)
    return outputs.logits, training_loss(task, task.loss(outputs, batch), denominators), task.predictions(outputs,
                                                                                                        batch)

  denominators = {k: e.denominator for k, e in jax.jit(lambda b: task.loss(
      task.apply(model, params, b, jax.random.key(0), deterministic=True), b))(batch).items()}
  logits, loss, predictions = run(batch, denominators)
  with torch.no_grad():
    want = hf(**{k: torch.tensor(v, dtype=torch.long) for k, v in batch.items()})
  assert abs(float(loss) - float(want.loss)) <= 1e-5
  np.testing.assert_allclose(np.asarray(logits), want.logits.numpy(), atol=1e-5)
  assert np.array_equal(np.asarray(predictions["tags"]), want.logits.argmax(-1).numpy())
  # Micro-batches normalised by the global batch's denominators add up to the whole batch's loss.
  halves = [{k: v[s] for k, v in batch.items()} for s in (slice(0, 3), slice(3, 6))]
  parts = [float(run(h, denominators)[1]) for h in halves]
  assert abs(sum(parts) - float(loss)) <= 1e-5


def test_learns_marked_words_through_windows_and_writes_conll_predictions(tmp_path, make_config, vocab_file):
  rng = np.random.default_rng(0)
  train_file = write_conll(tmp_path / "train.txt", marked_sentences(rng, 2000, 4, 30))
  dev = marked_sentences(rng, 150) + marked_sentences(rng, 30, 26, 36)  # the long ones need 2-3 windows
  test = marked_sentences(rng, 20)
  workdir = tmp_path / "run"
  config = make_config("local", **{
      "task.kind": "ner", "task.train_file": train_file, "task.eval_file": write_jsonl(tmp_path / "dev.jsonl", dev),
      "task.test_file": write_conll(tmp_path / "test.txt", test, tagged=False), "batch_size": 32,
      "total_steps": 400, "log_every_steps": 50, "optim.learning_rate": 5e-3, "optim.warmup_steps": 10,
      "model.hidden_dropout_prob": 0.0, "model.attention_probs_dropout_prob": 0.0})
  train.train_and_evaluate(config, str(workdir))

  results = json.loads((workdir / "results.json").read_text())
  assert list(results["metrics"]) == ["validation"]  # the test file has no tags: predicted, not scored
  scores = results["metrics"]["validation"]
  assert scores["f1"] >= 0.95, scores
  assert {f"{t}/{k}" for t in ("PER", "LOC", "ORG") for k in ("precision", "recall", "f1", "support")} <= set(scores)
  losses = [l["train/loss"] for l in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines())
            if "train/loss" in l]
  assert losses[-1] < losses[0] / 10

  # The predictions file: word, gold, predicted; every word of every sentence, long ones included.
  predicted = read_predictions(workdir / "predictions" / "validation.conll")
  assert [list(s[0]) for s in predicted] == [s["tokens"] for s in dev]
  assert [list(s[1]) for s in predicted] == [s["tags"] for s in dev]
  gold, guess = [list(s[1]) for s in predicted], [list(s[2]) for s in predicted]
  tokenizer = load_tokenizer(vocab_file)
  assert all(sum(map(len, tokenizer.batch_ids(s["tokens"]))) > 30 for s in dev[150:])  # more than one window
  report = seqeval_metrics.classification_report(gold, guess, output_dict=True, zero_division=0)
  np.testing.assert_allclose(
      [scores["precision"], scores["recall"], scores["f1"], scores["accuracy"]],
      [seqeval_metrics.precision_score(gold, guess), seqeval_metrics.recall_score(gold, guess),
       seqeval_metrics.f1_score(gold, guess), seqeval_metrics.accuracy_score(gold, guess)], rtol=1e-12)
  for type_ in ("PER", "LOC", "ORG"):
    assert [scores[f"{type_}/{k}"] for k in ("precision", "recall", "f1", "support")] == pytest.approx(
        [report[type_][k] for k in ("precision", "recall", "f1-score", "support")], rel=1e-12)
  # Words beyond the first window are predicted as well as the others.
  assert seqeval_metrics.f1_score(gold[150:], guess[150:]) >= 0.9

  tested = read_predictions(workdir / "predictions" / "test.conll")
  assert [list(s[0]) for s in tested] == [s["tokens"] for s in test] and all(len(s) == 2 for s in tested)
  assert sorted(results["files"]) == sorted(str(workdir / "predictions" / f) for f in ("test.conll",
                                                                                        "validation.conll"))
  config_json = json.loads((workdir / "export" / "config.json").read_text())
  assert config_json["architectures"] == ["BertForTokenClassification"]
  assert list(config_json["id2label"].values()) == ["O", "B-LOC", "B-ORG", "I-ORG", "B-PER"]


def test_conll2003_from_tfds_scores_validation_and_test(tmp_path, make_config):
  rng = np.random.default_rng(1)
  names = {t: i for i, t in enumerate(CONLL2003_NER_TAGS)}

  def split(n):
    return [{"tokens": np.array([w.encode() for w in s["tokens"]], dtype=object),
             "ner": np.array([names[t] for t in s["tags"]]), "pos": np.zeros(len(s["tags"]), np.int64),
             "chunks": np.zeros(len(s["tags"]), np.int64)} for s in marked_sentences(rng, n)]
  data = {"train": split(64), "dev": split(12), "test": split(10)}
  workdir = tmp_path / "run"
  with tfds.testing.mock_data(as_data_source_fn=lambda *args, split=None, **kwargs: data[split]):
    train.train_and_evaluate(make_config("conll2003", total_steps=4, log_every_steps=2, batch_size=32),
                             str(workdir))
  results = json.loads((workdir / "results.json").read_text())
  assert sorted(results["metrics"]) == ["test", "validation"]
  evals = [l for l in map(json.loads, (workdir / "metrics.jsonl").read_text().splitlines()) if "eval/test/f1" in l]
  assert [l["step"] for l in evals] == [4] and "eval/validation/PER/f1" in evals[0]
  for name, n in (("validation", 12), ("test", 10)):
    predicted = read_predictions(workdir / "predictions" / f"{name}.conll")
    assert len(predicted) == n
    gold, guess = [list(s[1]) for s in predicted], [list(s[2]) for s in predicted]
    assert results["metrics"][name]["f1"] == pytest.approx(seqeval_metrics.f1_score(gold, guess), abs=1e-12)
    assert gold == [[CONLL2003_NER_TAGS[t] for t in ex["ner"]] for ex in data["dev" if name == "validation"
                                                                                else name]]


def test_preempted_then_resumed_bit_identically(tmp_path, make_config, caplog):
  """SIGTERM mid-run, then the same config again: the windowed NER stream, dropout masks and outputs resume
  exactly (kill -9 is tested on the shared fine-tuning path in test_finetune_durability.py)."""
  overrides = {"task.kind": "ner", "task.train_file": write_conll(tmp_path / "train.txt", marked_sentences(
      np.random.default_rng(2), 200)), "total_steps": 24, "log_every_steps": 1, "checkpoint_every_steps": 4,
               "async_checkpointing": True}
  config = make_config("local", **overrides)  # dropout on: its masks must resume exactly too

  def losses(workdir):
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
    return {l["step"]: l["train/loss"] for l in map(json.loads, lines) if "train/loss" in l}

  train.train_and_evaluate(config, str(tmp_path / "reference"))  # uninterrupted
  reference = losses(tmp_path / "reference")
  assert sorted(reference) == list(range(1, 25))

  stopped = tmp_path / "stopped"
  train_until_sigterm(config, stopped, stopped / "checkpoints" / "8")
  saved = max(int(p.name) for p in (stopped / "checkpoints").iterdir() if p.name.isdigit())
  assert 8 <= saved == max(losses(stopped)) < 24  # saved exactly where it stopped
  assert not (stopped / "results.json").exists()
  with caplog.at_level(logging.INFO):
    train.train_and_evaluate(config, str(stopped))
  assert f"state: resumed from checkpoint step {saved} " in caplog.text
  assert losses(stopped) == reference  # exact float equality at every step, before and after the stop
  assert (stopped / "results.json").exists() and (stopped / "export" / "config.json").exists()


def plain_tags(sentences):
  """`sentences` with IO tags: B-ORG I-ORG -> ORG ORG."""
  return [{**s, "tags": [t.split("-", 1)[-1] for t in s["tags"]]} for s in sentences]


def io_scores(gold, guess):
  """(precision, recall, F1, {type: support}) with an entity per maximal run of one plain tag, by hand."""
  def runs(sentences):
    found = set()
    for i, tags in enumerate(sentences):
      start = None
      for j, tag in enumerate([*tags, "O"]):
        if start is not None and tag != tags[start]:
          found.add((i, tags[start], start, j - 1))
          start = None
        if start is None and tag != "O":
          start = j
    return found
  true, predicted = runs(gold), runs(guess)
  p, r = len(true & predicted) / max(len(predicted), 1), len(true & predicted) / len(true)
  support = {t: sum(e[1] == t for e in true) for t in {e[1] for e in true}}
  return p, r, 2 * p * r / (p + r) if p + r else 0.0, support


def test_plain_tags_are_scored_as_io_entities_and_predicted_back(tmp_path, make_config):
  """PER/LOC/ORG without B-/I-: every type is scored (ORG too, which seqeval's default reads as O), with an entity
  per run of one type, and jbert.predict gives the plain tags back."""
  rng = np.random.default_rng(4)
  dev = plain_tags(marked_sentences(rng, 40))
  workdir = tmp_path / "run"
  train.train_and_evaluate(make_config("local", **{
      "task.kind": "ner", "task.train_file": write_conll(tmp_path / "train.txt", plain_tags(marked_sentences(rng, 64))),
      "task.eval_file": write_jsonl(tmp_path / "dev.jsonl", dev), "total_steps": 6}), str(workdir))
  scores = json.loads((workdir / "results.json").read_text())["metrics"]["validation"]
  assert {k.split("/")[0] for k in scores if "/" in k} == {"PER", "LOC", "ORG"}
  predicted = read_predictions(workdir / "predictions" / "validation.conll")
  gold, guess = [list(s[1]) for s in predicted], [list(s[2]) for s in predicted]
  assert gold == [s["tags"] for s in dev]
  precision, recall, f1, support = io_scores(gold, guess)
  assert 0 < precision < 1 and 0 < recall  # entities predicted, some right: the comparison below is not trivial
  assert support["ORG"] == sum(t == "org" for s in dev for t in s["tokens"]) > 0  # each "org" marks one ORG run
  assert [scores["precision"], scores["recall"], scores["f1"]] == pytest.approx([precision, recall, f1], rel=1e-12)
  assert {t: scores[f"{t}/support"] for t in support} == support
  config_json = json.loads((workdir / "export" / "config.json").read_text())
  assert list(config_json["id2label"].values()) == ["O", "LOC", "ORG", "PER"]
  from jbert.inference import prediction  # pylint: disable=import-outside-toplevel
  assert [p["tags"] for p in prediction.predict([s["tokens"] for s in dev], str(workdir / "export"))] == guess


def test_mixed_tag_schemes_are_refused_naming_examples(tmp_path, make_config, no_compiling):
  train_file = write_conll(tmp_path / "train.txt", [{"tokens": ["per", "ba", "loc", "be"],
                                                     "tags": ["O", "B-PER", "O", "LOC"]}])
  with pytest.raises(ValueError, match=r"^task local: .*train.txt: the tags mix prefixed ones \(B-PER\) with plain "
                                       r"ones \(LOC\), so entities have no single reading; prefix every entity tag"):
    train.train_and_evaluate(make_config("local", **{"task.kind": "ner", "task.train_file": train_file}),
                             str(tmp_path / "w"))
  with pytest.raises(ValueError, match=r"^task local: task.label_names: the tags mix prefixed ones \(B-PER\) with "
                                       r"plain ones \(LOC\)"):
    train.train_and_evaluate(make_config("local", **{"task.kind": "ner", "task.train_file": train_file,
                                                     "task.label_names": "O,B-PER,LOC", "task.crf": True}),
                             str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()


@pytest.fixture
def no_compiling(monkeypatch):
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled before refusing the input"))


def test_a_tag_outside_the_label_set_is_refused_naming_its_sentence(tmp_path, make_config, no_compiling):
  train_file = write_jsonl(tmp_path / "train.jsonl", [{"tokens": ["per", "ba"], "tags": ["O", "B-PER"]}])
  dev = write_jsonl(tmp_path / "dev.jsonl", [{"tokens": ["ba"], "tags": ["O"]}, {"tokens": ["be"], "tags": ["B-FOO"]}])
  config = make_config("local", **{"task.kind": "ner", "task.train_file": train_file, "task.eval_file": dev})
  with pytest.raises(ValueError, match=r"task local: line 2 of .*dev.jsonl has tag 'B-FOO', which is not in the "
                                       r"label set \['O', 'B-PER'\]. Fix the tag, or list every tag in "
                                       "--config.task.label_names"):
    train.train_and_evaluate(config, str(tmp_path / "w"))
  config = make_config("conll2003", **{"task.train_file": write_conll(tmp_path / "t.txt", [
      {"tokens": ["EU", "rejects"], "tags": ["B-ORG", "B-FOO"]}])})
  with pytest.raises(ValueError, match=r"task conll2003: the sentence at line 3 of .*t.txt has tag 'B-FOO', "
                                       r"which is not in the label set \['O', 'B-PER', "):
    train.train_and_evaluate(config, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("overrides, message", [
    ({"task.kind": "ner"}, r"task local \(NER\) reads local files: --config.task.train_file=FILE"),
    ({"task.kind": "span"}, r"task.kind='span'; local files are classification, ner, multiple_choice"),
    ({"task.kind": "ner", "task.train_file": "/nonexistent/train.txt"},
     r"task local: the train file /nonexistent/train.txt does not exist"),
])
def test_bad_local_settings_are_refused(tmp_path, make_config, no_compiling, overrides, message):
  with pytest.raises((ValueError, FileNotFoundError), match=message):
    train.train_and_evaluate(make_config("local", **overrides), str(tmp_path / "w"))


def test_label_names_apply_to_files_only(make_config, tmp_path):
  with pytest.raises(ValueError, match=r"task.label_names='O,B-X': conll2003 from TFDS has its tags fixed"):
    TokenClassification.from_config(make_config("conll2003", **{"task.label_names": "O,B-X"}))
  train_file = write_jsonl(tmp_path / "t.jsonl", [{"tokens": ["a", "b"], "tags": [0, 1]}])
  with pytest.raises(ValueError, match=r"task local: line 1 of .*t.jsonl gives tag ids \(0\), whose names cannot "
                                       "be inferred; name the labels in id order. Set --config.task.label_names="):
    build_task(make_config("local", **{"task.kind": "ner", "task.train_file": train_file}))
  task = build_task(make_config("local", **{"task.kind": "ner", "task.train_file": train_file,
                                            "task.label_names": "O,B-X"}))
  assert (task.label_names, task.num_labels) == (("O", "B-X"), 2)
