"""The shipped configs: phase 2's sequences fit each phase-1 model's positions (the tiny demo's included); the
`fast` preset; RoBERTa's recipe, pretrained through run.py and converted to transformers' RobertaForMaskedLM."""
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


@pytest.mark.parametrize("name", ["base", "large", "roberta:base", "roberta:large", "modernbert:base",
                                  "modernbert:large"])
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


@pytest.mark.parametrize("arg, layers, hidden, lr, warmup", [("base", 12, 768, 6e-4, 24_000),
                                                            ("large", 24, 1024, 4e-4, 30_000)])
def test_roberta_configs_are_the_papers_recipe_on_a_roberta_model(arg, layers, hidden, lr, warmup):
  from configs import roberta  # pylint: disable=import-outside-toplevel
  config = roberta.get_config(arg)
  assert (config.data.nsp, config.data.short_seq_prob, config.data.max_seq_length) == (False, 0.0, 512)
  assert (config.batch_size, config.total_steps) == (8192, 500_000)
  o = config.optim
  assert (o.learning_rate, o.warmup_steps, o.b1, o.b2, o.eps, o.weight_decay, o.grad_clip_norm) == (
      lr, warmup, 0.9, 0.98, 1e-6, 0.01, 0.0)
  model = architecture.bert_config(config.model, 50265, pad_token_id=1)
  assert (model.model_type, model.num_hidden_layers, model.hidden_size, model.type_vocab_size) == (
      "roberta", layers, hidden, 1)
  assert (model.layer_norm_eps, model.max_position_embeddings, model.position_offset, model.max_length) == (
      1e-5, 514, 2, 512)
  train.check_model(config, model, sharding.make_mesh(-1, 1, 1, 1))  # the length fits the positions
  with pytest.raises(ValueError, match=r"configs/roberta.py:medium: name a size, one of \['tiny', 'base', "
                                       r"'large'\]"):
    roberta.get_config("medium")


def test_roberta_tiny_pretrains_through_run_py_and_converts_to_a_roberta_masked_lm(tmp_path):
  """run.py with `--config=configs/roberta.py:tiny` a few steps (in this process), MLM only (a masked LM, no NSP
  head); the workdir written back by `python -m jbert.convert` is a RobertaForMaskedLM folder transformers loads
  with no missing or unexpected weight, whose logits equal jbert's on padded rows (RoBERTa's positions skip the
  padding id)."""
  import numpy as np  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  import jbert  # pylint: disable=import-outside-toplevel
  from configs import roberta  # pylint: disable=import-outside-toplevel
  from jbert import convert  # pylint: disable=import-outside-toplevel
  import script_module  # pylint: disable=import-outside-toplevel
  workdir, out = tmp_path / "run", tmp_path / "hf"
  config = roberta.get_config("tiny")
  with config.unlocked():
    config.total_steps, config.batch_size, config.eval_every_steps, config.checkpoint_every_steps = 3, 8, 0, 3
  script_module.load("run.py").execute(config, str(workdir))
  assert convert.main([str(workdir), str(out)]) == 0
  info = jbert.describe(str(workdir))
  assert info.head.cls is jbert.BertForMaskedLM and info.config.model_type == "roberta"
  model, loading = transformers.AutoModelForMaskedLM.from_pretrained(str(out), output_loading_info=True)
  assert type(model).__name__ == "RobertaForMaskedLM"
  assert not any(loading[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(out))
  encoded = tokenizer(["the cat sat on the mat", "a b"], padding=True, return_tensors="np")
  ids, mask = encoded["input_ids"].astype(np.int32), encoded["attention_mask"].astype(np.int32)
  assert (ids == tokenizer.pad_token_id).any()
  with torch.no_grad():
    want = model.eval()(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask)).logits
  config, params = jbert.load_pretrained(str(workdir), jbert.BertForMaskedLM)
  got = jbert.BertForMaskedLM(config).apply({"params": params}, ids, attention_mask=mask).mlm_logits
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(got)[real], want.numpy()[real], atol=1e-5, rtol=0)


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


@pytest.mark.parametrize("arg, layers, hidden, ffn, lr, batch, length, theta, decay", [
    ("base", 22, 768, 1152, 8e-4, 4608, 1024, 10_000.0, 0), ("large", 28, 1024, 2624, 5e-4, 4928, 1024, 10_000.0, 0),
    ("base_long", 22, 768, 1152, 3e-4, 72, 8192, 160_000.0, 84_771)])
def test_modernbert_configs_are_the_papers_recipe(arg, layers, hidden, ffn, lr, batch, length, theta, decay):
  from configs import modernbert  # pylint: disable=import-outside-toplevel
  config = modernbert.get_config(arg)
  d, o = config.data, config.optim
  inherited = arg.endswith("_long")  # the long phase reads phase 1's corpus and recipe from init_from's workdir
  assert (d.nsp, d.masked_lm_prob) == ((None, None) if inherited else (False, 0.3))
  assert (d.max_seq_length, d.max_predictions_per_seq, config.batch_size) == (length, -(-3 * length // 10), batch)
  assert (o.name, o.schedule, o.learning_rate, o.b1, o.b2, o.eps, o.grad_clip_norm, o.decay_embeddings,
          o.decay_steps) == ("stable_adamw", "wsd", lr, 0.9, 0.98, 1e-6, 0.0, False, decay)
  assert o.weight_decay * o.learning_rate == pytest.approx(1e-5)  # the paper's per-step decay
  with config.unlocked():
    config.optim.learning_rate = 1e-3
  assert config.optim.weight_decay == pytest.approx(1e-2)  # it follows an overridden rate
  model = architecture.bert_config(config.model, 50280, pad_token_id=50283)
  assert (model.model_type, model.num_hidden_layers, model.hidden_size, model.intermediate_size, model.vocab_size,
          model.local_attention, model.rope_theta, model.local_rope_theta) == (
      "modernbert", layers, hidden, ffn, 50368, 128, theta, 10_000.0)
  assert model.layer_types[:4] == ("full_attention", "sliding_attention", "sliding_attention", "full_attention")
  train.check_model(config, model, sharding.make_mesh(-1, 1, 1, 1))  # the length fits the model
  with pytest.raises(ValueError, match=r"configs/modernbert.py:medium: name a size or its long-context phase, one "
                                       r"of \['tiny', 'base', 'large', 'tiny_long', 'base_long', 'large_long'\]"):
    modernbert.get_config("medium")


def test_modernbert_tiny_pretrains_on_a_bpe_corpus_resumes_and_converts_to_a_modernbert_masked_lm(tmp_path):
  """`python run.py --config=configs/modernbert.py:tiny` on a prepared byte-level BPE corpus: stopped by SIGTERM
  after a checkpoint, the same command finishes the run (every step logged once, the loss falling); `jbert.convert`
  writes a ModernBertForMaskedLM folder transformers loads with no missing or unexpected weight, whose logits equal
  jbert's (fp32, <= 1e-5) on padded rows longer than the sliding window."""
  import json  # pylint: disable=import-outside-toplevel
  import signal  # pylint: disable=import-outside-toplevel
  import subprocess  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  import transformers  # pylint: disable=import-outside-toplevel
  import jbert  # pylint: disable=import-outside-toplevel
  from tests.tokenizer import family_corpus  # pylint: disable=import-outside-toplevel
  lines = family_corpus.training_lines()
  novel, corpus = tmp_path / "novel.txt", tmp_path / "corpus"
  novel.write_text("\n\n".join(" ".join(lines[i:i + 8]) for i in range(0, len(lines), 8)) + "\n", encoding="utf-8")
  prepare = subprocess.run([sys.executable, "-m", "jbert.data", "prepare", f"--input={novel}", f"--output={corpus}",
                            "--workers=1", "--train_vocab=700", "--vocab_kind=bpe", "--nolowercase"],
                           cwd=REPO, capture_output=True, text=True, timeout=600)
  assert prepare.returncode == 0, prepare.stderr[-3000:]
  workdir, out, total = tmp_path / "run", tmp_path / "hf", 40
  command = [sys.executable, "run.py", "--config=configs/modernbert.py:tiny", f"--workdir={workdir}",
             "--config.data.source=prepared", f"--config.data.prepared={corpus}", f"--config.total_steps={total}",
             "--config.batch_size=8", "--config.log_every_steps=1", "--config.checkpoint_every_steps=10",
             "--config.eval_every_steps=0", "--config.optim.warmup_steps=8"]
  proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  try:
    for line in proc.stderr:  # the first checkpoint is complete once the step after it is logged
      if "step 11/" in line:
        proc.send_signal(signal.SIGTERM)
        break
    err = proc.communicate(timeout=300)[1]
  finally:
    proc.kill()
  assert proc.returncode == 0 and "after SIGTERM; resume with:" in err, err[-3000:]
  resumed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert resumed.returncode == 0 and "resumed from checkpoint step" in resumed.stderr, resumed.stderr[-3000:]
  rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
  losses = {r["step"]: r["train/loss"] for r in rows if "train/loss" in r}
  assert sorted(losses) == list(range(1, total + 1))
  assert np.mean([losses[s] for s in range(total - 4, total + 1)]) < np.mean([losses[s] for s in range(1, 6)]) - 0.5
  convert = subprocess.run([sys.executable, "-m", "jbert.convert", str(workdir), str(out)], cwd=REPO,
                           capture_output=True, text=True, timeout=600)
  assert convert.returncode == 0, convert.stderr[-3000:]
  model, loading = transformers.AutoModelForMaskedLM.from_pretrained(str(out), output_loading_info=True)
  assert type(model).__name__ == "ModernBertForMaskedLM"
  assert not any(loading[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), loading
  written = json.loads((out / "config.json").read_text())
  assert (written["local_attention"], written["global_rope_theta"], written["local_rope_theta"]) == (16, 1e4, 1e4)
  tokenizer = jbert.load_tokenizer(corpus / "tokenizer.json")
  texts = [" ".join(lines[:6]), lines[7]]  # the first row is longer than the window of 16, the second is padded
  encoded = [[tokenizer.cls_id, *tokenizer.ids(t)[:58], tokenizer.sep_id] for t in texts]
  ids = np.full((2, max(map(len, encoded))), tokenizer.pad_id, np.int32)
  mask = np.zeros_like(ids)
  for row, e in enumerate(encoded):
    ids[row, :len(e)], mask[row, :len(e)] = e, 1
  assert ids.shape[1] > 3 * 16 and mask[1].sum() < ids.shape[1]
  with torch.no_grad():
    want = model.eval()(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask)).logits
  config, params = jbert.load_pretrained(str(workdir), jbert.BertForMaskedLM)
  got = jbert.BertForMaskedLM(config).apply({"params": params}, ids, attention_mask=mask).mlm_logits
  real = mask.astype(bool)
  np.testing.assert_allclose(np.asarray(got)[real], want.numpy()[real], atol=1e-5, rtol=0)
