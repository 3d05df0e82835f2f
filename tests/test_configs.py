"""The shipped configs: phase 2's sequences fit each phase-1 model's positions (the tiny demo's included); the
`fast` preset."""
import importlib
import pathlib
import sys

import pytest

from jbert.train import architecture
from jbert.runtime import sharding
from jbert.train import trainer as train

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from configs import phase2  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


@pytest.mark.parametrize("arg, seq, predictions, max_positions", [
    ("base", 512, 80, 512), ("large", 512, 80, 512), ("tiny", 128, 20, 128), (None, 512, 80, 512)])
def test_phase2_sequence_fits_the_phase1_model(arg, seq, predictions, max_positions):
  config = phase2.get_config(arg)
  bert_config = architecture.bert_config(config.model, 30522)
  assert (config.data.max_seq_length, config.data.max_predictions_per_seq) == (seq, predictions)
  assert bert_config.max_position_embeddings == max_positions
  mesh = sharding.make_mesh(-1, 1, 1, 1)
  train.check_model(config, bert_config, mesh)  # raises when the sequence exceeds the positions


def test_phase2_names_its_arguments():
  with pytest.raises(ValueError, match=r"configs/phase2.py:medium: the argument names the phase-1 config, one of "
                                       r"\['base', 'large', 'tiny'\]"):
    phase2.get_config("medium")


@pytest.mark.parametrize("module", ["base", "tiny", "large"])
def test_fast_preset_drops_attention_dropout_only(module):
  """`:fast` trains with the fused attention kernels (no kernel has attention dropout); nothing else changes."""
  get_config = importlib.import_module(f"configs.{module}").get_config
  fast, default = get_config("fast").to_dict(), get_config().to_dict()
  assert fast["model"].pop("attention_probs_dropout_prob") == 0.0
  default["model"].pop("attention_probs_dropout_prob")
  assert fast == default and default["model"]["attention_impl"] == "auto"


def test_unknown_preset_is_named():
  with pytest.raises(ValueError, match=r"configs/base.py:slow: the argument names a preset, one of \[.*'fast'"):
    importlib.import_module("configs.base").get_config("slow")
