"""The fine-tuning side of the contract (`jbert/tasks/finetuning.py`): a run's batch layout given at construction
(`Batching`, from the data config alone), and prediction's length cap at the model's positions."""
import types

import ml_collections
import pytest

from jbert.model import BertConfig
from jbert.tasks import build_task
from jbert.tasks.classification import SequenceClassification
from jbert.tasks.classification.sources import local_dataset
from jbert.tasks.finetuning import Batching
from tests.tasks.conftest import tiny_config


def _config(packing=True, bucketing=True, slots=4, accumulate=1):
  return ml_collections.ConfigDict({
      "data": {"bucketing": bucketing, "packing": packing, "max_sequences_per_row": slots, "max_seq_length": 32},
      "optim": {"grad_accum_steps": accumulate}})


def test_the_data_config_alone_lays_out_the_batches_at_construction():
  batching = Batching.from_config(_config(slots=4))
  assert (batching.bucketing, batching.packing, batching.max_sequences, batching.grad_accum_steps) == (
      True, True, 4, 1)
  task = SequenceClassification(label_names=("no", "yes"), max_seq_length=32, batching=batching)
  assert task.packing and task.packed_slots() == 4 and task.buckets() is None  # packed rows are not bucketed
  fixed = SequenceClassification(label_names=("no", "yes"), max_seq_length=32,
                                 batching=Batching.from_config(_config(packing=False, bucketing=False)))
  assert fixed.packed_slots() is None and fixed.buckets() is None
  served = SequenceClassification(label_names=("no", "yes"), max_seq_length=32)  # prediction: no run's layout
  assert (served.packing, served.bucketing, served.max_sequences) == (False, True, 1)


def test_a_config_without_the_batch_layout_keys_is_refused_in_one_line():
  config = _config()
  del config.data["packing"]
  with pytest.raises(ValueError, match=r"^config.data has no packing: a fine-tuning config sets bucketing, packing, "
                                       r"max_sequences_per_row \(start from configs/finetune.py\)\.$"):
    Batching.from_config(config)


def test_build_task_returns_the_task_as_its_class_built_it(vocab_file, tmp_path):
  """build_task changes nothing of a finished task: its layout is the one `from_config` gave it."""
  train = tmp_path / "train.csv"
  train.write_text("text,label\nba be,0\nbi bo,1\n", encoding="utf-8")
  config = tiny_config("local", vocab_file, **{"task.train_file": str(train), "task.text_a": "text",
                                               "task.label": "label", "data.max_sequences_per_row": 3})
  task = build_task(config)
  assert (task.packing, task.max_sequences, task.bucketing) == (True, 3, True)
  built = SequenceClassification.from_config(config)
  assert (built.packing, built.max_sequences, built.bucketing) == (task.packing, task.max_sequences, task.bucketing)


def _folder(max_position_embeddings, position_offset, run_length=None):
  config = BertConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=1,
                      intermediate_size=16, max_position_embeddings=max_position_embeddings,
                      position_offset=position_offset)
  run = {"data": {"max_seq_length": run_length}} if run_length else None
  return types.SimpleNamespace(info=types.SimpleNamespace(config=config), run_config=run)


def test_prediction_lengths_are_capped_at_the_positions_the_model_has():
  roberta = _folder(66, 2)  # RoBERTa's table: its first 2 rows serve padding, 64 positions
  assert SequenceClassification.prediction_length(roberta, 64) == 64
  assert SequenceClassification.prediction_length(roberta, None) == 64  # the default, capped
  with pytest.raises(ValueError, match=r"^max_length=65 must lie in \[3, max_position_embeddings=66 less "
                                       r"position_offset=2\]\.$"):
    SequenceClassification.prediction_length(roberta, 65)
  bert = _folder(64, 0, run_length=48)
  assert SequenceClassification.prediction_length(bert, None) == 48  # the run's length
  with pytest.raises(ValueError, match=r"^max_length=65 must lie in \[3, max_position_embeddings=64\]\.$"):
    SequenceClassification.prediction_length(bert, 65)


def test_a_prediction_task_needs_no_dataset():
  regressor = SequenceClassification(max_seq_length=16)
  assert (regressor.kind, regressor.num_labels, regressor.label_names, regressor.dataset) == (
      "regression", 1, None, None)
  classifier = SequenceClassification(label_names=["no", "yes"], max_seq_length=16)
  assert (classifier.kind, classifier.num_labels, classifier.label_names) == ("classification", 2, ("no", "yes"))
  local = SequenceClassification(local_dataset("mine", {}, {"text_a": "t", "label": "y"}, ["a", "b", "c"]),
                                 max_seq_length=16)
  assert (local.name, local.kind, local.num_labels) == ("mine", "classification", 3)
