"""ModernBERT folders through the commands' Python entry points, equal to transformers and sentence-transformers
(fp32, <= 1e-5): a sentence-transformers folder through `jbert.embed` (packed rows, the folder's ModernBERT
tokenizer.json), fill-mask against ModernBertForMaskedLM's top tokens, and `jbert.predict` on a
ModernBertForSequenceClassification folder. The texts run longer than the sliding window of the tiny models."""
import numpy as np
import pytest
import torch
import transformers
from sentence_transformers import SentenceTransformer, models

import jbert
from tests.tokenizer import family_corpus

TEXTS = family_corpus.held_out()[:40:3]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
  return family_corpus.train_modernbert(tmp_path_factory.mktemp("modernbert") / "tok", vocab_size=600)


def _folder(suffix, path, tokenizer_dir, **config):
  tok = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
  hf_config = transformers.ModernBertConfig(
      vocab_size=len(tok), hidden_size=32, num_hidden_layers=3, num_attention_heads=4, intermediate_size=24,
      local_attention=8, pad_token_id=tok.pad_token_id, cls_token_id=tok.cls_token_id, sep_token_id=tok.sep_token_id,
      bos_token_id=tok.cls_token_id, eos_token_id=tok.sep_token_id, **config)
  torch.manual_seed(0)
  model = getattr(transformers, "ModernBert" + suffix)(hf_config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name.lower() or name.endswith("bias"):
        p.add_(0.3 * torch.randn_like(p))
  model.save_pretrained(path)
  tok.save_pretrained(path)
  return model, tok


def test_a_sentence_transformers_folder_embeds_as_sentence_transformers(tokenizer_dir, tmp_path):
  _folder("Model", tmp_path / "hf", tokenizer_dir)
  modules = [models.Transformer(str(tmp_path / "hf"), max_seq_length=64), models.Pooling(32, pooling_mode="mean"),
             models.Normalize()]
  SentenceTransformer(modules=modules, device="cpu").save(str(tmp_path / "st"))
  want = SentenceTransformer(str(tmp_path / "st"), device="cpu").encode(TEXTS, convert_to_numpy=True)
  for packing in (True, False):
    got = jbert.embed(TEXTS, str(tmp_path / "st"), packing=packing)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_fill_mask_ranks_as_transformers(tokenizer_dir, tmp_path):
  model, tok = _folder("ForMaskedLM", tmp_path / "mlm", tokenizer_dir)
  texts = ["The [MASK] of France is a city of the north.", "a quiet [MASK] in the park, then another [MASK]."]
  got = jbert.fill_mask(texts, str(tmp_path / "mlm"), top_k=3)
  for text, predictions in zip(texts, got):
    enc = tok(text, return_tensors="pt")
    with torch.no_grad():
      logits = model(**enc).logits[0]
    masks = (enc["input_ids"][0] == tok.mask_token_id).nonzero()[:, 0]
    assert len(predictions) == len(masks)
    for position, mine in zip(masks, predictions):
      probs = torch.softmax(logits[position], -1)
      top = torch.topk(probs, 3)
      assert [p["token"] for p in mine] == top.indices.tolist()
      np.testing.assert_allclose([p["score"] for p in mine], top.values.numpy(), atol=1e-5, rtol=0)


def test_predict_classifies_as_transformers(tokenizer_dir, tmp_path):
  model, tok = _folder("ForSequenceClassification", tmp_path / "cls", tokenizer_dir, num_labels=3,
                       classifier_pooling="mean")
  pairs = list(zip(TEXTS[:6], TEXTS[6:12]))
  got = jbert.predict(pairs, str(tmp_path / "cls"))
  enc = tok([a for a, _ in pairs], [b for _, b in pairs], padding=True, return_tensors="pt")
  with torch.no_grad():
    probs = torch.softmax(model(**enc).logits, -1).numpy()
  assert [g["label"] for g in got] == [f"LABEL_{i}" for i in probs.argmax(-1)]
  np.testing.assert_allclose([[g["probabilities"][f"LABEL_{i}"] for i in range(3)] for g in got], probs,
                             atol=1e-5, rtol=0)
