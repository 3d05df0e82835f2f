"""jbert.embed against sentence-transformers (its own folders) and against transformers' hidden states."""
import logging

import numpy as np
import pytest
import torch

import jbert
from jbert.inference import embedding as embed_lib
from jbert.inference import load_model

from inference.tiny_models import TEXTS, hf_tokenizer


def _cosine(a, b):
  return np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def _sentence_transformer(folder):
  from sentence_transformers import SentenceTransformer
  return SentenceTransformer(str(folder), device="cpu")


@pytest.mark.parametrize("folder", ["st_dir", "st_dense_dir", "legacy_st_dir"])
def test_sentence_transformers_folder_as_its_authors_set_it_up(folder, request):
  folder = request.getfixturevalue(folder)
  want = _sentence_transformer(folder).encode(TEXTS, batch_size=4, convert_to_numpy=True)
  got = jbert.embed(TEXTS, str(folder), batch_size=4)
  assert got.shape == want.shape and got.dtype == np.float32
  assert np.abs(got - want).max() <= 1e-5
  assert _cosine(got, want).min() >= 0.99999


def test_sentence_transformers_settings_are_read(st_dir, legacy_st_dir):
  st = load_model(st_dir).sentence_transformer
  assert (st.pooling, st.normalize, st.max_length) == (("mean",), True, 24)
  legacy = load_model(legacy_st_dir).sentence_transformer
  assert (legacy.pooling, legacy.normalize, legacy.max_length) == (("cls", "max"), False, 12)
  # Explicit arguments override the folder's choices.
  model = load_model(st_dir)
  settings = embed_lib.embedding_settings(model, pooling="cls", normalize=False, max_length=16)
  assert (settings.pooling, settings.normalize, settings.max_length) == (("cls",), False, 16)


def _reference(folder, texts, max_length):
  """transformers' hidden states, pooler output and attention mask for `texts`."""
  import transformers
  model = transformers.BertModel.from_pretrained(str(folder)).eval()
  enc = hf_tokenizer(folder / "vocab.txt")(texts, padding=True, truncation=True, max_length=max_length,
                                           return_tensors="pt")
  with torch.no_grad():
    out = model(**enc, output_hidden_states=True)
  return [h.numpy() for h in out.hidden_states], out.pooler_output.numpy(), enc["attention_mask"].numpy()


def test_poolings_and_layers_match_transformers(hf_model_dir):
  hidden, pooler, mask = _reference(hf_model_dir, TEXTS, 20)
  m = mask[..., None].astype(np.float32)
  mean = lambda h: (h * m).sum(1) / m.sum(1)
  expected = {
      ("cls", None, "concat"): hidden[-1][:, 0],
      ("pooler", None, "concat"): pooler,
      ("mean", None, "concat"): mean(hidden[-1]),
      ("max", None, "concat"): np.where(m > 0, hidden[-1], -np.inf).max(1),
      ("mean", "0,1,2", "concat"): np.concatenate([mean(h) for h in hidden], -1),
      ("cls", "-2,-1", "mean"): (hidden[1][:, 0] + hidden[2][:, 0]) / 2,
      ("cls,mean", "1", "concat"): np.concatenate([hidden[1][:, 0], mean(hidden[1])], -1),
  }
  model = load_model(hf_model_dir)
  for (pooling, layers, combine), want in expected.items():
    got = jbert.embed(TEXTS, model, pooling=pooling, layers=layers, layer_combine=combine, max_length=20,
                      batch_size=3)
    assert got.shape == want.shape, pooling
    assert np.abs(got - want).max() <= 1e-5, (pooling, layers, combine)
  unit = jbert.embed(TEXTS, model, pooling="mean", normalize=True, max_length=20)
  np.testing.assert_allclose(unit, expected[("mean", None, "concat")]
                             / np.linalg.norm(expected[("mean", None, "concat")], axis=-1, keepdims=True), atol=1e-6)


def test_pairs_and_empty_texts(hf_model_dir):
  model = load_model(hf_model_dir)
  tok = hf_tokenizer(hf_model_dir / "vocab.txt")
  import transformers
  torch_model = transformers.BertModel.from_pretrained(str(hf_model_dir)).eval()
  pairs = [("the cat sat", "on the mat"), ("", "a dog"), ("big red", "")]
  for (a, b), row in zip(pairs, jbert.embed(pairs, model, pooling="cls")):
    enc = tok(a, b or None, return_tensors="pt")
    with torch.no_grad():
      want = torch_model(**enc).last_hidden_state[0, 0].numpy()
    assert np.abs(row - want).max() <= 1e-5
  # An empty text is [CLS] [SEP]: a defined, finite vector.
  empty = jbert.embed([""], model, pooling="mean")
  assert empty.shape == (1, 32) and np.isfinite(empty).all()
  assert jbert.embed([], model, pooling="mean").shape == (0, 32)


def test_truncation_is_counted_and_reported_once(hf_model_dir, caplog):
  texts = ["the cat " * 20, "a dog", "the big " * 20]
  with caplog.at_level(logging.WARNING, logger="jbert"):
    jbert.embed(texts, str(hf_model_dir), pooling="mean", max_length=8)
  warnings = [r.getMessage() for r in caplog.records if "truncated" in r.getMessage()]
  assert warnings == ["2 of 3 inputs had more than max_length=8 tokens and were truncated."]


def test_bad_arguments_are_refused(hf_model_dir, mlm_dir):
  model = load_model(hf_model_dir)
  with pytest.raises(ValueError, match="not a sentence-transformers folder.*pass pooling="):
    jbert.embed(["x"], model)
  with pytest.raises(ValueError, match="Unknown pooling median"):
    jbert.embed(["x"], model, pooling="median")
  with pytest.raises(ValueError, match="Layer index 3 is out of range for a 2-layer model"):
    jbert.embed(["x"], model, pooling="cls", layers=[3])
  with pytest.raises(ValueError, match="comma-separated integers"):
    jbert.embed(["x"], model, pooling="cls", layers="last")
  with pytest.raises(ValueError, match="cannot combine with layers"):
    jbert.embed(["x"], model, pooling="pooler", layers=[1])
  with pytest.raises(ValueError, match="max_length=100 must lie in"):
    jbert.embed(["x"], model, pooling="cls", max_length=100)
  with pytest.raises(ValueError, match="chunk_size must be a positive int .*, got 0"):
    next(embed_lib.Embedder(model, pooling="cls").stream(["x"], chunk_size=0))
  with pytest.raises(TypeError, match="Input 1 is a int"):
    jbert.embed(["x", 3], model, pooling="cls")
  # A masked-LM checkpoint has no trained pooler.
  with pytest.raises(ValueError, match="no trained pooler"):
    jbert.embed(["x"], str(mlm_dir), pooling="pooler")


def test_bfloat16_compute_stays_close(st_dir):
  model = load_model(st_dir)
  full = jbert.embed(TEXTS, model)
  half = jbert.embed(TEXTS, model, dtype="bfloat16")
  assert half.dtype == np.float32 and half.shape == full.shape
  assert _cosine(half, full).min() >= 0.99
  assert np.abs(half - full).max() > 0  # The compute really ran in bfloat16.


def test_an_xlmr_sentence_transformers_folder_with_its_own_tokenizer(tmp_path, model_type="xlm-roberta"):
  """jbert.embed reads the folder's XLM-R SentencePiece tokenizer (trained on the shared text, saved by
  transformers) and equals sentence-transformers on English, non-English and awkward texts. (RoBERTa's byte-level
  BPE shares the tokenizer class, jbert/tokenizer/pipeline.py, and goes through fill_mask's test.)"""
  import transformers
  from sentence_transformers import SentenceTransformer, models as st_models
  from tests.tokenizer import family_corpus
  family_corpus.quiet_transformers()
  train = family_corpus.train_bpe if model_type == "roberta" else family_corpus.train_xlmr
  hf = train(tmp_path / "tok", vocab_size=600)
  config_cls = transformers.RobertaConfig if model_type == "roberta" else transformers.XLMRobertaConfig
  model_cls = transformers.RobertaModel if model_type == "roberta" else transformers.XLMRobertaModel
  vocab = len(transformers.AutoTokenizer.from_pretrained(str(hf)))
  torch.manual_seed(0)
  model_cls(config_cls(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=37, max_position_embeddings=66, type_vocab_size=1,
                       pad_token_id=1)).save_pretrained(str(hf))
  folder = tmp_path / "st"
  SentenceTransformer(modules=[st_models.Transformer(str(hf), max_seq_length=64),
                               st_models.Pooling(32, "mean")]).save(str(folder))
  texts = ["Zoë Müller lives in Paris.", "Привет, как дела?", "東京は日本の首都です。", "The <mask> of France.",
           "emoji 😀🎉 and   spaces", *family_corpus.held_out()[:20]]
  expected = SentenceTransformer(str(folder), device="cpu").encode(texts, convert_to_numpy=True)
  np.testing.assert_allclose(np.asarray(jbert.embed(texts, str(folder))), expected, atol=1e-5, rtol=0)
  # The bare folder (no sentence-transformers length): a text past the model's 64 positions (66 rows less
  # XLM-R's offset of 2) is cut at 64 tokens, as transformers' tokenizer cuts at that cap.
  long_text = " ".join(family_corpus.held_out()[:6])
  encoded = transformers.AutoTokenizer.from_pretrained(str(hf))(long_text, return_tensors="pt", truncation=True,
                                                                max_length=64)
  assert encoded["input_ids"].shape[1] == 64
  with torch.no_grad():
    want = model_cls.from_pretrained(str(hf)).eval()(**encoded).last_hidden_state[0].mean(0).numpy()
  np.testing.assert_allclose(np.asarray(jbert.embed([long_text], str(hf), pooling="mean"))[0], want, atol=1e-5,
                             rtol=0)
  with pytest.raises(ValueError, match=r"max_length=65 must lie in \[2, 64\] \(max_position_embeddings=66 less "
                                       r"position_offset=2\)"):
    jbert.embed(["x"], str(hf), pooling="mean", max_length=65)
