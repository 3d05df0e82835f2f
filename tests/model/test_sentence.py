"""SentenceEncoder on packed rows: every text a segment of its own, each pooling mode per segment, gathered back
to [N, K, D]: what each text gives unpacked (≤1e-5), projection, Normalize and SoftmaxLoss's logits included."""
import flax.linen as nn
import jax
import numpy as np
import pytest

import jbert
from jbert.data import packing
from jbert.model import SentenceEncoder, init_params
from jbert.model import pooling
from jbert.model.sentence import Projection

T = 16


def _texts(n, k, seed=0):
  rng = np.random.default_rng(seed)
  mask = (np.arange(T) < rng.integers(2, 9, (n, k))[..., None]).astype(np.int32)
  return {"input_ids": (rng.integers(1, 64, (n, k, T)) * mask).astype(np.int32),
          "token_type_ids": np.zeros((n, k, T), np.int32), "attention_mask": mask}


@pytest.mark.parametrize("modes", [("mean",), ("cls", "max"), ("mean_sqrt_len_tokens", "weightedmean", "lasttoken"),
                                   ("pooler",)])
def test_packed_texts_pool_and_embed_as_each_text_alone(modes):
  config = jbert.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=T, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
  model = SentenceEncoder(config, pooling=modes, projection=Projection(32 * len(modes), 8), normalize=True,
                          num_labels=3)
  params = nn.meta.unbox(init_params(model, jax.random.key(0)))
  features = _texts(6, 2)
  placement = packing.place(packing.example_lengths(features["attention_mask"].reshape(12, T)), max_tokens=T,
                            max_sequences=4)
  packed = packing.pack_texts(features, placement, rows=placement.rows + 1, slots=5)
  assert placement.rows < 12
  want = model.apply({"params": params}, *(features[k] for k in ("input_ids", "token_type_ids", "attention_mask")))
  got = model.apply({"params": params}, packed["input_ids"], packed["token_type_ids"], packed["attention_mask"],
                    segment_ids=packed["segment_ids"], position_ids=packed["position_ids"],
                    cls_positions=packed["cls_positions"], text_slots=packed["text_slots"])
  assert got.embeddings.shape == want.embeddings.shape == (6, 2, 8) and got.logits.shape == (6, 3)
  np.testing.assert_allclose(got.embeddings, want.embeddings, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(got.logits, want.logits, atol=1e-5, rtol=1e-5)


def test_an_empty_slot_pools_to_finite_values():
  x = jax.random.normal(jax.random.key(0), (1, 8, 4))
  segments = np.array([[1, 1, 1, 2, 2, 0, 0, 0]])
  cls = np.array([[0, 3, 0]])  # slot 2 is empty
  for mode in ("max", "mean", "weightedmean", "lasttoken"):
    out = pooling.pool_segments(mode, x, segments, cls)
    assert out.shape == (1, 3, 4) and np.isfinite(out).all()
  np.testing.assert_allclose(pooling.pool_segments("max", x, segments, cls)[0, 1], np.max(x[0, 3:5], 0))
  np.testing.assert_allclose(pooling.pool_segments("weightedmean", x, segments, cls)[0, 1],
                             (x[0, 3] + 2 * x[0, 4]) / 3, rtol=1e-6)
