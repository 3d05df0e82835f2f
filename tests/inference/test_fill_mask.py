"""jbert.fill_mask against transformers' fill-mask pipeline on the same random weights."""
import numpy as np
import pytest
import transformers

import jbert
from jbert.inference import load_model

from inference.tiny_models import hf_tokenizer

TEXTS = ["paris is the [MASK] of france.", "the [MASK] sat on the [MASK], and the [MASK] sings!",
         "[MASK]", "a big red dog ran quickly[MASK]"]


@pytest.fixture(scope="module")
def pipeline(mlm_dir):
  model = transformers.BertForMaskedLM.from_pretrained(str(mlm_dir)).eval()
  return transformers.pipeline("fill-mask", model=model, tokenizer=hf_tokenizer(mlm_dir / "vocab.txt"), device="cpu")


def test_matches_the_pipeline(mlm_dir, pipeline):
  got = jbert.fill_mask(TEXTS, str(mlm_dir), top_k=4, batch_size=2)
  assert len(got) == len(TEXTS)
  for text, mine in zip(TEXTS, got):
    theirs = pipeline(text, top_k=4)
    if text.count("[MASK]") == 1:
      theirs = [theirs]  # The pipeline drops the per-mask list for a single mask.
    assert len(mine) == len(theirs) == text.count("[MASK]")
    for mask_mine, mask_theirs in zip(mine, theirs):
      assert [p["token"] for p in mask_mine] == [p["token"] for p in mask_theirs]
      assert [p["token_str"] for p in mask_mine] == [p["token_str"] for p in mask_theirs]
      assert [p["sequence"] for p in mask_mine] == [p["sequence"] for p in mask_theirs]
      np.testing.assert_allclose([p["score"] for p in mask_mine], [p["score"] for p in mask_theirs], atol=1e-5)


def test_top_k_is_capped_at_the_vocabulary(mlm_dir):
  model = load_model(mlm_dir, jbert.BertForMaskedLM)
  (ranked,), = jbert.fill_mask("the [MASK]", model, top_k=10_000)
  assert len(ranked) == model.config.vocab_size
  assert abs(sum(p["score"] for p in ranked) - 1) < 1e-4
  assert [p["score"] for p in ranked] == sorted((p["score"] for p in ranked), reverse=True)


def test_bad_inputs(mlm_dir, hf_model_dir):
  model = load_model(mlm_dir, jbert.BertForMaskedLM)
  with pytest.raises(ValueError, match=r"Text 1 \('no mask here'\) has no \[MASK\]"):
    jbert.fill_mask(["the [MASK]", "no mask here"], model)
  with pytest.raises(ValueError, match=r"Text 0 .* a \[MASK\] lies beyond it"):
    jbert.fill_mask(["the " * 20 + "[MASK]"], model, max_length=10)
  with pytest.raises(ValueError, match="top_k must be a positive int"):
    jbert.fill_mask(["the [MASK]"], model, top_k=0)
  # A checkpoint without the masked-LM head would give random predictions.
  with pytest.raises(ValueError, match="has no masked-LM head"):
    jbert.fill_mask(["the [MASK]"], str(hf_model_dir))
  assert jbert.fill_mask([], model) == []


def test_roberta_masks_with_its_own_tokenizer(tmp_path, model_type="roberta"):
  """RoBERTa's `<mask>` (or BERT's spelling, [MASK]) read by the folder's own byte-level BPE: the top tokens and
  probabilities equal transformers' masked LM on the same text. (XLM-R's tokenizer shares the class,
  jbert/tokenizer/pipeline.py, and goes through jbert.embed's test.)"""
  import torch
  from tests.tokenizer import family_corpus
  family_corpus.quiet_transformers()
  train = family_corpus.train_bpe if model_type == "roberta" else family_corpus.train_xlmr
  folder = train(tmp_path / "tok", vocab_size=600)
  theirs_tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
  config_cls = transformers.RobertaConfig if model_type == "roberta" else transformers.XLMRobertaConfig
  model_cls = transformers.RobertaForMaskedLM if model_type == "roberta" else transformers.XLMRobertaForMaskedLM
  torch.manual_seed(0)
  model = model_cls(config_cls(vocab_size=len(theirs_tokenizer), hidden_size=32, num_hidden_layers=2,
                               num_attention_heads=4, intermediate_size=37, max_position_embeddings=66,
                               type_vocab_size=1, pad_token_id=1)).eval()
  model.save_pretrained(str(folder))
  text = "Zoë lives in <mask> of France, Привет <mask>."
  encoded = theirs_tokenizer(text, return_tensors="pt")
  with torch.no_grad():
    logits = model(**encoded).logits[0]
  positions = (encoded["input_ids"][0] == theirs_tokenizer.mask_token_id).nonzero()[:, 0]
  expected = [torch.softmax(logits[p], -1).topk(3) for p in positions]
  for spelled in (text, text.replace("<mask>", "[MASK]")):
    got = jbert.fill_mask([spelled], str(folder), top_k=3)[0]
    assert [[p["token"] for p in mask] for mask in got] == [e.indices.tolist() for e in expected]
    np.testing.assert_allclose([[p["score"] for p in mask] for mask in got], [e.values.tolist() for e in expected],
                               atol=1e-6)
  # A text longer than the model's 64 positions (66 rows less RoBERTa's offset of 2) is cut at 64 tokens by
  # default, as transformers' tokenizer cuts at that cap, and no position reaches past the table.
  long_text = "The <mask> sat. " + " ".join(family_corpus.held_out()[:6])
  encoded = theirs_tokenizer(long_text, return_tensors="pt", truncation=True, max_length=64)
  assert len(theirs_tokenizer(long_text)["input_ids"]) > 66 and encoded["input_ids"].shape[1] == 64
  with torch.no_grad():
    (position,) = (encoded["input_ids"][0] == theirs_tokenizer.mask_token_id).nonzero()[:, 0]
    probs = torch.softmax(model(**encoded).logits[0, position], -1).topk(3)
  (mask,) = jbert.fill_mask([long_text], str(folder), top_k=3)[0]
  assert [p["token"] for p in mask] == probs.indices.tolist()
  np.testing.assert_allclose([p["score"] for p in mask], probs.values.tolist(), atol=1e-6)
  with pytest.raises(ValueError, match=r"max_length=65 must lie in \[3, 64\] \(max_position_embeddings=66 less "
                                       r"position_offset=2\)"):
    jbert.fill_mask([long_text], str(folder), max_length=65)
