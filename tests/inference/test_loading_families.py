"""sentence-transformers and CrossEncoder folders built on RoBERTa, XLM-R and DistilBERT, read by jbert's loading:
embeddings and cross-encoder scores equal sentence-transformers' (fp32, <= 1e-5).

The folders' tokenizers are byte-pair encodings (`tokenizer.json`), which jbert's own tokenizers do not read yet
(issue 39 part B): jbert is handed the ids of the folder's tokenizer through transformers, and a WordPiece vocabulary
stands in for `load_model`'s tokenizer argument. What is compared is therefore everything after tokenisation: the
folder's weights, pooling, normalisation and the cross-encoder's head.
"""
import numpy as np
import pytest
import torch
import transformers
from sentence_transformers import CrossEncoder, SentenceTransformer, models
from tokenizers import Tokenizer, models as tok_models, pre_tokenizers, processors, trainers

import jbert
from jbert.inference import loading
from jbert.inference.embedding import embedding_fn, embedding_settings
from jbert.weights import st_folder

TEXTS = ["the cat sat on the mat", "a dog ran in the park today", "the bird sang", "cats and dogs play",
         "a quiet morning in the park", "the mat was red"]
SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
FAMILIES = {  # model_type -> (transformers config, class prefix, special tokens in id order, template)
    "roberta": (lambda **kw: transformers.RobertaConfig(**SIZES, max_position_embeddings=42, type_vocab_size=1,
                                                        pad_token_id=1, **kw), "Roberta",
                ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], ("<s>", "</s>")),
    "xlm-roberta": (lambda **kw: transformers.XLMRobertaConfig(**SIZES, max_position_embeddings=42,
                                                               type_vocab_size=1, pad_token_id=1, **kw), "XLMRoberta",
                    ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], ("<s>", "</s>")),
    "distilbert": (lambda **kw: transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4,
                                                              hidden_dim=37, max_position_embeddings=40, **kw),
                   "DistilBert", ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], ("[CLS]", "[SEP]")),
}


def _tokenizer(model_type):
  """A tiny BPE trained on TEXTS, with the family's special tokens and its single-sequence template."""
  _, _, specials, (first, last) = FAMILIES[model_type]
  tok = Tokenizer(tok_models.BPE(unk_token=specials[3] if model_type != "distilbert" else "[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=90, special_tokens=specials))
  tok.post_processor = processors.TemplateProcessing(
      single=f"{first} $A {last}", pair=f"{first} $A {last} {last} $B {last}",
      special_tokens=[(first, tok.token_to_id(first)), (last, tok.token_to_id(last))])
  names = dict(zip(("bos_token", "pad_token", "eos_token", "unk_token", "mask_token"), specials))
  if model_type == "distilbert":
    names = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
             "mask_token": "[MASK]"}
  return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=32, **names)


def _hf_folder(model_type, suffix, path, **config):
  make, prefix, _, _ = FAMILIES[model_type]
  torch.manual_seed(0)
  model = getattr(transformers, prefix + suffix)(make(**config)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name.lower() or name.endswith("bias"):
        p.add_(0.3 * torch.randn_like(p))
  model.save_pretrained(path)
  _tokenizer(model_type).save_pretrained(path)
  return str(path)


def _stand_in_vocab(path):
  """A WordPiece vocabulary for `load_model`'s tokenizer argument (the folder's BPE is part B's)."""
  (path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
  return str(path / "vocab.txt")


def _ids(tokenizer, texts, pairs=None):
  enc = tokenizer(texts, pairs, padding=True, return_tensors="np")
  ids = enc["input_ids"].astype(np.int32)
  return {"input_ids": ids, "attention_mask": enc["attention_mask"].astype(np.int32),
          "token_type_ids": np.zeros_like(ids)}


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_a_sentence_transformers_folder_embeds_as_sentence_transformers(model_type, tmp_path):
  hf = _hf_folder(model_type, "Model", tmp_path / "hf")
  modules = [models.Transformer(hf, max_seq_length=32), models.Pooling(32, pooling_mode="mean"), models.Normalize()]
  SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "st"))
  reference = SentenceTransformer(str(tmp_path / "st"), device="cpu")
  want = reference.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=False)

  model = loading.load_model(str(tmp_path / "st"), tokenizer=_stand_in_vocab(tmp_path))
  assert model.config.model_type == model_type and model.sentence_transformer.pooling == ("mean",)
  settings = embedding_settings(model)
  assert settings.normalize and settings.max_length == 32
  got = embedding_fn(model.config, settings)({"bert": model.params}, _ids(reference.tokenizer, TEXTS))["embedding"]
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_a_cross_encoder_folder_scores_as_sentence_transformers(model_type, tmp_path):
  hf = _hf_folder(model_type, "ForSequenceClassification", tmp_path / "hf", num_labels=1)
  CrossEncoder(hf, num_labels=1, max_length=32, device="cpu").save(str(tmp_path / "ce"))
  reference = CrossEncoder(str(tmp_path / "ce"), device="cpu")
  queries, docs = TEXTS[:3], TEXTS[3:]
  want = reference.predict(list(zip(queries, docs)), activation_fn=torch.nn.Identity(), convert_to_numpy=True)

  info = jbert.describe(str(tmp_path / "ce"))
  assert info.head.cls is jbert.BertForSequenceClassification and info.num_labels == 1
  assert st_folder.cross_encoder_activation(str(tmp_path / "ce")) is not None
  config, params = jbert.load_pretrained(str(tmp_path / "ce"), jbert.BertForSequenceClassification)
  batch = _ids(reference.tokenizer, queries, docs)
  logits = jbert.BertForSequenceClassification(config, num_labels=1).apply(
      {"params": params}, batch["input_ids"], attention_mask=batch["attention_mask"]).logits
  np.testing.assert_allclose(np.asarray(logits)[:, 0], want, atol=1e-5, rtol=0)


def _embed(*args) -> int:
  """`python -m jbert.embed ARGS` in this process: its exit status."""
  import importlib  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  command = importlib.import_module("jbert.embed")
  flags.FLAGS.unparse_flags()
  try:
    command.main(flags.FLAGS(["jbert.embed", *map(str, args)]))
    return 0
  except SystemExit as e:
    return e.code
  finally:
    flags.FLAGS.unparse_flags()


@pytest.mark.parametrize("model_type", ["roberta", "distilbert"])
def test_jbert_embed_runs_a_family_folder_packed_as_sentence_transformers_does(model_type, tmp_path):
  """The command end to end (packed rows, the runner, the folder's pooling and normalisation) on a family's model.
  The folder's tokenizer is WordPiece, which jbert reads today, so both sides tokenise alike; every word of TEXTS
  is in the vocabulary (no [UNK], whose id is RoBERTa's padding id)."""
  words = sorted({w for t in TEXTS for w in t.split()})
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
  make, prefix, _, _ = FAMILIES[model_type]
  torch.manual_seed(0)
  model = getattr(transformers, prefix + "Model")(make()).eval()
  model.save_pretrained(tmp_path / "hf")
  transformers.BertTokenizerFast(str(tmp_path / "vocab.txt"), model_max_length=32).save_pretrained(tmp_path / "hf")
  modules = [models.Transformer(str(tmp_path / "hf"), max_seq_length=32), models.Pooling(32, pooling_mode="mean"),
             models.Normalize()]
  SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "st"))
  want = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS, convert_to_numpy=True)
  (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
  assert _embed(f"--model={tmp_path / 'st'}", f"--input={tmp_path / 'in.txt'}",
                f"--output={tmp_path / 'out.npy'}") == 0
  np.testing.assert_allclose(np.load(tmp_path / "out.npy"), want, atol=1e-5, rtol=0)


def test_rerank_scores_a_distilbert_cross_encoder_as_sentence_transformers_does(tmp_path):
  """`jbert.search --rerank`'s scorer end to end (the folder's own WordPiece tokenizer, pairs, sigmoid)."""
  from jbert.search.rerank import CrossEncoderScorer  # pylint: disable=g-import-not-at-top
  words = sorted({w for t in TEXTS for w in t.split()})
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
  make, prefix, _, _ = FAMILIES["distilbert"]
  torch.manual_seed(0)
  getattr(transformers, prefix + "ForSequenceClassification")(make(num_labels=1)).save_pretrained(tmp_path / "hf")
  transformers.DistilBertTokenizerFast(str(tmp_path / "vocab.txt"), model_max_length=32).save_pretrained(
      tmp_path / "hf")
  CrossEncoder(str(tmp_path / "hf"), num_labels=1, max_length=32, device="cpu").save(str(tmp_path / "ce"))
  pairs = list(zip(TEXTS[:3], TEXTS[3:]))
  want = CrossEncoder(str(tmp_path / "ce"), device="cpu").predict(pairs, convert_to_numpy=True)
  np.testing.assert_allclose(CrossEncoderScorer(str(tmp_path / "ce"))(pairs), want, atol=1e-5, rtol=0)
