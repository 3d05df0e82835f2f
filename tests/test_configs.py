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


def _refusal(capsys, monkeypatch, config, workdir) -> str:
  """The one stderr line of a run that stops with exit status 2 before anything compiles or is written."""
  import script_module  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(train, "build_steps", lambda *a, **k: pytest.fail("compiled before refusing"))
  capsys.readouterr()
  with pytest.raises(SystemExit) as exit_:
    script_module.load("run.py").execute(config, str(workdir))
  assert exit_.value.code == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err, err
  assert not workdir.exists()
  return err.rstrip("\n")


@pytest.mark.parametrize("name", ["base", "large", "base:roberta"])
def test_the_pretraining_configs_without_a_corpus_say_what_to_run(name, tmp_path, capsys, monkeypatch):
  import importlib  # pylint: disable=import-outside-toplevel
  path, _, arg = name.partition(":")
  config = importlib.import_module(f"configs.{path}").get_config(arg or None)
  assert config.data.source == "prepared" and config.data.prepared is None
  assert _refusal(capsys, monkeypatch, config, tmp_path / "run") == (
      "run.py: data.source='prepared' needs data.prepared: prepare the corpus once with `python -m jbert.data "
      "prepare --input=GLOB --output=DIR`, then pass --config.data.prepared=DIR.")


def test_phase2_without_a_phase1_workdir_names_both_ways_to_a_corpus(tmp_path, capsys, monkeypatch):
  config = phase2.get_config("tiny")
  assert _refusal(capsys, monkeypatch, config, tmp_path / "run") == (
      "run.py: data.source is unset, to take the corpus of the phase-1 run, but there is no init_from: pass "
      "--config.init_from=PHASE1_WORKDIR, or name the corpus (--config.data.source=prepared "
      "--config.data.prepared=DIR, or source=text/files/tfds with its keys).")


def test_the_roberta_preset_is_the_base_model_with_roberta_s_data_recipe():
  from configs import base  # pylint: disable=import-outside-toplevel
  plain, roberta = base.get_config(), base.get_config("roberta")
  assert (roberta.data.nsp, roberta.data.short_seq_prob, roberta.optim.b2) == (False, 0.0, 0.98)
  assert (plain.data.nsp, plain.data.max_predictions_per_seq) == (True, 20)
  roberta.data.masked_lm_prob = 0.3  # MosaicBERT's rate, one key: the cap follows
  assert roberta.data.max_predictions_per_seq == 39
  assert roberta.model.to_dict() == plain.model.to_dict()
  with pytest.raises(ValueError, match=r"configs/base.py:fast2: the argument names a preset, one of \['roberta', 'fast'\]"):
    base.get_config("fast2")


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
