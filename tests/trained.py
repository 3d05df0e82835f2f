"""Tiny trained runs that more than one test file needs, trained once per test run (`shared_runs.once`).

A run made for one file's assertions serves the others' too: the fine-tuning durability tests' uninterrupted
reference is the classifier whose predictions `jbert.predict` must reproduce, and the fault-injection tests'
uninterrupted pretraining run is the workdir a rerun with another config is refused on. The workdirs are shared:
copy one before changing it.
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

import shared_runs
from tests.tasks import finetune_data as fd

CLASSIFIER_STEPS = 24
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
  interrupted copy of the run can be compared step by step."""
  return {"init_from": str(checkpoint), "total_steps": CLASSIFIER_STEPS, "batch_size": 16, "log_every_steps": 1,
          "checkpoint_every_steps": 4, "model.scan_layers": False, "data.max_seq_length": 16,
          "data.num_shards": 2, "optim.learning_rate": 1e-3, **overrides, **more}


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
