"""`jbert.predict`: a fine-tuned model's predictions, from its workdir or its export, equal to the files the
fine-tuning run wrote itself (labels, values, answers, tags, endings), and bad input refused with one line.

Each head is fine-tuned once (module fixtures) for a few steps on files written here: the predictions of a barely
trained model are near-random, which makes equality with the run's own files the stricter check.
"""
import csv
import importlib
import json
import pathlib
import shutil

from absl import flags
import numpy as np
import pytest

import jbert
from jbert.train import trainer as train
from jbert.inference import io as inference_io
from jbert.inference.prediction import Predictor
from tasks import finetune_data as fd
import trained

STEPS = {"total_steps": 2, "log_every_steps": 2, "checkpoint_every_steps": 0, "async_checkpointing": False}


def _in_process(*args) -> int:
  """`python -m jbert.predict ARGS` in this process (no interpreter start-up): its exit status."""
  command = importlib.import_module("jbert.predict")
  flags.FLAGS.unparse_flags()
  try:
    command.main(flags.FLAGS(["jbert.predict", *map(str, args)]))
    return 0
  except SystemExit as e:
    return e.code
  finally:
    flags.FLAGS.unparse_flags()


def _predict(tmp_path, model, source, *args):
  out = tmp_path / "out.jsonl"
  assert _in_process(f"--model={model}", f"--input={source}", f"--output={out}", *args) == 0
  return [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]


def _tsv(path):
  with open(path, encoding="utf-8") as f:
    return list(csv.DictReader(f, delimiter="\t"))


def _write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  return path


def _moved_export(workdir, tmp_path):
  """The run's export/ copied away from its workdir: config.json, weights and tokenizer, no record of the run."""
  return shutil.copytree(workdir / "export", tmp_path / "elsewhere" / "model")


# ----------------------------------------------------------------------------------------------------------
# Fine-tuned models, one per head.
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def init_checkpoint(tmp_path_factory):
  return fd.tiny_checkpoint(tmp_path_factory.mktemp("init"))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
  """Sentence pairs (columns a, b) fine-tuned from an init_from checkpoint: the workdir's tokenizer is its copy.
  The durability tests' reference run (tests/trained.py), made once per test run."""
  run = trained.classifier(tmp_path_factory)
  return run.workdir, run.dev


@pytest.fixture(scope="module")
def regressor(tmp_path_factory, init_checkpoint):
  """Single texts (column a) with a score: no label names, one output."""
  root = tmp_path_factory.mktemp("regressor")
  files = {}
  for split, n, seed in (("train", 64, 1), ("dev", 24, 2)):
    rows = [{**row, "label": 0.9 if row["label"] == "yes" else 0.1} for row in fd.context_examples(n, seed)]
    files[split] = str(fd.write_rows(root / f"{split}.tsv", rows))
  config = fd.finetune_config("local", init_from=str(init_checkpoint), **STEPS, **{
      "task.train_file": files["train"], "task.eval_file": files["dev"], "task.text_a": "a", "task.label": "label",
      "task.label_names": ""})
  train.train_and_evaluate(config, str(root / "run"))
  return root / "run", root / "dev.tsv"


@pytest.fixture(scope="module")
def tagger(tmp_path_factory):
  """NER on 16-token sequences: the long dev sentences need two or three windows (tests/trained.py, shared with
  the serving tests)."""
  run = trained.tagger(tmp_path_factory)
  return run.workdir, run.dev


@pytest.fixture(scope="module")
def reader(tmp_path_factory):
  """SQuAD 2.0 on 32-token windows: contexts span windows, every fourth question has no answer. The question-
  answering preemption test's reference run (tests/trained.py), made once per test run."""
  run = trained.squad_v2(tmp_path_factory)
  return run.workdir, pathlib.Path(run.files["task.eval_file"]), run.dev


@pytest.fixture(scope="module")
def chooser(tmp_path_factory):
  """Four endings on 12-token sequences (tests/trained.py, shared with the serving tests)."""
  run = trained.chooser(tmp_path_factory)
  return run.workdir, run.dev


# ----------------------------------------------------------------------------------------------------------
# Predictions equal the run's own.
# ----------------------------------------------------------------------------------------------------------


def _assert_classified_as(predictions, tsv_rows):
  assert [p["label"] for p in predictions] == [r["prediction"] for r in tsv_rows]
  for p, r in zip(predictions, tsv_rows):
    assert list(p["probabilities"]) == ["no", "yes"]  # the checkpoint's label names, in id order
    assert [p["probabilities"][n] for n in ("no", "yes")] == pytest.approx(
        [float(r["p_no"]), float(r["p_yes"])], abs=1.5e-6)


def test_classification_from_workdir_and_export_equals_the_run(classifier, tmp_path):
  workdir, dev = classifier
  want = _tsv(workdir / "predictions" / "validation.tsv")
  assert len(want) == 40
  # The run's columns (a, b) are read from its own dev file, whether from the workdir or from its export.
  _assert_classified_as(_predict(tmp_path, workdir, dev), want)
  _assert_classified_as(_predict(tmp_path, workdir / "export", dev), want)
  # A moved export knows nothing of the run: `text`/`text_b` records and --max_length say it.
  with open(dev, encoding="utf-8") as f:
    pairs = [(row["a"], row["b"]) for row in csv.DictReader(f)]
  records = _write_jsonl(tmp_path / "pairs.jsonl", [{"text": a, "text_b": b} for a, b in pairs])
  moved = _moved_export(workdir, tmp_path)
  _assert_classified_as(_predict(tmp_path, moved, records, "--max_length=16"), want)
  # The Python function: the same, for (text, pair) tuples.
  _assert_classified_as(jbert.predict(pairs, str(moved), max_length=16), want)


def test_regression_values_equal_the_runs(regressor, tmp_path):
  workdir, dev = regressor
  want = [float(r["prediction"]) for r in _tsv(workdir / "predictions" / "validation.tsv")]
  got = _predict(tmp_path, workdir, dev)
  assert [list(p) for p in got] == [["value"]] * 24
  assert [p["value"] for p in got] == pytest.approx(want, abs=1e-6)
  # One text per line of a text file, through the moved export.
  text = tmp_path / "texts.txt"
  text.write_text("".join(r["a"] + "\n" for r in _tsv(dev)), encoding="utf-8")
  got = _predict(tmp_path, _moved_export(workdir, tmp_path), text, "--max_length=16")
  assert [p["value"] for p in got] == pytest.approx(want, abs=1e-6)


def test_ner_tags_equal_the_runs_conll_file(tagger, tmp_path):
  workdir, dev = tagger
  blocks = (workdir / "predictions" / "validation.conll").read_text(encoding="utf-8").strip("\n").split("\n\n")
  want = [[line.split(" ")[-1] for line in block.splitlines()] for block in blocks]
  sentences = [json.loads(line)["tokens"] for line in dev.read_text().splitlines()]
  got = _predict(tmp_path, workdir, dev)
  assert [p["tokens"] for p in got] == sentences and max(map(len, sentences)) > 14  # several windows
  assert [p["tags"] for p in got] == want
  # Label names from the checkpoint; one sentence per line of a text file; a moved export with --max_length.
  assert set(t for p in got for t in p["tags"]) <= {"O", "B-ORG", "B-PER", "I-ORG"}
  text = tmp_path / "sentences.txt"
  text.write_text("".join(" ".join(s) + "\n" for s in sentences), encoding="utf-8")
  assert [p["tags"] for p in _predict(tmp_path, _moved_export(workdir, tmp_path), text, "--max_length=16")] == want


def test_ner_reads_a_txt_of_conll_columns_as_training_does(tagger, tmp_path, capsys):
  """A .txt (or .tsv) of `word TAG` lines, or of a word a line between blank lines, is read as CoNLL columns, as
  training reads it, not as one sentence per line; a word a line without a blank line is both, and refused."""
  workdir, dev = tagger
  rows = [json.loads(line) for line in dev.read_text().splitlines()]
  blocks = (workdir / "predictions" / "validation.conll").read_text(encoding="utf-8").strip("\n").split("\n\n")
  want = [[line.split(" ")[-1] for line in block.splitlines()] for block in blocks]
  tagged = "".join("".join(f"{w} {t}\n" for w, t in zip(r["tokens"], r["tags"])) + "\n" for r in rows)
  columns = "-DOCSTART- -X- O\n\n" + "".join("".join(f"{w} X {t}\n" for w, t in zip(r["tokens"], r["tags"])) + "\n"
                                            for r in rows)
  cases = {"conll_test.txt": tagged, "columns.txt": columns, "columns.tsv": tagged.replace(" ", "\t"),
           "words.txt": "\n\n".join("\n".join(r["tokens"]) for r in rows) + "\n"}  # untagged, a blank between
  for name, text in cases.items():
    (tmp_path / name).write_text(text, encoding="utf-8")
    got = _predict(tmp_path, workdir, tmp_path / name)
    assert [p["tokens"] for p in got] == [r["tokens"] for r in rows], name
    assert [p["tags"] for p in got] == want, name
  ambiguous = tmp_path / "words_only.txt"
  ambiguous.write_text("".join(w + "\n" for w in rows[0]["tokens"]), encoding="utf-8")
  out, n = tmp_path / "never.jsonl", len(rows[0]["tokens"])
  capsys.readouterr()
  assert _in_process(f"--model={workdir}", f"--input={ambiguous}", f"--output={out}") == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and err.endswith(
      f"{ambiguous} holds one word per line and no blank line: as CoNLL columns (how training reads such a file) "
      f"it is one sentence of {n} words, as a sentence per line {n} one-word sentences; end each sentence with a "
      "blank line, or give JSON lines with `tokens` (.jsonl).")
  assert not out.exists()


def test_answers_equal_the_runs_predictions_json(reader, tmp_path):
  workdir, dev_file, dev = reader
  files = workdir / "predictions" / "validation"
  answers = json.loads((files / "predictions.json").read_text(encoding="utf-8"))
  nbest = json.loads((files / "nbest_predictions.json").read_text(encoding="utf-8"))

  def check(got):
    assert [p["id"] for p in got] == [ex["id"] for ex in dev]
    assert {p["id"]: p["answer"] for p in got} == answers
    for p in got:
      assert p["score"] == pytest.approx(next(e["probability"] for e in nbest[p["id"]] if e["text"] == p["answer"]),
                                         abs=1e-5)

  check(_predict(tmp_path, workdir, dev_file))  # the SQuAD file; v2.0, windows and threshold from the run
  records = _write_jsonl(tmp_path / "questions.jsonl", [{k: ex[k] for k in ("id", "question", "context")}
                                                        for ex in dev])
  check(_predict(tmp_path, workdir / "export", records))
  check(_predict(tmp_path, _moved_export(workdir, tmp_path), records, "--max_length=32", "--doc_stride=12",
                 "--max_query_length=8", "--version_2_with_negative"))
  # Another threshold: "" exactly where the run's null odds exceed it, elsewhere the run's best span (its n-best
  # list's first non-empty text, also for questions the run's own threshold left unanswered).
  odds = json.loads((files / "null_odds.json").read_text(encoding="utf-8"))
  threshold = float(np.median(list(odds.values())))
  got = jbert.predict([{k: ex[k] for k in ("id", "question", "context")} for ex in dev], str(workdir),
                      null_score_diff_threshold=threshold)
  best_span = {q: next(e["text"] for e in entries if e["text"]) for q, entries in nbest.items()}
  assert {p["id"]: p["answer"] for p in got} == {q: "" if odds[q] > threshold else best_span[q] for q in answers}
  assert any(answers[q] == "" and odds[q] <= threshold for q in answers)  # the higher threshold answers more
  assert 0 < sum(p["answer"] == "" for p in got) < len(got)
  for p in got:
    assert p["score"] == pytest.approx(next(e["probability"] for e in nbest[p["id"]] if e["text"] == p["answer"]),
                                       abs=1e-5)


def test_chosen_endings_equal_the_runs_tsv(chooser, tmp_path):
  workdir, dev = chooser
  want = _tsv(workdir / "predictions" / "validation.tsv")
  for model, args in ((workdir, ()), (_moved_export(workdir, tmp_path), ("--max_length=12",))):
    got = _predict(tmp_path, model, dev, *args)
    assert [p["label"] for p in got] == [int(r["prediction"]) for r in want]
    for p, r in zip(got, want):
      assert p["probabilities"] == pytest.approx([float(r[f"p_{c}"]) for c in range(4)], abs=1.5e-6)
  # Examples with another number of endings are scored too (the trainer would refuse them in one file).
  mixed = jbert.predict([{"context": "ba be", "endings": ["ba", "di"]}, ("ba be bi", ["fo", "be", "gu"])],
                        str(workdir))
  assert [len(p["probabilities"]) for p in mixed] == [2, 3]
  assert all(sum(p["probabilities"]) == pytest.approx(1.0) for p in mixed)


def _assert_close(got, want):
  """Records equal, their floats to float32 rounding."""
  if isinstance(want, float):
    assert got == pytest.approx(want, abs=1e-5)
  elif isinstance(want, dict):
    assert list(got) == list(want)
    for k in want:
      _assert_close(got[k], want[k])
  elif isinstance(want, list):
    assert len(got) == len(want)
    for g, w in zip(got, want):
      _assert_close(g, w)
  else:
    assert got == want


@pytest.mark.parametrize("fixture", ["classifier", "regressor", "tagger", "chooser"])
def test_packed_predictions_equal_one_sequence_a_row(fixture, request):
  workdir, dev = request.getfixturevalue(fixture)
  packed, alone = Predictor(workdir), Predictor(workdir, packing=False)
  assert packed.packing and not alone.packing
  examples = packed.read(str(dev))
  got = packed(examples)
  assert len(got) == len(examples)
  _assert_close(got, alone(examples))


def test_question_answering_windows_are_never_packed(reader):
  assert not Predictor(reader[0]).packing  # every window of a context but its last is full


# ----------------------------------------------------------------------------------------------------------
# Bad input: one line, exit status 2, nothing written.
# ----------------------------------------------------------------------------------------------------------


def test_bad_input_is_refused_with_one_line(classifier, tmp_path, capsys):
  workdir, dev = classifier
  out = tmp_path / "out.jsonl"
  (tmp_path / "empty.csv").write_text("a,b\n")
  (tmp_path / "latin.jsonl").write_bytes('{"a": "ok", "b": "w1"}\n{"a": "caf\xe9", "b": "w2"}\n'.encode("latin-1"))
  (tmp_path / "columns.csv").write_text("x,y\nw1,w2\n")
  _write_jsonl(tmp_path / "no_pair.jsonl", [{"a": "w1", "b": "w2"}, {"a": "w3"}])
  no_weights = tmp_path / "no_weights"
  fd.write_vocab(no_weights)
  no_tokenizer = shutil.copytree(workdir / "export", tmp_path / "no_tokenizer",
                                 ignore=shutil.ignore_patterns("vocab.txt", "tokenizer*", "special_tokens*"))
  pretrained = fd.tiny_checkpoint(tmp_path / "pretrained")
  cases = [
      ((workdir, tmp_path / "empty.csv"), "empty.csv holds no inputs; nothing to predict"),
      ((workdir, tmp_path / "latin.jsonl"), "latin.jsonl, line 2: byte 11"),
      ((workdir, tmp_path / "columns.csv"), "columns.csv, line 2: no text field 'a' or 'text'"),
      ((workdir, tmp_path / "no_pair.jsonl"), "no_pair.jsonl, line 2: no field 'b'"),
      ((workdir, tmp_path / "missing.csv"), "missing.csv does not exist"),
      ((no_weights, dev), "is not a BERT checkpoint jbert can read"),
      ((no_tokenizer, dev, "--column=a", "--pair_column=b"), "holds no tokenizer"),
      ((pretrained, dev), "is a BertForPreTraining, not a fine-tuned model"),
      ((workdir, dev, "--doc_stride=64"), "doc_stride applies to question answering"),
  ]
  for (model, source, *more), message in cases:
    assert _in_process(f"--model={model}", f"--input={source}", f"--output={out}", *more) == 2, message
    stderr = capsys.readouterr().err
    lines = [line for line in stderr.splitlines() if line.startswith("jbert.predict: ")]
    assert len(lines) == 1 and message in lines[0], stderr
  assert _in_process(f"--model={workdir}", f"--input={dev}", f"--output={tmp_path / 'out.txt'}") == 2
  assert "use a .jsonl file" in capsys.readouterr().err
  assert list(tmp_path.glob("out*")) == [] and list(tmp_path.glob(".out*")) == []


def test_settings_refuse_what_a_default_would_hide():
  """An explicit max_length of 0 was read as "unset" and replaced by the default; a NaN threshold compares false
  with every score, so no question would ever get "no answer"."""
  from jbert.inference.folder import ModelFolder
  info = jbert.weights.ModelInfo(jbert.BertConfig(max_position_embeddings=64), jbert.model.registry.head(
      jbert.BertForQuestionAnswering), None, None, "hf")
  folder = ModelFolder(path="model", weights="model", info=info)
  reader = jbert.tasks.QuestionAnswering
  assert reader.for_prediction(folder, kind="question_answering", max_query_length=16).max_seq_length == 64
  with pytest.raises(ValueError, match=r"^max_length=0 must lie in \[3, max_position_embeddings=64\]"):
    reader.for_prediction(folder, kind="question_answering", max_length=0)
  with pytest.raises(ValueError, match="^null_score_diff_threshold is NaN; give a number"):
    reader.for_prediction(folder, kind="question_answering", max_query_length=16,
                          null_score_diff_threshold=float("nan"))


def test_an_interrupted_write_leaves_the_earlier_output(classifier, tmp_path, monkeypatch, capsys):
  workdir, dev = classifier
  out = tmp_path / "out.jsonl"
  out.write_text("earlier\n")
  writes = []

  def write(self, obj):
    writes.append(obj)
    if len(writes) == 3:
      raise KeyboardInterrupt
    self.file.write(json.dumps(obj).encode() + b"\n")

  monkeypatch.setattr(inference_io.JsonlWriter, "write", write)
  assert _in_process(f"--model={workdir}", f"--input={dev}", f"--output={out}") == 130
  assert "interrupted; no output was written" in capsys.readouterr().err
  assert out.read_text() == "earlier\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.jsonl"]
