"""Bi-encoders (sts_cosine, nli_softmax, mnrl, triplet): each loss equals sentence-transformers' on the same weights
and batch; a tiny encoder trained with mnrl on generated paraphrases beats its untrained self; the exports load in
sentence-transformers with jbert.embed's embeddings; results.json's Spearman/Pearson are scipy's."""
import dataclasses
import json
import pathlib
import shutil

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
from scipy import stats

import jbert
from jbert.inference import load_model
from jbert.weights import st_folder
from jbert.model import BertModel, SentenceEncoderOutput, init_params
from jbert.tasks import build_task
from jbert.tasks.sentence_embedding import task as se
from jbert.tasks.sentence_embedding import metrics as sentence_metrics
from jbert.tasks.base import training_loss
from jbert.train import trainer as train
from inference.tiny_models import random_torch_model, write_vocab
from tasks.sentence_data import paraphrases, random_batch, write_csv, write_jsonl
import trained


@pytest.fixture(scope="module")
def st_model(tmp_path_factory):
  """A random BertModel behind sentence-transformers' Pooling (mean) and Dense (tanh, 32 -> 24), and jbert's
  params for the same weights."""
  from sentence_transformers import SentenceTransformer, models
  folder = tmp_path_factory.mktemp("st_loss")
  random_torch_model("BertModel").save_pretrained(folder)
  write_vocab(folder)
  transformer = models.Transformer(str(folder), max_seq_length=16)
  dense = models.Dense(32, 24)
  model = SentenceTransformer(modules=[transformer, models.Pooling(32, pooling_mode="mean"), dense], device="cpu")
  config, bert = jbert.load_pretrained(folder, BertModel)
  bert.pop("pooler")
  params = {"bert": bert, "dense": {"kernel": dense.linear.weight.detach().numpy().T,
                                    "bias": dense.linear.bias.detach().numpy()}}
  return model.eval(), config, params


def _task(cls, **kwargs):
  return cls(encoder=se.Encoder(dense_features=24), max_seq_length=16, **kwargs)


def _columns(batch, k):
  return [{name: torch.from_numpy(batch[name][:, j].astype(np.int64)) for name in batch} for j in range(k)]


def test_losses_equal_sentence_transformers(st_model):
  from sentence_transformers import losses as st_losses
  reference, config, params = st_model
  # The same 18 sequences as 9 pairs (sts_cosine, nli_softmax, mnrl) and as 6 triplets (mnrl with hard
  # negatives, symmetric, triplet): one compiled forward for all.
  pairs = random_batch(0, rows=9, texts=2, length=16, vocab=config.vocab_size)
  triplets = {k: v.reshape(6, 3, 16) for k, v in pairs.items()}
  nli = _task(se.NliSoftmax, label_names=("e", "n", "c"))
  model = nli.model(config)
  rng = np.random.default_rng(1)
  classifier = {"kernel": rng.normal(0, 0.3, (72, 3)).astype(np.float32), "bias": np.float32([0.1, -0.2, 0.3])}
  outputs = jax.jit(lambda b: model.apply({"params": {**params, "classifier": classifier}}, **b))(pairs)
  by_triplet = SentenceEncoderOutput(embeddings=outputs.embeddings.reshape(6, 3, 24))
  scores = np.linspace(0, 1, 9).astype(np.float32)
  classes = np.array([0, 2, 1, 1, 0, 2, 2, 0, 1], np.int32)

  def ours(task, out, batch, labels=None):
    batch = {**batch, "label": labels}
    return float(training_loss(task, task.loss(out, batch)))

  softmax = st_losses.SoftmaxLoss(reference, embedding_dimension=24, num_labels=3)
  with torch.no_grad():
    softmax.classifier.weight.copy_(torch.tensor(np.asarray(classifier["kernel"]).T))
    softmax.classifier.bias.copy_(torch.tensor(np.asarray(classifier["bias"])))
  negatives = {"columns": {"text_c": "negative"}}
  cases = [
      (ours(_task(se.StsCosine), outputs, pairs, scores), st_losses.CosineSimilarityLoss(reference), pairs, scores),
      (ours(nli, outputs, pairs, classes), softmax, pairs, classes),
      (ours(_task(se.MultipleNegativesRanking), outputs, pairs), st_losses.MultipleNegativesRankingLoss(reference),
       pairs, None),
      (ours(_task(se.MultipleNegativesRanking, **negatives), by_triplet, triplets),
       st_losses.MultipleNegativesRankingLoss(reference), triplets, None),
      (ours(_task(se.MultipleNegativesRanking, symmetric=True, **negatives), by_triplet, triplets),
       st_losses.MultipleNegativesSymmetricRankingLoss(reference), triplets, None),
      (ours(_task(se.Triplet, margin=0.5), by_triplet, triplets), st_losses.TripletLoss(reference, triplet_margin=0.5),
       triplets, None),
  ]
  for got, loss, batch, labels in cases:
    with torch.no_grad():
      want = float(loss(_columns(batch, batch["input_ids"].shape[1]), None if labels is None else torch.tensor(
          labels.astype(np.int64 if labels.dtype.kind == "i" else np.float32))))
    assert got == pytest.approx(want, abs=1e-5, rel=1e-5), type(loss).__name__
    assert want > 0.01


@pytest.fixture(scope="module")
def mnrl_run(tmp_path_factory):
  """The shared tiny mnrl run (tests/trained.py): (workdir, evaluation pairs)."""
  run = trained.mnrl(tmp_path_factory)
  return run.workdir, run.dev


def test_mnrl_learns_paraphrases_and_exports_what_jbert_embeds(mnrl_run):
  from sentence_transformers import SentenceTransformer
  workdir = mnrl_run[0]
  export = str(workdir / "export")
  assert json.loads((workdir / "export" / "modules.json").read_text()) == [
      {"idx": i, "name": str(i), "path": p, "type": f"sentence_transformers.models.{t}"}
      for i, (p, t) in enumerate([("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Dense", "Dense"),
                                  ("3_Normalize", "Normalize")])]
  held_out = paraphrases(64, 2)
  texts = [r["anchor"] for r in held_out] + [r["positive"] for r in held_out]
  trained = jbert.embed(texts, export)
  reference = SentenceTransformer(export, device="cpu")
  assert reference.max_seq_length == 32  # data.max_seq_length, from sentence_bert_config.json
  want = reference.encode(texts, convert_to_numpy=True)
  assert trained.shape == (128, 16) and np.abs(trained - want).max() <= 1e-5
  # The same encoder untrained: BERT's initialisation (normal(0.02) weights, unit LayerNorm scales, zero biases),
  # embedded through the same compiled function.
  rng = np.random.default_rng(0)
  model = load_model(export)
  fresh = lambda path, x: (np.ones_like(x) if path[-1].key == "scale" else np.zeros_like(x) if path[-1].key == "bias"
                           else rng.normal(0, 0.02, x.shape).astype(np.float32))
  model = dataclasses.replace(model, params=jax.tree_util.tree_map_with_path(fresh, model.params),
                              dense_params=jax.tree_util.tree_map_with_path(fresh, model.dense_params), _placed={})
  untrained = jbert.embed(texts, model).reshape(2, 64, 16).transpose(1, 0, 2)  # [64, 2, 16]
  relevant = [[i] for i in range(64)]
  before = sentence_metrics.retrieval_metrics(untrained[:, 0], untrained[:, 1], relevant)
  after = sentence_metrics.retrieval_metrics(trained[:64], trained[64:], relevant)
  assert after["mrr@10"] >= 0.8 and after["recall@1"] >= 0.7, after
  assert after["mrr@10"] >= before["mrr@10"] + 0.4 and after["ndcg@10"] >= before["ndcg@10"] + 0.4, (before, after)


def test_scored_pairs_give_scipys_spearman_and_pearson_of_the_export(mnrl_run):
  from sentence_transformers import SentenceTransformer
  workdir, dev = mnrl_run
  reference = SentenceTransformer(str(workdir / "export"), device="cpu")
  u, v = (reference.encode([r[k] for r in dev], convert_to_numpy=True) for k in ("s1", "s2"))
  assert np.allclose(np.linalg.norm(u, axis=-1), 1, atol=1e-5)  # the Normalize module
  cosine, gold = np.sum(u * v, -1), [r["score"] for r in dev]
  metrics = json.loads((workdir / "results.json").read_text())["metrics"]["validation"]
  assert metrics["spearman"] == pytest.approx(stats.spearmanr(cosine, gold)[0], abs=1e-5)
  assert metrics["pearson"] == pytest.approx(stats.pearsonr(cosine, gold)[0], abs=1e-5)
  assert metrics["spearman"] > 0.5
  logged = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert logged[-1]["eval/spearman"] == metrics["spearman"]
  assert logged[0]["train/loss"] > 2 * logged[-2]["train/loss"]


def test_init_from_a_sentence_transformers_folder_keeps_its_modules(mnrl_run, make_config, tmp_path):
  export = mnrl_run[0] / "export"
  config = make_config("mnrl", **{"init_from": str(export), "data.vocab": None,
                                  "task.train_file": write_jsonl(tmp_path / "t.jsonl", paraphrases(8, 0))})
  tokenizer = jbert.load_tokenizer(str(export / "vocab.txt"))
  task = build_task(config, tokenizer)
  assert task.encoder.pooling == ("cls", "mean") and task.encoder.normalize
  bert_config = jbert.describe(str(export)).config
  params = task.load_init(str(export), bert_config, seed=0, fresh=dict)
  np.testing.assert_array_equal(params["dense"]["kernel"], st_folder.read_dense(*task.encoder.init_dense)["kernel"])
  assert set(params) == {"bert", "dense"} and "pooler" not in params["bert"]
  assert task.encoder.projection(bert_config).out_features == 16
  # Overrides replace the folder's modules: no projection, max pooling.
  config.task.dense_features, config.task.pooling = 0, "max"
  task = build_task(config, tokenizer)
  assert (task.encoder.pooling, task.encoder.projection(bert_config)) == (("max",), None)


def test_scores_are_mapped_by_score_range(make_config, tmp_path):
  rows = [{"s1": "ba be", "s2": "bi", "score": 4.5}, {"s1": "bo", "s2": "bu", "score": 1.0}]
  config = make_config("sts_cosine", **{"task.train_file": write_csv(tmp_path / "s.csv", rows),
                                        "task.eval_file": str(tmp_path / "s.csv"), "task.text_a": "s1",
                                        "task.text_b": "s2", "task.score_range": "0,5"})
  task = build_task(config, jbert.load_tokenizer(config.data.vocab))
  train_rows = task._train  # pylint: disable=protected-access
  np.testing.assert_allclose(train_rows["label"], [0.9, 0.2])
  assert train_rows["input_ids"].shape == (2, 2, 32) and task.sequences_per_row == 2
  assert train_rows["attention_mask"][0].sum(-1).tolist() == [4, 3]  # [CLS] ba be [SEP], [CLS] bi [SEP]
  (dev,) = task.eval_sets()
  assert (dev.name, dev.labelled, dev.examples) == ("validation", True, [("ba be", "bi"), ("bo", "bu")])


def test_bad_rows_are_refused_in_one_line(make_config, tmp_path):
  scored = write_csv(tmp_path / "s.csv", [{"s1": "ba", "s2": "be", "score": 4.5}])
  config = make_config("sts_cosine", **{"task.train_file": scored, "task.text_a": "s1", "task.text_b": "s2"})
  with pytest.raises(ValueError, match=r"row 0 of .*s.csv has score 4.5, outside task.score_range=0,1; set "
                                       r"--config.task.score_range=LOW,HIGH"):
    build_task(config, jbert.load_tokenizer(config.data.vocab))
  config = make_config("triplet", **{"task.train_file": write_jsonl(tmp_path / "t.jsonl", paraphrases(2, 0))})
  with pytest.raises(ValueError, match=r"column\(s\) \['negative'\] not in row 0"):
    build_task(config, jbert.load_tokenizer(config.data.vocab))
  with pytest.raises(ValueError, match="task.pooling='median'"):
    build_task(make_config("mnrl", **{"task.train_file": str(tmp_path / "t.jsonl"), "task.pooling": "median"}),
               jbert.load_tokenizer(config.data.vocab))


def test_mnrl_without_in_batch_negatives_is_refused_before_anything_compiles(make_config, tmp_path, monkeypatch):
  """At one (anchor, positive) row per batch (or per micro-batch) the anchor's only candidate is its positive: loss
  0, accuracy 1, zero gradients, and an export of the untouched model. Refused, naming the smallest useful batch."""
  rows = write_jsonl(tmp_path / "t.jsonl", paraphrases(8, 0))
  monkeypatch.setattr(jax, "jit", lambda *a, **k: pytest.fail("compiled"))
  workdir = tmp_path / "work"
  with pytest.raises(ValueError) as error:
    train.train_and_evaluate(make_config("mnrl", **{"task.train_file": rows, "batch_size": 1}), str(workdir))
  assert str(error.value) == (
      "task mnrl: batch_size=1 gives each anchor no in-batch negatives (its only candidate is its own positive), so "
      "the loss is 0 and nothing is learnt; use --config.batch_size=2 or more (larger batches give more negatives), "
      "or give hard negatives with --config.task.text_c=COLUMN.")
  assert not workdir.exists()
  config = make_config("mnrl", **{"task.train_file": rows, "batch_size": 4, "optim.grad_accum_steps": 4})
  with pytest.raises(ValueError, match=r"^task mnrl: batch_size=4 with optim.grad_accum_steps=4 \(1 row per "
                                       r"micro-batch\) gives each anchor no in-batch negatives .* use "
                                       r"--config.batch_size=8 or more"):
    build_task(config, jbert.load_tokenizer(config.data.vocab))
  # With a hard negative per row, one row has a negative to rank against.
  triplets = write_jsonl(tmp_path / "n.jsonl", paraphrases(8, 0, negatives=True))
  config = make_config("mnrl", **{"task.train_file": triplets, "task.text_c": "negative", "batch_size": 1})
  assert build_task(config, jbert.load_tokenizer(config.data.vocab)).num_texts == 3


@pytest.mark.parametrize("score", ["nan", "inf", "-Infinity"])
def test_a_non_finite_evaluation_score_is_refused_naming_file_and_line(make_config, tmp_path, score):
  rows = [{"s1": "ba be", "s2": "bi", "score": 4.5}, {"s1": "bo", "s2": "bu", "score": 1.0}]
  dev = write_csv(tmp_path / "dev.csv", [*rows, {"s1": "da", "s2": "de", "score": score}])
  config = make_config("sts_cosine", **{"task.train_file": write_csv(tmp_path / "s.csv", rows),
                                        "task.eval_file": dev, "task.text_a": "s1", "task.text_b": "s2",
                                        "task.label": "score", "task.score_range": "0,5"})
  workdir = tmp_path / "work"
  with pytest.raises(ValueError) as error:
    train.train_and_evaluate(config, str(workdir))
  assert str(error.value) == (
      f"{dev}, line 4: label {score!r} (column score) is not a finite number; fix or remove that row (a "
      "non-finite score can be neither trained on nor scored).")
  assert not workdir.exists()
  # A training file's the same.
  config.task.train_file, config.task.eval_file = dev, None
  with pytest.raises(ValueError, match=rf"^{dev}, line 4: label '{score}' \(column score\) is not a finite number"):
    build_task(config, jbert.load_tokenizer(config.data.vocab))


def test_mnrl_warns_once_about_positives_that_other_rows_share(make_config, tmp_path, caplog):
  """Two rows with the same positive text in one batch rank each other's positive, their own text, as a negative
  (sentence-transformers' MultipleNegativesRankingLoss does the same): one warning, with the counts."""
  rows = paraphrases(12, 0)
  for i in (3, 7, 9):  # three more rows with row 0's positive; row 5's once more, as a hard negative
    rows[i] = {**rows[i], "positive": rows[0]["positive"]}
  rows = [{**r, "negative": rows[5]["positive"] if i == 2 else rows[(i + 1) % 12]["anchor"]}
          for i, r in enumerate(rows)]
  config = make_config("mnrl", **{"task.train_file": write_jsonl(tmp_path / "t.jsonl", rows),
                                  "task.text_c": "negative"})
  with caplog.at_level("WARNING", logger="jbert"):
    build_task(config, jbert.load_tokenizer(config.data.vocab))
  warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
  assert warnings == [
      f"task mnrl: 6 of the 12 training rows of {tmp_path / 't.jsonl'} share a positive or negative text with "
      "another row (2 distinct texts); when such rows meet in a batch, each ranks the other's copy of its own "
      "positive as a negative, as sentence-transformers' MultipleNegativesRankingLoss does. Deduplicate them for "
      "clean in-batch negatives."]


def test_the_export_keeps_init_froms_max_seq_length_unless_set(mnrl_run, make_config, tmp_path, caplog):
  """A sentence-transformers folder of max_seq_length 64 fine-tuned at data.max_seq_length=32 exports 64 (its
  positions past 32 are init_from's, not cut), unless task.export_max_seq_length says otherwise; the log says
  which."""
  source = pathlib.Path(shutil.copytree(mnrl_run[0] / "export", tmp_path / "source"))
  st_config = source / "sentence_bert_config.json"
  train_file = write_jsonl(tmp_path / "t.jsonl", paraphrases(8, 0))

  def exported(length, **more):
    st_config.write_text(json.dumps({"max_seq_length": length, "do_lower_case": False}))
    config = make_config("mnrl", **{"init_from": str(source), "data.vocab": None, "task.train_file": train_file,
                                    **more})
    tokenizer = jbert.load_tokenizer(str(source / "vocab.txt"))
    task = build_task(config, tokenizer)
    bert_config = jbert.describe(str(source)).config
    task.model(bert_config)  # the export's length is checked against the model before anything compiles
    out = tmp_path / f"out_{length}_{len(more)}"
    caplog.clear()
    with caplog.at_level("INFO", logger="jbert"):
      task.export(bert_config, task.load_init(str(source), bert_config, seed=0, fresh=dict), str(out), tokenizer)
    lines = [r.getMessage() for r in caplog.records if "max_seq_length is" in r.getMessage()]
    return json.loads((out / "sentence_bert_config.json").read_text())["max_seq_length"], lines

  assert exported(64) == (64, ["task mnrl: the export's max_seq_length is 64 (init_from's sentence_bert_config.json; "
                               "training truncated at data.max_seq_length=32)."])
  assert exported(64, **{"task.export_max_seq_length": 48}) == (
      48, ["task mnrl: the export's max_seq_length is 48 (task.export_max_seq_length)."])
  assert exported(16) == (32, ["task mnrl: the export's max_seq_length is 32 (data.max_seq_length)."])
  with pytest.raises(ValueError, match=r"the export's max_seq_length 100 \(task.export_max_seq_length\) exceeds the "
                                       r"model's max_position_embeddings=64"):
    exported(64, **{"task.export_max_seq_length": 100})
  with pytest.raises(ValueError, match=r"task.export_max_seq_length=0 must be a length >= 1"):
    exported(64, **{"task.export_max_seq_length": 0})
