"""Fine-tuning each family's Hugging Face folder through run.py as BERT's: RoBERTa (byte-level BPE), XLM-R
(SentencePiece), DistilBERT and ELECTRA (WordPiece) random tiny folders built offline with transformers, fine-tuned
on one shared pair-classification set with `--config.init_from=DIR` and `keep_best`, stopped by SIGTERM after
a checkpoint and finished by the same command; then `python -m jbert.predict` on the export, and the export loaded
by transformers as the family's ForSequenceClassification with no missing or unexpected weight and logits equal
to jbert's (fp32, <= 1e-5).
"""
import importlib
import json

from absl import flags
import numpy as np
import pytest
import torch
import transformers

import jbert
import preemption
import script_module
from tests.tasks import finetune_data as fd
from tests.tokenizer import family_corpus

SIZES = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37)
LENGTH = 16  # data.max_seq_length; the position tables leave room for RoBERTa's offset
STEPS, SAVE, EVAL = 24, 4, 12  # total_steps, checkpoint_every_steps, eval_every_steps


def _wordpiece(folder, tokenizer_cls):
  vocab = fd.write_vocab(folder)
  getattr(transformers, tokenizer_cls)(str(vocab), model_max_length=LENGTH).save_pretrained(folder)
  return len(vocab.read_text().split())


def _lines():
  """The shared set's texts: what the families' byte-level BPE and SentencePiece models are trained on."""
  rows = fd.context_examples(200, seed=0)
  return [r[k] for r in rows for k in ("a", "b")] + [" ".join(fd.WORDS)] * 20


def _bpe(folder):
  """RoBERTa's byte-level BPE (vocab.json + merges.txt), as RobertaTokenizer saves it."""
  from tokenizers import Tokenizer, models, pre_tokenizers, trainers  # pylint: disable=import-outside-toplevel
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.train_from_iterator(_lines(), trainer=trainers.BpeTrainer(
      vocab_size=320, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"], show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  raw = folder.parent / "bpe"
  raw.mkdir()
  tok.model.save(str(raw))
  tokenizer = transformers.RobertaTokenizer.from_pretrained(str(raw), model_max_length=LENGTH)
  tokenizer.save_pretrained(folder)
  return len(tokenizer)


def _sentencepiece(folder):
  """XLM-R's SentencePiece model with fairseq's ids, as XLMRobertaTokenizer saves it (the model beside)."""
  import sentencepiece  # pylint: disable=import-outside-toplevel
  text = folder.parent / "lines.txt"
  text.write_text("\n".join(_lines()) + "\n", encoding="utf-8")
  sentencepiece.SentencePieceTrainer.train(input=str(text), model_prefix=str(folder / "sentencepiece.bpe"),
                                           vocab_size=80, model_type="unigram", num_threads=1,
                                           hard_vocab_limit=False, minloglevel=2)
  (folder / "sentencepiece.bpe.vocab").unlink()
  (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "XLMRobertaTokenizer",
                                                            "model_max_length": LENGTH}))
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
  tokenizer.save_pretrained(folder)
  return len(tokenizer)


# model_type -> (transformers class prefix, the pretrained head the folder holds, tokenizer maker, config kwargs)
FAMILIES = {
    "roberta": ("Roberta", "ForMaskedLM", _bpe,
                dict(max_position_embeddings=LENGTH + 2, type_vocab_size=1, pad_token_id=1)),
    "xlm-roberta": ("XLMRoberta", "ForMaskedLM", _sentencepiece,
                    dict(max_position_embeddings=LENGTH + 2, type_vocab_size=1, pad_token_id=1)),
    "distilbert": ("DistilBert", "ForMaskedLM", lambda f: _wordpiece(f, "DistilBertTokenizerFast"),
                   dict(max_position_embeddings=LENGTH)),
    "electra": ("Electra", "ForPreTraining", lambda f: _wordpiece(f, "ElectraTokenizerFast"),
                dict(max_position_embeddings=LENGTH, embedding_size=16)),
}


def _folder(model_type, folder):
  prefix, head, tokenizer, extra = FAMILIES[model_type]
  folder.mkdir(parents=True)
  vocab = tokenizer(folder)
  config_cls = getattr(transformers, prefix + "Config")
  sizes = SIZES if model_type != "distilbert" else dict(dim=32, n_layers=1, n_heads=4, hidden_dim=37)
  torch.manual_seed(0)
  getattr(transformers, prefix + head)(config_cls(vocab_size=vocab, **sizes, **extra)).save_pretrained(folder)
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


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  """The shared pair-classification set: 64 training and 16 evaluation rows of fd.context_examples."""
  return fd.local_overrides(tmp_path_factory.mktemp("pairs"), n_train=64, n_eval=16)


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_a_family_folder_fine_tunes_resumes_predicts_and_exports_as_transformers(model_type, data, tmp_path):
  family_corpus.quiet_transformers()
  folder = _folder(model_type, tmp_path / "hf")
  config = fd.finetune_config("local", **{
      "init_from": str(folder), "total_steps": STEPS, "batch_size": 8, "log_every_steps": 1,
      "checkpoint_every_steps": SAVE, "eval_every_steps": EVAL, "keep_best": "accuracy",
      "optim.learning_rate": 1e-3,
      "data.max_seq_length": LENGTH, **data})
  workdir = tmp_path / "run"
  # SIGTERM once the first checkpoint is written: the run saves and stops; the same command finishes it.
  preemption.train_until_sigterm(config, workdir, workdir / "checkpoints" / str(SAVE))
  assert not (workdir / "results.json").exists()
  script_module.load("run.py").execute(config, str(workdir))
  logged = [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()
            if "train/loss" in json.loads(line)]
  assert sorted(set(logged)) == list(range(1, STEPS + 1))
  results = json.loads((workdir / "results.json").read_text())
  assert results["step"] == STEPS and results["best"]["step"] in (EVAL, STEPS)
  assert (workdir / "best").is_dir()

  export = workdir / "export"
  prefix = FAMILIES[model_type][0]
  model, loading = transformers.AutoModelForSequenceClassification.from_pretrained(str(export),
                                                                                    output_loading_info=True)
  assert type(model).__name__ == f"{prefix}ForSequenceClassification"
  assert not any(loading[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), loading
  rows = fd.context_examples(16, seed=2)
  tokenizer = transformers.AutoTokenizer.from_pretrained(str(export))
  encoded = tokenizer([r["a"] for r in rows], [r["b"] for r in rows], padding=True, truncation=True,
                      max_length=LENGTH, return_tensors="np")
  with torch.no_grad():
    want = model.eval()(**{k: torch.tensor(v) for k, v in encoded.items()}).logits.numpy()
  bert_config, params = jbert.load_pretrained(str(export), jbert.BertForSequenceClassification)
  assert bert_config.model_type == model_type
  ids = {k: encoded[k].astype(np.int32) for k in ("input_ids", "token_type_ids", "attention_mask") if k in encoded}
  got = jbert.BertForSequenceClassification(bert_config, num_labels=2).apply({"params": params}, **ids).logits
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)

  out = tmp_path / "predictions.jsonl"
  assert _predict(f"--model={export}", f"--input={data['task.eval_file']}", f"--output={out}") == 0
  predictions = [json.loads(line) for line in out.read_text().splitlines()]
  probabilities = np.exp(want - want.max(-1, keepdims=True))
  probabilities /= probabilities.sum(-1, keepdims=True)
  assert [p["label"] for p in predictions] == [("no", "yes")[i] for i in want.argmax(-1)]
  np.testing.assert_allclose([[p["probabilities"][n] for n in ("no", "yes")] for p in predictions], probabilities,
                             atol=1e-5)
