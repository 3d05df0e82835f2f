"""NER with a CRF head (task.crf=true): the loss and Viterbi tags through the task against brute-force enumeration,
IOB1 gold refused, and one trained tiny model (bench/ner_crf.py's, beside the softmax head on the same data): both
learn, no forbidden transition in any prediction, the export loads in transformers with jbert's emissions as
logits and jbert.predict gives the run's Viterbi tags back; a folder without crf.safetensors and a rerun that
turns the CRF off are refused in one line."""
import contextlib
import io
import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tensorflow_datasets as tfds
import torch
import transformers

import jbert
import script_module
import shared_runs
from jbert import errors
from jbert.checkpoint import reading
from jbert.tasks.token_classification import features as ner
from jbert.tasks.token_classification.features import CONLL2003_NER_TAGS, IGNORE_INDEX
from jbert.inference import prediction
from jbert.model import crf as crf_lib
from jbert.model.crf_head import CRFTaggerOutput
from jbert.runtime import metrics as metrics_lib
from jbert.tasks import TokenClassification, build_task
from jbert.tasks.base import reported, training_loss
from jbert.tasks.token_classification.crf import CRF_FILE, CRFTokenClassification, iob2_junctions
from jbert.train import trainer as train
from jbert.tokenizer import load_tokenizer
from jbert.train import workdir_record
from tasks.token_classification.test_task import write_conll, write_jsonl

bench = script_module.load("bench/ner_crf.py")
C = len(CONLL2003_NER_TAGS)


def brute_force(emissions, potentials, positions, allowed, start_allowed):
  """(log Z, every allowed tag sequence of `positions` [S, P], their scores [S]) in float64, by enumeration."""
  n = len(positions)
  if not n:
    return 0.0, np.zeros((1, 0), int), np.zeros(1)
  seqs = np.stack(np.meshgrid(*[np.arange(C)] * n, indexing="ij"), -1).reshape(-1, n)  # [C^n, n]
  ok = start_allowed[seqs[:, 0]] & np.all(allowed[seqs[:, :-1], seqs[:, 1:]], axis=1)
  seqs = seqs[ok]
  scores = (emissions[positions][np.arange(n), seqs].sum(1) + potentials["start"][seqs[:, 0]]
            + potentials["end"][seqs[:, -1]] + potentials["transitions"][seqs[:, :-1], seqs[:, 1:]].sum(1))
  return np.logaddexp.reduce(scores), seqs, scores


def test_loss_and_viterbi_equal_brute_force_with_injected_emissions(make_config):
  """IOB2 from CoNLL's label names: no I-X after O or another type; no I-X first where the chain starts at the
  sentence's first word (position 1), but a window that starts later may begin inside an entity."""
  task = build_task(make_config("conll2003", **{"task.crf": True}))
  assert isinstance(task, CRFTokenClassification) and (task.kind, task.scheme) == ("ner_crf", "iob2")
  rng = np.random.default_rng(0)
  b, t = 4, 7
  logits = rng.normal(0, 2, (b, t, C)).astype(np.float32)
  pots = {k: rng.normal(0, 1, s).astype(np.float32) for k, s in (("transitions", (C, C)), ("start", C), ("end", C))}
  tag = {n: i for i, n in enumerate(CONLL2003_NER_TAGS)}
  labels = np.full((b, t), IGNORE_INDEX, np.int32)
  labels[0, [1, 2, 4]] = [tag["B-PER"], tag["I-PER"], tag["O"]]
  labels[1, [2, 3, 5]] = [tag["I-ORG"], tag["I-ORG"], tag["O"]]  # a later window, inside an entity
  labels[3, [1, 3, 4, 6]] = [tag["O"], tag["B-LOC"], tag["I-LOC"], tag["B-MISC"]]  # row 2: no word
  outputs = CRFTaggerOutput(last_hidden_state=jnp.zeros((b, t, 4)), logits=jnp.asarray(logits),
                            potentials=crf_lib.Potentials(*map(jnp.asarray, pots.values())))
  batch = {"labels": jnp.asarray(labels), "predict_mask": jnp.asarray((labels != IGNORE_INDEX).astype(np.int32))}
  entries = jax.jit(task.loss)(outputs, batch)
  tags = np.asarray(jax.jit(task.predictions)(outputs, batch)["tags"])

  allowed, start, _ = task.constraints.arrays()
  nll, words = 0.0, 0
  for row in range(b):
    positions = list(np.flatnonzero(labels[row] != IGNORE_INDEX))
    start_allowed = start if positions and positions[0] == 1 else np.ones(C, bool)
    log_z, seqs, scores = brute_force(logits[row].astype(np.float64), pots, positions, allowed, start_allowed)
    gold = np.all(seqs == labels[row, positions], axis=1)
    assert gold.sum() == 1  # the gold sequence is an allowed one
    nll += log_z - scores[gold][0]
    words += len(positions)
    assert list(tags[row, positions]) == list(seqs[np.argmax(scores)])
    assert (tags[row, [p for p in range(t) if p not in positions]] == 0).all()
  assert float(entries["loss"].denominator) == words == 10
  # The training accuracy is that of the Viterbi tags predictions decode, per labelled word: the progress line's acc.
  correct = int(((tags == labels) & (labels != IGNORE_INDEX)).sum())
  assert (float(entries["accuracy"].sum), float(entries["accuracy"].denominator)) == (correct, 10)
  line = metrics_lib.format_progress(5, 10, reported(task, entries))
  assert line == f"step 5/10 | loss {nll / words:.3f} | acc {correct / 10:.3f}", line
  assert abs(float(entries["loss"].sum) - nll) <= 1e-4 * max(1.0, abs(nll))
  assert abs(float(training_loss(task, entries)) - nll / words) <= 1e-5
  # Micro-batches normalised by the global batch's denominators add up to the whole batch's loss (grad accumulation).
  denominators = {k: e.denominator for k, e in entries.items()}
  parts = [float(training_loss(task, task.loss(
      CRFTaggerOutput(outputs.last_hidden_state[s], outputs.logits[s], outputs.potentials),
      {k: v[s] for k, v in batch.items()}), denominators)) for s in (slice(0, 2), slice(2, 4))]
  assert abs(sum(parts) - nll / words) <= 1e-5


def test_at_zero_transitions_without_constraints_the_loss_is_ners_cross_entropy(make_config):
  crf = build_task(make_config("conll2003", **{"task.crf": True, "task.crf_scheme": "none"}))
  ner = build_task(make_config("conll2003"))
  assert type(ner) is TokenClassification and crf.constraints is None
  rng = np.random.default_rng(1)
  logits = jnp.asarray(rng.normal(0, 3, (3, 9, C)).astype(np.float32))
  labels = rng.integers(0, C, (3, 9)).astype(np.int32)
  labels[rng.random((3, 9)) < 0.4] = IGNORE_INDEX
  zeros = crf_lib.Potentials(jnp.zeros((C, C)), jnp.zeros(C), jnp.zeros(C))
  batch = {"labels": jnp.asarray(labels)}
  got = crf.loss(CRFTaggerOutput(last_hidden_state=None, logits=logits, potentials=zeros), batch)["loss"]
  want = ner.loss(CRFTaggerOutput(last_hidden_state=None, logits=logits, potentials=zeros), batch)["loss"]
  assert float(got.denominator) == float(want.denominator) == (labels != IGNORE_INDEX).sum()
  assert abs(float(got.sum) - float(want.sum)) <= 1e-4


@pytest.fixture
def no_compiling(monkeypatch):
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled before refusing the input"))


def test_iob1_gold_tags_are_refused_naming_the_sentence_and_the_fix(tmp_path, make_config, no_compiling):
  """CoNLL-2003's original IOB1 files begin an entity with I-X; IOB2's constraints would make their loss ~1e4."""
  sentences = [{"tokens": ["per", "ba"], "tags": ["O", "B-PER"]}, {"tokens": ["ba", "be"], "tags": ["I-PER", "O"]}]
  config = make_config("local", **{"task.kind": "ner", "task.crf": True,
                                   "task.train_file": write_conll(tmp_path / "train.txt", sentences)})
  with pytest.raises(ValueError, match=r"^task local: the sentence at line 6 of .*train.txt has tag 'I-PER' first "
                                       r"\(word 1\), which IOB2 forbids; the tags look like IOB1 \(where I-X may "
                                       r"begin an entity\): convert them to IOB2 \(each entity's first word B-X\), "
                                       r"or set --config.task.crf_scheme=none to train the CRF without "
                                       r"constraints\.$"):
    train.train_and_evaluate(config, str(tmp_path / "w"))
  dev = write_jsonl(tmp_path / "dev.jsonl", [{"tokens": ["ba", "be"], "tags": ["O", "I-PER"]}])
  config = make_config("local", **{"task.kind": "ner", "task.crf": True, "task.label_names": "O,B-PER,I-PER",
                                   "task.train_file": write_jsonl(tmp_path / "t.jsonl", sentences[:1]),
                                   "task.eval_file": dev})
  with pytest.raises(ValueError, match=r"line 1 of .*dev.jsonl has tag 'I-PER' after 'O' \(word 2\), which IOB2"):
    train.train_and_evaluate(config, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()
  # Without constraints the same data trains (the task builds; nothing is refused).
  config = make_config("local", **{"task.kind": "ner", "task.crf": True, "task.crf_scheme": "none",
                                   "task.train_file": str(tmp_path / "train.txt")})
  assert build_task(config).constraints is None


def test_conll2003_from_tfds_is_checked_too(make_config, vocab_file, no_compiling):
  """TFDS's conll2003 is IOB2; an I-X beginning an entity there is named by its example."""
  names = {t: i for i, t in enumerate(CONLL2003_NER_TAGS)}

  def split(tags):
    return [{"tokens": np.array([b"ba"] * len(tags), dtype=object), "ner": np.array([names[t] for t in tags]),
             "pos": np.zeros(len(tags), np.int64), "chunks": np.zeros(len(tags), np.int64)}]
  good = {"train": split(["B-PER", "I-PER", "O"]), "dev": split(["O", "B-LOC"]), "test": split(["O"])}
  config = make_config("conll2003", **{"task.crf": True})
  tokenizer = load_tokenizer(vocab_file)
  with tfds.testing.mock_data(as_data_source_fn=lambda *args, split=None, **kwargs: good[split]):
    task = build_task(config, tokenizer)
  assert isinstance(task, CRFTokenClassification) and task.scheme == "iob2"
  assert task.num_train_examples() == 1 and [e.name for e in task.eval_sets()] == ["validation", "test"]
  bad = {**good, "dev": split(["O", "I-LOC"])}
  with tfds.testing.mock_data(as_data_source_fn=lambda *args, split=None, **kwargs: bad[split]):
    with pytest.raises(ValueError, match=r"^task conll2003: example 0 of conll2003.* has tag 'I-LOC' after 'O' "
                                         r"\(word 2\), which IOB2 forbids; the tags look like IOB1"):
      build_task(config, tokenizer)


def test_plain_tags_are_io_with_every_transition_allowed_and_scored_as_runs(tmp_path, make_config, vocab_file,
                                                                          no_compiling):
  """`auto` reads PER/LOC/ORG/MISC as IO (the CRF forbids nothing) and the scores count an entity per run of one
  type (values worked out by hand: seqeval's default would read ORG as O and MISC as a type ISC)."""
  gold = [["PER", "PER", "O", "ORG", "ORG", "LOC"], ["MISC", "O", "ORG"]]
  pred = [["PER", "O", "O", "ORG", "ORG", "ORG"], ["MISC", "O", "LOC"]]
  words = [["ba", "be", "bi", "bo", "bu", "da"], ["de", "di", "do"]]
  sentences = [{"tokens": w, "tags": t} for w, t in zip(words, gold)]
  files = {"task.train_file": write_conll(tmp_path / "train.txt", sentences),
           "task.eval_file": write_jsonl(tmp_path / "dev.jsonl", sentences)}
  task = build_task(make_config("local", **{"task.kind": "ner", "task.crf": True, **files}),
                    load_tokenizer(vocab_file))
  assert isinstance(task, CRFTokenClassification) and task.scheme == "io"
  assert task.label_names == ("O", "LOC", "MISC", "ORG", "PER") and task.constraints is None
  (dev,) = task.eval_sets()
  f = dev.features
  ids = [[task.label_names.index(t) for t in s] for s in pred]
  tags = np.zeros_like(f["input_ids"])
  rows, cols = np.nonzero(f["predict_mask"])
  tags[rows, cols] = [ids[f["example_id"][r]][f["word_ids"][r, c]] for r, c in zip(rows, cols)]
  scores = task.evaluate(dev, {"tags": tags})
  # Gold: PER 0-1, ORG 3-4, LOC 5 | MISC 0, ORG 2 (5). Predicted: PER 0, ORG 3-5 | MISC 0, LOC 2 (4). Right: MISC.
  np.testing.assert_allclose([scores[k] for k in ("precision", "recall", "f1", "accuracy")],
                             [1 / 4, 1 / 5, 2 / 9, 6 / 9], rtol=1e-12)
  assert {k: v for k, v in scores.items() if k.endswith("/support")} == {
      "LOC/support": 1, "MISC/support": 1, "ORG/support": 2, "PER/support": 1}
  assert [r["tags"] for r in task.records(dev, {"tags": tags})] == pred  # plain tags back, no junction rewrite
  with pytest.raises(ValueError, match=r"^task local: Label 'LOC' is not an IOB2 tag \(O or B/I-TYPE\); .* "
                                       r"\(--config.task.crf_scheme=none\)$"):
    build_task(make_config("local", **{"task.kind": "ner", "task.crf": True, "task.crf_scheme": "iob2", **files}))
  with pytest.raises(ValueError, match=r"^task local: Label 'B-PER' is not an IO tag \(O or a plain TYPE such as "
                                       r"PER\)"):
    build_task(make_config("local", **{"task.kind": "ner", "task.crf": True, "task.crf_scheme": "io",
                                       "task.label_names": "O,B-PER,I-PER", **files}))


def test_window_junctions_are_written_as_valid_iob2():
  assert iob2_junctions(["I-PER", "I-PER", "O", "I-LOC", "B-ORG", "I-MISC", "I-MISC"]) == [
      "B-PER", "I-PER", "O", "B-LOC", "B-ORG", "B-MISC", "I-MISC"]
  assert iob2_junctions(["B-PER", "I-PER", "O"]) == ["B-PER", "I-PER", "O"]


# ------------------------------------------------------------------------------------------------ a trained model
BENCH = {"train": 1000, "eval": 120, "steps": 250, "batch": 32, "seeds": ["0"]}  # ~25 s of training per head


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """bench/ner_crf.py at a small size: softmax and CRF heads on the same CoNLL-shaped data, seed 0."""
  def build(root):
    own = bench._TRAIN._flagvalues  # pylint: disable=protected-access
    for name, value in {**BENCH, "workdir": str(root)}.items():
      own[name].value = value
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
      bench.main([])
    return json.loads(out.getvalue().strip().splitlines()[-1])
  return shared_runs.once(tmp_path_factory, "ner_crf_bench", build)


def _crf_workdir(runs) -> pathlib.Path:
  return pathlib.Path(next(r["workdir"] for r in runs["runs"] if r["head"] == "crf"))


def test_both_heads_learn_and_only_the_softmax_breaks_iob2(runs):
  by_head = {r["head"]: r for r in runs["runs"]}
  # Untrained, both are near 0; at this short budget the CRF is far ahead (0.87 against 0.41 when written: one type
  # per entity is what its transitions learn first), with longer training the softmax catches up (docs/performance.md).
  assert by_head["softmax"]["f1"] >= 0.3 and by_head["crf"]["f1"] >= 0.75, by_head
  assert by_head["crf"]["iob2_breaking_sentences"] == 0 < by_head["softmax"]["iob2_breaking_sentences"]
  losses = [json.loads(l)["train/loss"] for l in (_crf_workdir(runs) / "metrics.jsonl").read_text().splitlines()
            if "train/loss" in l]
  # From log(9) per word at zero transitions and near-zero logits, by step 50 already below 0.1.
  assert len(losses) == 5 and losses[-1] < losses[0] < np.log(C) / 20


def test_no_prediction_takes_a_forbidden_transition(runs):
  """Over the run's validation predictions and jbert.predict on inputs unlike its data (random words, entity words
  without a marker, long runs of names), IOB2 holds in every sentence."""
  rng = np.random.default_rng(3)
  pools = (bench.NAMES, bench.OTHERS, ("per", "org", "loc", "misc"))
  pick = lambda pool: pool[rng.integers(len(pool))]
  inputs = [[pick(pools[rng.integers(3)]) for _ in range(rng.integers(1, 25))] for _ in range(60)]
  inputs += [list(bench.NAMES[:20]), ["ba"], ["per"] + list(bench.NAMES[:6]) + ["ma"] + list(bench.NAMES[6:9])]
  predicted = prediction.predict(inputs, str(_crf_workdir(runs) / "export"))
  assert [p["tokens"] for p in predicted] == inputs
  assert not any(bench.iob2_breaks(p["tags"]) for p in predicted)
  assert sum(t != "O" for p in predicted for t in p["tags"]) > 50  # it does tag entities there


def test_the_export_loads_in_transformers_and_jbert_predict_gives_the_runs_viterbi_tags(runs, tmp_path):
  workdir = _crf_workdir(runs)
  export = workdir / "export"
  config = json.loads((export / "config.json").read_text())
  assert config["architectures"] == ["BertForTokenClassification"] and config["jbert"]["task"] == "ner_crf"
  hf = transformers.BertForTokenClassification.from_pretrained(export, attn_implementation="eager").eval()
  # jbert's emissions: the trained model's logits, from its checkpoint (crf params included).
  task = build_task(_run_config(runs))
  bert_dict, params = reading.restore_params(workdir)
  model = task.model(jbert.BertConfig.from_dict(bert_dict))
  task.tokenizer = load_tokenizer(str(workdir / "export"))
  # Sentences of one window each (decoded as one chain), 40 of them.
  short = [i for i, s in enumerate(_dev(runs)) if sum(map(len, task.tokenizer.batch_ids(s["tokens"]))) <= 30][:40]
  features = task.featurise([{"tokens": _dev(runs)[i]["tokens"], "tags": None, "where": ""} for i in short])
  assert len(features["input_ids"]) == len(short) == 40
  inputs = {k: features[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
  outputs = model.apply({"params": params}, **{k: jnp.asarray(v) for k, v in inputs.items()})
  with torch.no_grad():
    want = hf(**{k: torch.tensor(v, dtype=torch.long) for k, v in inputs.items()}).logits.numpy()
  real = features["attention_mask"].astype(bool)
  np.testing.assert_allclose(np.asarray(outputs.logits)[real], want[real], atol=1e-5)
  np.testing.assert_array_equal(np.asarray(outputs.potentials.transitions), _stored(export)["transitions"])

  # jbert.predict from the export and from the workdir: the tags the run's evaluation wrote (its Viterbi decoding).
  written = [[line.split(" ")[-1] for line in block.splitlines()] for block in (
      workdir / "predictions" / "validation.conll").read_text(encoding="utf-8").strip("\n").split("\n\n")]
  everything = _dev(runs)
  for model_path in (export, workdir):
    predicted = prediction.predict([s["tokens"] for s in everything], str(model_path))
    assert [p["tags"] for p in predicted] == written
  # ... which is the Viterbi decoding of transformers' logits with the stored transitions.
  # One window per sentence: every chain starts at the sentence's first word, under the whole IOB2 constraints.
  viterbi, _ = crf_lib.viterbi_decode(want, features["predict_mask"], crf_lib.Potentials(*(
      _stored(export)[k] for k in ("transitions", "start_transitions", "end_transitions"))), task.constraints,
      fill_value=0)
  viterbi = np.asarray(viterbi)
  names = task.label_names
  assert [[names[t] for t in words] for words in ner.word_predictions(viterbi, features)] == [written[i]
                                                                                             for i in short]

  # Without crf.safetensors the folder is refused in one line, before any weight loads.
  bare = tmp_path / "bare"
  shutil.copytree(export, bare)
  (bare / CRF_FILE).unlink()
  with pytest.raises(errors.UserError, match=rf"^{bare} records a model trained with a CRF \(config.json's "
                                             rf"jbert.task is ner_crf\), but has no {CRF_FILE}, "):
    prediction.Predictor(str(bare))
  (bare / CRF_FILE).write_bytes(b"\x00" * 16)
  with pytest.raises(errors.UserError, match=rf"^{bare / CRF_FILE} is not a readable CRF file"):
    prediction.Predictor(str(bare))


def test_keep_best_and_init_from_read_the_transitions_back(runs):
  """keep_best's WORKDIR/best is read back whole (`load_export`); `init_from` a CRF export keeps its transitions,
  from the softmax head's export the CRF starts at zero."""
  workdir = _crf_workdir(runs)
  task = build_task(_run_config(runs))
  bert_dict, params = reading.restore_params(workdir)
  bert_config = jbert.BertConfig.from_dict(bert_dict)
  loaded = task.load_export(str(workdir / "export"), bert_config)
  assert jax.tree.structure(loaded) == jax.tree.structure(params)
  for a, b in zip(jax.tree.leaves(loaded), jax.tree.leaves(params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  init = task.load_init(str(workdir / "export"), bert_config, seed=0, fresh=None)
  np.testing.assert_array_equal(init["crf"]["transitions"], params["crf"]["transitions"])
  softmax = pathlib.Path(next(r["workdir"] for r in runs["runs"] if r["head"] == "softmax")) / "export"
  init = task.load_init(str(softmax), bert_config, seed=0, fresh=None)
  assert jax.tree.structure(init) == jax.tree.structure(params)
  assert not any(np.asarray(v).any() for v in init["crf"].values())
  assert np.abs(np.asarray(init["classifier"]["kernel"]) - params["classifier"]["kernel"]).max() > 0.01


def test_turning_the_crf_off_on_its_workdir_is_refused(runs, tmp_path):
  """`task.crf` is a drift key: a rerun without it would train the softmax head on the CRF's checkpoint."""
  workdir = tmp_path / "copy"
  shutil.copytree(_crf_workdir(runs), workdir)
  config = _run_config(runs)
  config.task.crf = False
  with pytest.raises(workdir_record.ConfigDriftError, match=r"task\.crf"):
    train.train_and_evaluate(config, str(workdir))
  config.task.crf = True  # the same command as the run's: complete, nothing to do
  assert train.train_and_evaluate(config, str(workdir)) == {}


def _run_config(runs):
  """The config bench/ner_crf.py trained its CRF run with (the data files are beside the workdir)."""
  root = _crf_workdir(runs).parent
  return bench.config(str(root / "vocab.txt"), str(root / "train0.txt"), str(root / "dev0.txt"), crf=True,
                      steps=BENCH["steps"], batch=BENCH["batch"], seed=0)


def _dev(runs):
  return ner.read_ner_file(pathlib.Path(runs["runs"][0]["workdir"]).parent / "dev0.txt")


def _stored(export):
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  return load_file(str(export / CRF_FILE))
