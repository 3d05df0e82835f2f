"""Which corpus a run reads: phase 2 takes the phase-1 workdir's data settings unless given, records them in
history.jsonl, and every pretraining run names its corpus among its first lines."""
import json
import pathlib
import sys

import pytest

import trained
from jbert.data import config as data_config
from jbert.data import corpus
from jbert.train import trainer as train
from jbert.train import workdir_record

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from configs import phase2  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from test_train import small_config  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def phase1_workdir(path, **data):
  recorded = data_config.default_pretrain_config().to_dict()
  recorded.update(data)
  path.mkdir()
  (path / "config.json").write_text(json.dumps({"step": 10, "config": {"data": recorded}}))
  return str(path)


def test_phase2_takes_phase1_s_corpus_and_recipe_and_keeps_what_it_is_given(tmp_path):
  init_from = phase1_workdir(tmp_path / "phase1", source="text", text_files="/corpus/*.txt", nsp=False,
                             masked_lm_prob=0.2, max_seq_length=64, worker_count=7)
  config = phase2.get_config("tiny")
  config.init_from = init_from
  config.data.language = "de"  # given on the command line: kept
  resolved, taken = corpus.inherit(config)
  data = resolved.data
  assert (data.source, data.text_files, data.nsp, data.masked_lm_prob, data.language) == (
      "text", "/corpus/*.txt", False, 0.2, "de")
  assert (data.max_seq_length, data.max_predictions_per_seq, data.worker_count) == (128, 20, 0)  # phase 2's own
  assert data.whole_word_masking is False and data.eval_documents == 2000  # the defaults phase 1 had
  assert dict(taken)["source"] == "text" and "language" not in dict(taken) and "max_seq_length" not in dict(taken)
  assert config.data.source is None  # the caller's config is left as it was
  assert corpus.inherit(resolved) == (resolved, [])  # a config that names its corpus is taken as it is
  assert corpus.describe(data) == "text files /corpus/*.txt"


def test_an_init_from_that_is_no_jbert_workdir_says_so(tmp_path):
  config = phase2.get_config("tiny")
  config.init_from = str(tmp_path)
  with pytest.raises(ValueError, match=r"data.source is unset, to take the corpus of the phase-1 run, but there is "
                                       r"init_from=.* is not a jbert training workdir \(no config.json\): pass"):
    corpus.inherit(config)


def test_a_phase2_run_reads_and_records_the_phase1_corpus(tmp_path_factory, tmp_path, caplog):
  _, phase1 = trained.pretrained(tmp_path_factory)
  config = small_config(total_steps=2, log_every_steps=1, eval_every_steps=0, checkpoint_every_steps=2,
                        init_from=str(phase1))
  corpus.leave_to_init_from(config.data)  # as configs/phase2.py does
  workdir = tmp_path / "phase2"
  with caplog.at_level("INFO", logger="jbert"):
    train.train_and_evaluate(config, str(workdir))
  messages = [r.getMessage() for r in caplog.records]
  assert any(m.startswith(f"data settings of init_from {phase1}: source='synthetic'") for m in messages)
  corpus_line = next(i for i, m in enumerate(messages) if m.startswith("corpus: the generated demo corpus"))
  assert corpus_line < next(i for i, m in enumerate(messages) if m.startswith("step 1 done"))
  [start] = [json.loads(line) for line in (workdir / "history.jsonl").read_text().splitlines()]
  changes = {c["key"]: (c["old"], c["new"], c["allowed_by"]) for c in start["changes"]}
  assert changes["data.source"] == (None, "synthetic", "init_from") and "data.max_seq_length" not in changes
  recorded = json.loads((workdir / "config.json").read_text())["config"]["data"]
  assert recorded["source"] == "synthetic" and recorded["nsp"] is True
  # The same command again, further: its settings resolve to the record's, so it would resume (what the trainer
  # checks before anything is written or compiled).
  config.total_steps = 3
  rerun = workdir_record.check(str(workdir), train.plan(config, str(workdir)).config)
  assert rerun.step == 2 and [c.key for c in rerun.changes] == ["total_steps"]
