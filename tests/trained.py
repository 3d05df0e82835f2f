"""Tiny trained runs that more than one test file needs, trained once per test run (`shared_runs.once`).

A run made for one file's assertions serves the others' too: the uninterrupted references of the fine-tuning
durability and the question-answering preemption tests are the classifier and the SQuAD 2.0 reader whose
predictions `jbert.predict` must reproduce, and the fault-injection tests' uninterrupted pretraining run is the
workdir a rerun with another config is refused on. The workdirs are shared: copy one before changing it.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import shared_runs
from tests.tasks import finetune_data as fd
from tests.tasks import squad_data

CLASSIFIER_STEPS = 24
SQUAD_STEPS = 16
# test_train.small_config's pretraining run, with a loss every step and a checkpoint every 2.
PRETRAINING = {"total_steps": 12, "log_every_steps": 1, "checkpoint_every_steps": 2, "eval_every_steps": 0}


@dataclasses.dataclass(frozen=True)
class Classifier:
  checkpoint: pathlib.Path  # the tiny pretrained model it was fine-tuned from
  overrides: dict  # its data files and columns (config keys)
  workdir: pathlib.Path  # the finished run
  dev: pathlib.Path  # its evaluation file (columns a, b, label)
  losses: dict  # {step: train/loss}, every step

  def settings(self, **more) -> dict:
    """The run's config keys (for `fd.finetune_config("local", ...)` or run.py's --config.KEY=VALUE), then `more`."""
    return classifier_settings(self.checkpoint, self.overrides, **more)


def classifier_settings(checkpoint, overrides: dict, **more) -> dict:
  """Sentence pairs from an init_from checkpoint; a checkpoint every 4 steps and a loss every step, so that an
  interrupted copy of the run can be compared step by step. `model.scan_layers` is left to configs/finetune.py's
  default (None: resolved per platform and workdir), as a user's command leaves it."""
  return {"init_from": str(checkpoint), "total_steps": CLASSIFIER_STEPS, "batch_size": 16, "log_every_steps": 1,
          "checkpoint_every_steps": 4, "data.max_seq_length": 16, "data.num_shards": 2, "optim.learning_rate": 1e-3,
          **overrides, **more}


def losses(workdir) -> dict:
  lines = (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()
  return {l["step"]: l["train/loss"] for l in map(json.loads, lines) if "train/loss" in l}


def classifier(tmp_path_factory) -> Classifier:
  """A pair classifier (labels no, yes) fine-tuned for 24 steps on 256 generated pairs, evaluated on 40."""
  def build(root):
    from jbert.train import trainer as train  # pylint: disable=import-outside-toplevel
    checkpoint = fd.tiny_checkpoint(root / "ckpt")
    overrides = fd.local_overrides(root / "data", n_train=256, n_eval=40)
    train.train_and_evaluate(fd.finetune_config("local", **classifier_settings(checkpoint, overrides)),
                             str(root / "run"))
    return Classifier(checkpoint, overrides, root / "run", root / "data" / "dev.csv", losses(root / "run"))
  return shared_runs.once(tmp_path_factory, "classifier", build)


def pretrained(tmp_path_factory) -> tuple[dict, pathlib.Path]:
  """({step: train/loss}, workdir) of `test_train.small_config(**PRETRAINING)`, uninterrupted: checkpoints 8, 10
  and 12 are kept."""
  def build(root):
    from jbert.train import trainer as train  # pylint: disable=import-outside-toplevel
    from test_train import small_config  # pylint: disable=import-outside-toplevel
    train.train_and_evaluate(small_config(**PRETRAINING), str(root / "run"))
    return losses(root / "run"), root / "run"
  return shared_runs.once(tmp_path_factory, "pretrained", build)


MNRL_STEPS = 40


@dataclasses.dataclass(frozen=True)
class MnrlRun:
  workdir: pathlib.Path  # the finished run
  dev: list  # its evaluation pairs (s1, s2, score 0..5)
  settings: dict  # tasks.conftest.tiny_config keys of configs/finetune.py:mnrl (run.py: --config.KEY=VALUE)
  losses: dict  # {step: train/loss} at steps 20 and 40


def mnrl(tmp_path_factory) -> MnrlRun:
  """One tiny mnrl bi-encoder trained from scratch on generated paraphrases, with cls+mean pooling, a Dense
  projection and Normalize, scored on STS-style pairs (eval_kind=scored, as sts_cosine scores its eval_file)."""
  def build(root):
    from jbert.train import trainer as train  # pylint: disable=import-outside-toplevel
    from tasks import conftest, sentence_data as sd  # pylint: disable=import-outside-toplevel
    dev = sd.scored_pairs(40, 1)
    settings = {
        "model.hidden_size": 32, "model.intermediate_size": 64, "total_steps": MNRL_STEPS, "batch_size": 32,
        "log_every_steps": 20, "optim.learning_rate": 2e-3,
        # Both files name their texts s1, s2: the training file's anchors and positives, the evaluation's pairs.
        "task.train_file": sd.write_jsonl(root / "train.jsonl", [{"s1": r["anchor"], "s2": r["positive"]}
                                                                 for r in sd.paraphrases(1280, 0)]),
        "task.eval_file": sd.write_csv(root / "dev.csv", dev), "task.eval_kind": "scored", "task.text_a": "s1",
        "task.text_b": "s2", "task.label": "score", "task.score_range": "0,5", "task.pooling": "cls,mean",
        "task.dense_features": 16, "task.normalize": True}
    vocab = conftest.write_vocab(root / "vocab.txt")
    train.train_and_evaluate(conftest.tiny_config("mnrl", vocab, **settings), str(root / "run"))
    return MnrlRun(root / "run", dev, conftest.tiny_settings(vocab, **settings), losses(root / "run"))
  return shared_runs.once(tmp_path_factory, "mnrl", build)


@dataclasses.dataclass(frozen=True)
class SquadRun:
  files: dict  # task.train_file, task.eval_file
  vocab: str
  dev: list  # the evaluation examples (id, question, context, answers)
  workdir: pathlib.Path  # the finished run
  losses: dict  # {step: train/loss}, every step

  def config(self):
    """The run's config: SQuAD 2.0 on 32-token windows (stride 12), dropout on, a checkpoint every 4 steps."""
    return squad_data.tiny_config(
        "squad_v2", self.vocab, **self.files, total_steps=SQUAD_STEPS, log_every_steps=1, checkpoint_every_steps=4,
        async_checkpointing=True, batch_size=16, **{"optim.learning_rate": 1e-3, "model.hidden_dropout_prob": 0.1,
                                                    "model.attention_probs_dropout_prob": 0.1})


def squad_v2(tmp_path_factory) -> SquadRun:
  """A reader trained from scratch on 64 generated SQuAD 2.0 questions (every fourth unanswerable), evaluated on
  16: the long contexts take two or three windows."""
  def build(root):
    from jbert.train import trainer as train  # pylint: disable=import-outside-toplevel
    dev = squad_data.marked_span_examples(16, 8, unanswerable_every=4)
    files = {"task.train_file": squad_data.write_squad_json(
                 root / "train.json", squad_data.marked_span_examples(64, 7, unanswerable_every=4)),
             "task.eval_file": squad_data.write_squad_json(root / "dev.json", dev)}
    run = SquadRun(files, squad_data.write_vocab(root / "vocab.txt"), dev, root / "run", {})
    train.train_and_evaluate(run.config(), str(run.workdir))
    return dataclasses.replace(run, losses=losses(run.workdir))
  return shared_runs.once(tmp_path_factory, "squad_v2", build)


@dataclasses.dataclass(frozen=True)
class TinyRun:
  workdir: pathlib.Path  # the finished run (export/ inside)
  dev: pathlib.Path  # its evaluation file (JSON lines)


# A few steps: what these runs prove is that predictions reproduce the run's, not what the model learnt.
TINY_STEPS = {"total_steps": 2, "log_every_steps": 2, "checkpoint_every_steps": 0, "async_checkpointing": False}


def _jsonl(path: pathlib.Path, rows: list) -> pathlib.Path:
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  return path


def _words_vocab(root: pathlib.Path) -> str:
  from tasks.conftest import write_vocab  # pylint: disable=import-outside-toplevel
  return write_vocab(root / "vocab.txt")


def _tagged_sentences(rng, n, longest):
  """A marker word announces an entity: "per" a PER word, "org" two ORG words; some words take a "##s" piece."""
  from tasks.conftest import WORDS  # pylint: disable=import-outside-toplevel
  out = []
  for _ in range(n):
    tokens, tags = [], []
    while len(tokens) < rng.integers(2, longest + 1):
      marker = rng.choice(["per", "org", "", ""])
      entity = {"per": ["B-PER"], "org": ["B-ORG", "I-ORG"]}.get(marker, ["O"])
      tokens += [marker] * bool(marker) + [WORDS[rng.integers(len(WORDS))] + "s" * (rng.random() < 0.3)
                                           for _ in entity]
      tags += ["O"] * bool(marker) + entity
    out.append({"tokens": tokens, "tags": tags})
  return out


def tagger(tmp_path_factory, crf: bool = False) -> TinyRun:
  """NER on 16-token sequences (`task.crf` as given): the long dev sentences need two or three windows."""
  def build(root):
    import numpy as np  # pylint: disable=import-outside-toplevel
    from jbert.train import trainer as train  # pylint: disable=import-outside-toplevel
    from tasks.conftest import tiny_config  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    dev = _jsonl(root / "dev.jsonl", _tagged_sentences(rng, 16, 6) + _tagged_sentences(rng, 4, 24))
    config = tiny_config("local", _words_vocab(root), **TINY_STEPS, **{
        "task.kind": "ner", "task.train_file": str(_jsonl(root / "train.jsonl", _tagged_sentences(rng, 32, 8))),
        "task.eval_file": str(dev), "data.max_seq_length": 16, **({"task.crf": True} if crf else {})})
    train.train_and_evaluate(config, str(root / "run"))
    return TinyRun(root / "run", dev)
  return shared_runs.once(tmp_path_factory, "tagger_crf" if crf else "tagger", build)


def _choices(rng, n):
  """Four endings, one of which repeats a context word."""
  from tasks.conftest import WORDS  # pylint: disable=import-outside-toplevel
  rows = []
  for _ in range(n):
    context = list(rng.choice(WORDS[:24], 3, replace=False))
    endings = list(rng.choice([w for w in WORDS[:24] if w not in context], 4, replace=False))
    label = int(rng.integers(4))
    endings[label] = context[0]
    rows.append({"context": " ".join(context), "endings": endings, "label": label})
  return rows


def chooser(tmp_path_factory) -> TinyRun:
  """Multiple choice of four endings on 12-token sequences."""
  def build(root):
    import numpy as np  # pylint: disable=import-outside-toplevel
    from jbert.train import trainer as train  # pylint: disable=import-outside-toplevel
    from tasks.conftest import tiny_config  # pylint: disable=import-outside-toplevel
    rng = np.random.default_rng(0)
    dev = _jsonl(root / "dev.jsonl", _choices(rng, 20))
    # Endings differ in one word, so the scores of an untrained model lie within 1e-5 of each other: a few more
    # steps move them apart, so that no near-tie decides an ending.
    config = tiny_config("local", _words_vocab(root), **{**TINY_STEPS, "total_steps": 24}, **{
        "task.kind": "multiple_choice", "task.train_file": str(_jsonl(root / "train.jsonl", _choices(rng, 64))),
        "task.eval_file": str(dev), "data.max_seq_length": 12, "optim.learning_rate": 5e-3})
    train.train_and_evaluate(config, str(root / "run"))
    return TinyRun(root / "run", dev)
  return shared_runs.once(tmp_path_factory, "chooser", build)
