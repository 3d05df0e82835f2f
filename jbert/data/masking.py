"""Dynamic masked-LM targets for a batch of sequences, vectorised over rows with numpy.

As BERT's `create_masked_lm_predictions`, but over non-special tokens only: `k = min(max_predictions,
max(1, round(n * masked_lm_prob)))` of a row's `n` candidates are selected (whole words when asked: a piece
and the `##` continuations after it, greedily in random word order, skipping a word that would overflow `k`);
of those, `mask_token_prob` become [MASK], `random_token_prob` a random non-special token, the rest stay.
Positions come out sorted and padded with 0 (weight 0) to `max_predictions`.
"""
import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Masker:
  """Masking settings and the vocabulary facts it needs.

  Attributes:
    special_mask: bool [V], tokens never selected ([CLS], [SEP], [PAD], ...).
    continuation_mask: bool [V] for whole-word masking (pieces that continue a word), else None.
    mask_id: id of [MASK].
    max_predictions: masked positions per row, and the padded width of the outputs.
    masked_lm_prob, mask_token_prob, random_token_prob: see `jbert.data.config`.
  """
  special_mask: np.ndarray
  continuation_mask: np.ndarray | None
  mask_id: int
  max_predictions: int
  masked_lm_prob: float = 0.15
  mask_token_prob: float = 0.8
  random_token_prob: float = 0.1

  def __post_init__(self):
    for name in ("masked_lm_prob", "mask_token_prob", "random_token_prob"):
      if not 0.0 <= getattr(self, name) <= 1.0:
        raise ValueError(f"{name}={getattr(self, name)} must lie in [0, 1].")
    if self.mask_token_prob + self.random_token_prob > 1.0:
      total = self.mask_token_prob + self.random_token_prob
      raise ValueError(f"mask_token_prob + random_token_prob = {total} exceeds 1; they are shares of the "
                       "selected tokens (BERT: 0.8 and 0.1).")
    if self.max_predictions < 1:
      raise ValueError(f"max_predictions_per_seq={self.max_predictions} must be >= 1.")
    if self.special_mask.all():
      raise ValueError("Every token of the vocabulary is special; nothing could be masked or drawn.")
    object.__setattr__(self, "_random_ids", np.flatnonzero(~self.special_mask).astype(np.int32))

  def _select_words(self, input_ids: np.ndarray, candidates: np.ndarray, k: np.ndarray,
                    rng: np.random.Generator) -> np.ndarray:
    """bool [B, T]: whole words, taken in random order while they fit in each row's `k`."""
    b, t = input_ids.shape
    continues = self.continuation_mask[input_ids] & candidates
    continues[:, 1:] &= candidates[:, :-1]  # A piece after a special token starts a word.
    starts = candidates & ~continues
    word = np.cumsum(starts, axis=1) - 1                                          # [B, T] word index in row
    sizes = np.zeros((b, t), np.int64)
    rows = np.broadcast_to(np.arange(b)[:, None], (b, t))
    np.add.at(sizes, (rows[candidates], word[candidates]), 1)                     # [B, W=T] pieces per word
    order = np.argsort(np.where(sizes > 0, rng.random((b, t)), 2.0), axis=1)      # [B, W] random word order
    ordered_sizes = np.take_along_axis(sizes, order, axis=1)
    room, chosen = k.astype(np.int64), np.zeros((b, t), bool)
    for j in range(int((sizes > 0).sum(axis=1).max(initial=0))):
      take = (ordered_sizes[:, j] > 0) & (ordered_sizes[:, j] <= room)
      chosen[np.arange(b), order[:, j]] = take
      room -= np.where(take, ordered_sizes[:, j], 0)
    return candidates & np.take_along_axis(chosen, np.maximum(word, 0), axis=1)

  def __call__(self, input_ids: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Masks a copy of `input_ids` [B, T].

    Returns:
      input_ids [B, T] with replacements, and [B, P] int32 `masked_lm_positions`, `masked_lm_ids` (the
      original tokens) and `masked_lm_weights` (1 at real predictions, 0 at padding).
    """
    b, t = input_ids.shape
    p = self.max_predictions
    candidates = ~self.special_mask[input_ids]                                    # [B, T]
    k = np.minimum(p, np.maximum(1, np.round(candidates.sum(axis=1) * self.masked_lm_prob))).astype(np.int64)
    k = np.minimum(k, candidates.sum(axis=1))                                     # rows without candidates
    if self.continuation_mask is not None:
      selected = self._select_words(input_ids, candidates, k, rng)
    else:
      ranks = np.argsort(np.argsort(np.where(candidates, rng.random((b, t)), 2.0), axis=1), axis=1)
      selected = ranks < k[:, None]                                               # k random candidates
    # Selected positions first (in order), then padding; `count` <= p by construction.
    positions = np.argsort(~selected, axis=1, kind="stable")[:, :p].astype(np.int32)  # [B, P]
    weights = np.arange(p) < selected.sum(axis=1, keepdims=True)                  # [B, P]
    positions = np.where(weights, positions, 0)
    original = np.take_along_axis(input_ids, positions, axis=1)
    u = rng.random((b, p))
    replacement = np.where(u < self.mask_token_prob, self.mask_id,
                           self._random_ids[rng.integers(len(self._random_ids), size=(b, p))])
    replace = weights & (u < self.mask_token_prob + self.random_token_prob)
    masked = input_ids.copy()
    rows = np.broadcast_to(np.arange(b)[:, None], (b, p))
    masked[rows[replace], positions[replace]] = replacement[replace]
    return dict(input_ids=masked, masked_lm_positions=positions,
                masked_lm_ids=np.where(weights, original, 0).astype(np.int32),
                masked_lm_weights=weights.astype(np.int32))
