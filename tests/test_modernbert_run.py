"""Fine-tuning a ModernBERT folder through run.py as BERT's: a random tiny ModernBertForMaskedLM folder with its
BPE tokenizer.json, built offline, fine-tuned on the shared pair-classification set with packed rows (ModernBERT's
native mode, jbert's default: the sliding window and rotary positions stop at each sequence of a row),
`--config.init_from=DIR` and `keep_best`, stopped by SIGTERM after a checkpoint and finished by the same command;
then `python -m jbert.predict` on the export, and the export loaded by transformers as
ModernBertForSequenceClassification with no missing or unexpected weight and logits equal to jbert's (fp32,
<= 1e-5)."""
import importlib
import json

from absl import flags
import numpy as np
import torch
import transformers

import jbert
import preemption
import script_module
from tests.tasks import finetune_data as fd
from tests.tokenizer import family_corpus

LENGTH = 24  # data.max_seq_length: three times the sliding window of 8
STEPS, SAVE, EVAL = 24, 4, 12  # total_steps, checkpoint_every_steps, eval_every_steps


def _folder(folder):
  trained = family_corpus.train_modernbert(folder.parent / "tok", vocab_size=600)
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(trained))
  tokenizer.save_pretrained(folder)
  config = transformers.ModernBertConfig(
      vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=24,
      local_attention=8, pad_token_id=tokenizer.pad_token_id, cls_token_id=tokenizer.cls_token_id,
      sep_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
      classifier_pooling="mean")
  torch.manual_seed(0)
  transformers.ModernBertForMaskedLM(config).save_pretrained(folder)
  return folder


def _predict(*args) -> int:
  """`python -m jbert.predict ARGS` in this process: its exit status."""
  command = importlib.import_module("jbert.predict")
  flags.FLAGS.unparse_flags()
  try:
    command.main(flags.FLAGS(["jbert.predict", *map(str, args)]))
    return 0
  except SystemExit as e:
    return e.code
  finally:
    flags.FLAGS.unparse_flags()


def test_a_modernbert_folder_fine_tunes_packed_resumes_predicts_and_exports_as_transformers(tmp_path):
  family_corpus.quiet_transformers()
  folder = _folder(tmp_path / "hf")
  data = fd.local_overrides(tmp_path / "pairs", n_train=64, n_eval=16)
  config = fd.finetune_config("local", **{
      "init_from": str(folder), "total_steps": STEPS, "batch_size": 8, "log_every_steps": 1,
      "checkpoint_every_steps": SAVE, "eval_every_steps": EVAL, "keep_best": "accuracy",
      "optim.learning_rate": 1e-3, "data.max_seq_length": LENGTH, **data})
  assert config.data.packing
  workdir = tmp_path / "run"
  preemption.train_until_sigterm(config, workdir, workdir / "checkpoints" / str(SAVE))
  assert not (workdir / "results.json").exists()
  script_module.load("run.py").execute(config, str(workdir))
  logged = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  steps = [m["step"] for m in logged if "train/loss" in m]
  assert sorted(set(steps)) == list(range(1, STEPS + 1))
  losses = [m["train/loss"] for m in logged if "train/loss" in m]
  assert np.isfinite(losses).all()
  results = json.loads((workdir / "results.json").read_text())
  assert results["step"] == STEPS and results["best"]["step"] in (EVAL, STEPS)

  export = workdir / "export"
  model, loading = transformers.AutoModelForSequenceClassification.from_pretrained(str(export),
                                                                                    output_loading_info=True)
  assert type(model).__name__ == "ModernBertForSequenceClassification"
  assert not any(loading[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), loading
  assert model.config.classifier_pooling == "mean" and model.config.local_attention == 8
  rows = fd.context_examples(16, seed=2)
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(export))
  encoded = tokenizer([r["a"] for r in rows], [r["b"] for r in rows], padding=True, truncation=True,
                      max_length=LENGTH, return_tensors="np")
  with torch.no_grad():
    want = model.eval()(**{k: torch.tensor(v) for k, v in encoded.items()}).logits.numpy()
  bert_config, params = jbert.load_pretrained(str(export), jbert.BertForSequenceClassification)
  assert bert_config.model_type == "modernbert"
  got = jbert.BertForSequenceClassification(bert_config, num_labels=2).apply(
      {"params": params}, encoded["input_ids"].astype(np.int32),
      attention_mask=encoded["attention_mask"].astype(np.int32)).logits
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)

  out = tmp_path / "predictions.jsonl"
  assert _predict(f"--model={export}", f"--input={data['task.eval_file']}", f"--output={out}") == 0
  predictions = [json.loads(line) for line in out.read_text().splitlines()]
  probabilities = np.exp(want - want.max(-1, keepdims=True))
  probabilities /= probabilities.sum(-1, keepdims=True)
  assert [p["label"] for p in predictions] == [("no", "yes")[i] for i in want.argmax(-1)]
  np.testing.assert_allclose([[p["probabilities"][n] for n in ("no", "yes")] for p in predictions], probabilities,
                             atol=1e-5)


def test_fine_tunings_unset_scan_layers_stays_unrolled_for_modernbert_on_a_tpu(tmp_path):
  """Fine-tuning's scan_layers=None scans off CPU; ModernBERT's layers differ (no attention norm on layer 0,
  alternating windows), so a ModernBERT init_from resolves to unrolled there, a BERT one to scanned."""
  from jbert.train import plan as plan_lib  # pylint: disable=g-import-not-at-top
  sizes = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=24)
  transformers.ModernBertModel(transformers.ModernBertConfig(**sizes, pad_token_id=0)).save_pretrained(
      tmp_path / "modernbert")
  transformers.BertModel(transformers.BertConfig(**sizes)).save_pretrained(tmp_path / "bert")
  for name, scanned in (("modernbert", False), ("bert", True)):
    config = fd.finetune_config("local", init_from=str(tmp_path / name), **{"model.scan_layers": None})
    assert plan_lib.resolve_scan_layers(config, platform="tpu").model.scan_layers is scanned
    assert plan_lib.resolve_scan_layers(config, platform="cpu").model.scan_layers is False
