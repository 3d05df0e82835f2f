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
