"""What every tokenizer read through HF `tokenizers` shares: encoding without special tokens (jbert places them
itself, per family) and the lookups between pieces and ids.

A subclass sets `_tok` (the `tokenizers.Tokenizer`), `_pieces` (id -> piece) and `_vocab` (piece -> id).
"""
from __future__ import annotations

from collections.abc import Sequence

import tokenizers

from jbert.tokenizer import base


class TokenizersBacked(base.Tokenizer):
  """A `base.Tokenizer` over a `tokenizers.Tokenizer`."""

  _tok: tokenizers.Tokenizer
  _pieces: list[str]
  _vocab: dict[str, int]

  @property
  def vocab_size(self) -> int:
    return len(self._pieces)

  @property
  def backend(self) -> tokenizers.Tokenizer:
    """The underlying `tokenizers.Tokenizer` (jbert places the special tokens; it never adds them)."""
    return self._tok

  def tokenize(self, text: str) -> list[str]:
    return self._tok.encode(text, add_special_tokens=False).tokens

  def ids(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def batch_ids(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

  def ids_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    encoding = self._tok.encode(text, add_special_tokens=False)
    return encoding.ids, encoding.offsets

  def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
    vocab, unk = self._vocab, self.unk_id
    return [vocab.get(t, unk) for t in tokens]

  def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
    pieces = self._pieces
    return [pieces[i] for i in ids]
