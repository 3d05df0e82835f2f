"""The bi-encoder losses of sentence-transformers, as per-row sums (the trainer divides by the global row count).

Each function takes float32 embeddings [B, K, D] (K texts per row) and returns the SUM over the batch's rows of
the per-row loss that sentence-transformers averages, so `sum / B` is its loss value for the same batch:

  cosine_mse     CosineSimilarityLoss: (cos(u, v) - target)^2, targets already in [0, 1]
  softmax_nll    SoftmaxLoss: cross-entropy of the classifier over (u, v, |u - v|) (its logits come from the model)
  mnrl           MultipleNegativesRankingLoss: each anchor against every positive (and hard negative) of the batch,
                 scaled cosine similarities in one softmax; `symmetric` adds the positives ranking the anchors
                 (MultipleNegativesSymmetricRankingLoss: the two directions' log-normalisers averaged)
  triplet        TripletLoss: relu(|a - p| - |a - n| + margin), euclidean distances

Inside `jax.jit` on a mesh the embeddings are one global array sharded over the batch, so the [B, (K-1)B]
similarity matrix of `mnrl` spans every device's rows: in-batch negatives come from the whole global batch (XLA
gathers the documents). With gradient accumulation they come from the micro-batch, as in sentence-transformers'
non-cached loss.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jbert.model.pooling import normalize


def cosine(u: jax.Array, v: jax.Array) -> jax.Array:
  """Row-wise cosine similarity [..., D] x [..., D] -> [...]."""
  return jnp.sum(normalize(u) * normalize(v), -1)


def cosine_mse(embeddings: jax.Array, targets: jax.Array) -> jax.Array:
  """Σ_rows (cos(u, v) - target)^2; embeddings [B, 2, D], targets [B] in [0, 1]."""
  error = cosine(embeddings[:, 0], embeddings[:, 1]) - targets.astype(jnp.float32)  # [B]
  return jnp.sum(error * error)


def mnrl(embeddings: jax.Array, *, scale: float = 20.0, symmetric: bool = False) -> tuple[jax.Array, jax.Array]:
  """(Σ_rows loss, Σ_rows [the anchor's best-scored document is its positive]) of (anchor, positive[, negatives])
  rows [B, K, D]."""
  b, k, d = embeddings.shape
  anchors = normalize(embeddings[:, 0])  # [B, D]
  # The positives first, then each negative column: sentence-transformers' torch.cat(docs) order.
  docs = normalize(jnp.swapaxes(embeddings[:, 1:], 0, 1).reshape((k - 1) * b, d))  # [(K-1)*B, D]
  scores = scale * jnp.einsum("bd,nd->bn", anchors, docs)  # [B, (K-1)*B]
  positive = jnp.diagonal(scores[:, :b])  # [B]
  log_z = jax.nn.logsumexp(scores, axis=-1)  # [B]
  if symmetric:  # each positive against every anchor: [B (positives), B (anchors)]
    log_z = (log_z + jax.nn.logsumexp(scores[:, :b].T, axis=-1)) / 2
  correct = (jnp.argmax(scores, -1) == jnp.arange(b)).astype(jnp.float32)
  return jnp.sum(log_z - positive), jnp.sum(correct)


def triplet(embeddings: jax.Array, *, margin: float = 5.0) -> tuple[jax.Array, jax.Array]:
  """(Σ_rows relu(|a - p| - |a - n| + margin), Σ_rows [|a - p| < |a - n|]) of (anchor, positive, negative) rows
  [B, 3, D]."""
  a, p, n = embeddings[:, 0], embeddings[:, 1], embeddings[:, 2]
  d_pos, d_neg = euclidean(a, p), euclidean(a, n)  # [B]
  return jnp.sum(jax.nn.relu(d_pos - d_neg + margin)), jnp.sum((d_pos < d_neg).astype(jnp.float32))


def euclidean(u: jax.Array, v: jax.Array) -> jax.Array:
  """Row-wise |u - v|; a zero distance gets gradient 0 rather than sqrt's NaN."""
  squared = jnp.sum(jnp.square(u - v), -1)
  safe = jnp.where(squared > 0, squared, 1.0)
  return jnp.where(squared > 0, jnp.sqrt(safe), 0.0)
