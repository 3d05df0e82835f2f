"""Re-ranking: hits re-ordered by the cross-encoder's score of (query, text), scores equal to transformers' on
the same folder; a model that is not a cross-encoder is refused."""
import numpy as np
import pytest
import torch
import transformers

from jbert.errors import UserError
from jbert.search import CrossEncoderScorer, Index, rerank

from search.conftest import sentences


def test_hits_are_ordered_by_the_cross_encoders_scores(reranker):
  texts = sentences(12, seed=1)
  rng = np.random.default_rng(0)
  index = Index.build(rng.standard_normal((12, 8)).astype(np.float32), [f"d{i}" for i in range(12)], texts)
  queries = ["the cat sat", "a bird sings quickly under the moon"]
  hits = index.search(rng.standard_normal((2, 8)).astype(np.float32), top_k=8)
  got = rerank(queries, hits, CrossEncoderScorer(str(reranker), batch_size=4), top_k=5)

  model = transformers.BertForSequenceClassification.from_pretrained(reranker).eval()
  tokenizer = transformers.BertTokenizer(str(reranker / "vocab.txt"))
  for query, before, after in zip(queries, hits, got):
    encoded = tokenizer([query] * len(before), [h.text for h in before], return_tensors="pt", padding=True)
    with torch.no_grad():
      logits = model(**encoded).logits[:, 0].numpy()  # a plain one-label regressor: its raw value is the score
    order = np.argsort(-logits, kind="stable")[:5]
    assert [h.id for h in after] == [before[i].id for i in order]
    np.testing.assert_allclose([h.score for h in after], logits[order], atol=1e-5)
    assert [h.retrieval_score for h in after] == [before[i].score for i in order]


def test_a_classifier_with_several_labels_is_not_a_cross_encoder(classifier):
  with pytest.raises(UserError, match=r"^--rerank=.*classifier\S* is a BertForSequenceClassification with 3 labels, "
                                      r"not a cross-encoder \(a one-label BertForSequenceClassification"):
    CrossEncoderScorer(str(classifier))


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta"])
def test_a_roberta_family_cross_encoder_reranks_as_sentence_transformers_scores(model_type, tmp_path):
  """A CrossEncoder folder on RoBERTa / XLM-R with its own tokenizer (byte-level BPE / SentencePiece, trained on the
  shared text): its one token type means a pair's second text is type 0 whatever made the ids, and the scores of
  pairs (non-English, and longer than the folder's max_length, so both sides truncate) equal
  `CrossEncoder.predict`'s."""
  from sentence_transformers import CrossEncoder  # pylint: disable=g-import-not-at-top
  from tests.tokenizer import family_corpus  # pylint: disable=g-import-not-at-top
  family_corpus.quiet_transformers()
  train = family_corpus.train_bpe if model_type == "roberta" else family_corpus.train_xlmr
  folder = train(tmp_path / "tok", vocab_size=600)
  prefix = "Roberta" if model_type == "roberta" else "XLMRoberta"
  config = getattr(transformers, prefix + "Config")(
      vocab_size=len(transformers.AutoTokenizer.from_pretrained(str(folder))), hidden_size=32, num_hidden_layers=2,
      num_attention_heads=4, intermediate_size=37, max_position_embeddings=34, type_vocab_size=1, pad_token_id=1,
      num_labels=1)
  torch.manual_seed(0)
  getattr(transformers, prefix + "ForSequenceClassification")(config).save_pretrained(str(folder))
  CrossEncoder(str(folder), num_labels=1, max_length=32, device="cpu").save(str(tmp_path / "ce"))

  texts = ["Привет, как дела? Москва — столица России.", "東京は日本の首都です。", "the cat sat on the mat",
           " ".join(family_corpus.held_out()[:3]), "Zoë Müller lives in Paris, naïve café."]
  queries = ["where is the capital", "Ça va très bien, merci ; l'élève a reçu un prix à l'école d'été."]
  index = Index.build(np.eye(len(texts), 8, dtype=np.float32), [f"d{i}" for i in range(len(texts))], texts)
  hits = index.search(np.eye(2, 8, dtype=np.float32), top_k=len(texts))
  # The default length is the model's 32 positions (34 rows less the offset of 2), the folder's max_length.
  got = rerank(queries, hits, CrossEncoderScorer(str(tmp_path / "ce")))

  reference = CrossEncoder(str(tmp_path / "ce"), device="cpu")
  for query, before, after in zip(queries, hits, got):
    want = reference.predict([(query, h.text) for h in before], convert_to_numpy=True)
    order = np.argsort(-want, kind="stable")
    assert [h.id for h in after] == [before[i].id for i in order]
    np.testing.assert_allclose([h.score for h in after], want[order], atol=1e-5, rtol=0)
  encoded = reference.tokenizer([queries[1]], [texts[3]], truncation=True, max_length=32)
  assert len(encoded["input_ids"][0]) == 32  # the long pair was truncated on both sides
