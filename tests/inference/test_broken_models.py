"""Never a confident answer from broken weights: a model file holding NaN is refused at load, and finite weights
that overflow on some inputs are refused at run time naming those inputs. Either way the command exits 2 with one
line and writes no output file."""
import importlib
import json
import shutil

from absl import flags
import numpy as np
import pytest

import jbert

from inference.tiny_models import VOCAB, random_torch_model, write_vocab

LABELS = {0: "neg", 1: "pos"}
TEXTS = ["the dog sat", "the cat sat", "a red bird", "cat"]  # "cat" overflows in the poisoned models below


def _in_process(module, *args) -> int:
  command = importlib.import_module(module)
  flags.FLAGS.unparse_flags()
  try:
    command.main(flags.FLAGS([module, *map(str, args)]))
    return 0
  except SystemExit as e:
    return e.code
  finally:
    flags.FLAGS.unparse_flags()


def _save(folder, cls_name, **overrides):
  random_torch_model(cls_name, **overrides).save_pretrained(folder)
  write_vocab(folder)
  return folder


def _poison(folder, name, index, value):
  from safetensors.numpy import load_file, save_file
  file = folder / "model.safetensors"
  state = load_file(file)
  state[name][index] = value
  save_file(state, file, metadata={"format": "pt"})
  return file


@pytest.fixture(scope="module")
def classifier_dir(tmp_path_factory):
  return _save(tmp_path_factory.mktemp("classifier"), "BertForSequenceClassification", id2label=LABELS,
               label2id={v: k for k, v in LABELS.items()})


@pytest.fixture
def inputs(tmp_path):
  path = tmp_path / "in.txt"
  path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
  return path


def _files(folder):
  return sorted(p.name for p in folder.iterdir())


def test_predict_refuses_nan_weights_at_load(tmp_path, classifier_dir, inputs, capsys):
  model = shutil.copytree(classifier_dir, tmp_path / "model")
  file = _poison(model, "classifier.weight", (1, 4), np.nan)
  before = _files(tmp_path)
  out = tmp_path / "out.jsonl"
  assert _in_process("jbert.predict", f"--model={model}", f"--input={inputs}", f"--output={out}") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"jbert.predict: {file}: weight classifier.weight holds 1 non-finite values (first nan at [1, 4]); "
                 "the file is damaged or the run that wrote it diverged. Download, convert or export the model "
                 "again."]
  assert _files(tmp_path) == before  # no output, no temporary file


def test_predict_names_the_inputs_whose_outputs_overflow(tmp_path, classifier_dir, inputs, capsys):
  model = shutil.copytree(classifier_dir, tmp_path / "model")
  _poison(model, "bert.embeddings.word_embeddings.weight", VOCAB.index("cat"), 3e38)  # finite, sums to inf
  out = tmp_path / "out.jsonl"
  out.write_text("earlier\n")
  assert _in_process("jbert.predict", f"--model={model}", f"--input={inputs}", f"--output={out}") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1] == (f"jbert.predict: The model's outputs for {inputs}, line 2, {inputs}, line 4 are not finite "
                     "(NaN or inf): the weights overflow on these inputs (e.g. float16/bfloat16 range, or a damaged "
                     "model); try --dtype=float32 or another model.")
  assert out.read_text() == "earlier\n" and _files(tmp_path) == ["in.txt", "model", "out.jsonl"]
  # The same inputs without the poisoned word: valid JSON, every probability a number.
  clean = tmp_path / "clean.txt"
  clean.write_text("the dog sat\na red bird\n")
  assert _in_process("jbert.predict", f"--model={model}", f"--input={clean}", f"--output={out}") == 0
  rows = [json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
          for line in out.read_text().splitlines()]
  assert [sorted(r["probabilities"]) for r in rows] == [["neg", "pos"]] * 2


def test_embed_and_fill_mask_name_the_inputs_whose_outputs_overflow(tmp_path, inputs, capsys):
  encoder = _save(tmp_path / "encoder", "BertModel")
  _poison(encoder, "embeddings.word_embeddings.weight", VOCAB.index("cat"), 3e38)
  out = tmp_path / "out.npy"
  assert _in_process("jbert.embed", f"--model={encoder}", f"--input={inputs}", f"--output={out}",
                     "--pooling=mean", "--chunk_size=3") == 2  # the second chunk's "cat" is input 3
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1] == ("jbert.embed: The embeddings of inputs 1 (0-based, in input order) are not finite (NaN or inf): "
                     "the weights overflow on these inputs (e.g. float16/bfloat16 range, or a damaged model); try "
                     "--dtype=float32 or another model.")
  assert not out.exists() and not list(tmp_path.glob(".out.npy*"))
  with pytest.raises(ValueError, match=r"^The embeddings of inputs 1, 3 \(0-based"):
    jbert.embed(TEXTS, str(encoder), pooling="mean")

  # The output layer shares the word embeddings, so a position embedding overflows instead: the long text reaches
  # position 20, and the short texts sharing its batch are padded past it (attention gives padding weight 0, and
  # 0 * inf is NaN), so every text of that batch is named.
  mlm = _save(tmp_path / "mlm", "BertForMaskedLM", seed=1)
  _poison(mlm, "bert.embeddings.position_embeddings.weight", 20, 3e38)
  assert _in_process("jbert.fill_mask", f"--model={mlm}", "--json", "the [MASK] sat", " ".join(["the cat"] * 12)
                     + " [MASK]", "[MASK] sat") == 2
  captured = capsys.readouterr()
  assert captured.out == "" and captured.err.strip().splitlines()[-1].startswith(
      "jbert.fill_mask: The predictions for texts 0, 1, 2 (0-based, in input order) are not finite (NaN or inf)")
  assert np.isfinite(jbert.fill_mask("the [MASK] sat", str(mlm))[0][0][0]["score"])  # alone, a short text is fine
