"""The tokenizer interface every kind implements (WordPiece, SentencePiece, byte-level BPE, XLM-R's), and the
input layout.

Every tokenizer exposes the five roles of BERT's special tokens by id (pad, unk, cls, sep, mask), so data
pipelines and heads never care which kind of vocabulary they run on. `encode` places them as the family does:
`[CLS] A [SEP]` / `[CLS] A [SEP] B [SEP]` with token types 0 and 1 (BERT), or `<s> A </s></s> B </s>` with one
token type (RoBERTa, XLM-R): `pair_separator_ids` and `second_type_id` say which.
"""
import abc
import os
from collections.abc import Sequence

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def truncate_pair(ids_a: list[int], ids_b: list[int] | None, max_tokens: int):
  """Truncates longest-first to `max_tokens` in total, as BERT's `_truncate_seq_pair`.

  One token at a time comes off the end of the longer sequence; on a tie it comes off `ids_b`. This is also
  transformers' Python `truncation="longest_first"`; its Rust tokenizers instead leave the odd token of an odd
  budget to `ids_b`.

  Returns:
    The (possibly shortened) copies `(ids_a, ids_b)`; `ids_b` stays None when it was None.
  """
  if ids_b is None:
    return ids_a[:max_tokens], None
  len_a, len_b = len(ids_a), len(ids_b)
  excess = len_a + len_b - max_tokens
  if excess > 0:
    # Closed form of the one-at-a-time loop: first level the longer one down to the shorter, then alternate
    # (b first on each tie).
    cut_a = min(excess, max(len_a - len_b, 0))
    cut_b = min(excess - cut_a, max(len_b - len_a, 0))
    rest = excess - cut_a - cut_b
    cut_b += (rest + 1) // 2
    cut_a += rest // 2
    len_a, len_b = len_a - cut_a, len_b - cut_b
  return ids_a[:len_a], ids_b[:len_b]


class Tokenizer(abc.ABC):
  """A vocabulary with BERT's special tokens and fast id paths.

  Attributes:
    pad_id, unk_id, cls_id, sep_id, mask_id: ids of `[PAD] [UNK] [CLS] [SEP] [MASK]`.
    continuation_mask: bool [V], True where a piece continues a word (WordPiece `##x`, SentencePiece pieces
      without a leading `▁`); whole-word masking groups a word start with the continuations after it.
    special_mask: bool [V], True at the five special tokens.
  """

  pad_id: int
  unk_id: int
  cls_id: int
  sep_id: int
  mask_id: int
  continuation_mask: np.ndarray
  special_mask: np.ndarray
  do_lower_case: bool
  # The largest input the tokenizer's model takes (tokenizer_config.json's model_max_length), None where unstated.
  model_max_length: int | None = None
  # The token type of a pair's second segment: 1 for BERT, 0 for the families with one token type.
  second_type_id: int = 1
  # Whether a special token written in the text (a literal "[MASK]", "<mask>") reads as that token: WordPiece's and
  # the pipelines' added tokens do; jbert's SentencePiece control symbols never come out of text.
  parses_special_tokens: bool = True

  @property
  def mask_token(self) -> str:
    """The mask token's text: `[MASK]` (BERT), `<mask>` (RoBERTa, XLM-R)."""
    return self.convert_ids_to_tokens([self.mask_id])[0]

  @property
  def pair_separator_ids(self) -> tuple[int, ...]:
    """The tokens between a pair's two segments: `[SEP]` for BERT, `</s></s>` for RoBERTa and XLM-R."""
    return (self.sep_id,)

  def num_special_tokens(self, pair: bool) -> int:
    """Special tokens `build_inputs` adds to one text (False) or a pair (True)."""
    return 2 + len(self.pair_separator_ids) if pair else 2

  def truncate(self, ids_a: list[int], ids_b: list[int] | None, max_tokens: int):
    """Longest-first truncation to `max_tokens`, as the family's reference tokenizer cuts: BERT's
    `_truncate_seq_pair` here (`truncate_pair`)."""
    return truncate_pair(ids_a, ids_b, max_tokens)

  def batch_word_ids(self, words: Sequence[str]) -> list[list[int]]:
    """Ids of each word of a pre-split text (NER's word lists), each as it reads inside running text: as
    transformers' `is_split_into_words=True` tokenizes them. Kinds that tokenize a word alone the same way
    inherit `batch_ids`."""
    return self.batch_ids(words)

  @property
  @abc.abstractmethod
  def vocab_size(self) -> int:
    """Number of ids, i.e. V."""

  @abc.abstractmethod
  def tokenize(self, text: str) -> list[str]:
    """Pieces of `text`, without special tokens added."""

  @abc.abstractmethod
  def ids(self, text: str) -> list[int]:
    """Ids of `text`, without special tokens added."""

  @abc.abstractmethod
  def batch_ids(self, texts: Sequence[str]) -> list[list[int]]:
    """`ids` of many texts at once, in native code."""

  @abc.abstractmethod
  def ids_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Ids and `(start, end)` character offsets into the original `text` of each piece."""

  @abc.abstractmethod
  def convert_tokens_to_ids(self, tokens: Sequence[str]) -> list[int]:
    """Ids of pieces; a piece outside the vocabulary maps to `unk_id`."""

  @abc.abstractmethod
  def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
    """Pieces of ids."""

  @abc.abstractmethod
  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    """Text of ids, with word pieces joined back into words."""

  @abc.abstractmethod
  def save(self, out_dir: str | os.PathLike) -> list[str]:
    """Writes the files `load_tokenizer(out_dir)` reads back into the same tokenizer; returns their paths."""

  def check_unique(self) -> None:
    """Raises a ValueError naming the pieces the vocabulary repeats; a model format that cannot repeat one has
    nothing to check."""

  @property
  def special_ids(self) -> tuple[int, int, int, int, int]:
    return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

  def encode(self, text: str, text_pair: str | None = None, max_length: int | None = None,
             pad_to_max_length: bool = False) -> dict[str, list[int]]:
    """BERT inputs for one text or a pair; see `build_inputs`.

    An empty `text_pair` means no pair, as in BERT's `run_classifier.py` and transformers.
    """
    ids_b = self.ids(text_pair) if text_pair else None
    return self.build_inputs(self.ids(text), ids_b, max_length, pad_to_max_length)

  def build_inputs(self, ids_a: list[int], ids_b: list[int] | None = None, max_length: int | None = None,
                   pad_to_max_length: bool = False) -> dict[str, list[int]]:
    """`[CLS] A [SEP]` or `[CLS] A [SEP] B [SEP]` with token types 0 for A's part and 1 for B's (RoBERTa's
    families: `<s> A </s></s> B </s>`, all type 0).

    Args:
      ids_a: ids of the first segment, without special tokens.
      ids_b: ids of the optional second segment.
      max_length: total length limit including special tokens; segments are truncated longest-first.
      pad_to_max_length: pad with `pad_id` (attention_mask 0, token type 0) up to `max_length`.

    Returns:
      dict of `input_ids`, `token_type_ids`, `attention_mask`, each a list of ints.
    """
    num_special = self.num_special_tokens(ids_b is not None)
    if max_length is not None:
      if max_length < num_special:
        kind = "one text" if ids_b is None else "a pair"
        raise ValueError(f"max_length={max_length} leaves no room for the {num_special} special tokens of "
                         f"{kind}; pass max_length >= {num_special}.")
      ids_a, ids_b = self.truncate(ids_a, ids_b, max_length - num_special)
    elif pad_to_max_length:
      raise ValueError("pad_to_max_length=True needs max_length; pass max_length=N.")
    if ids_b is None:
      input_ids = [self.cls_id, *ids_a, self.sep_id]
      token_type_ids = [0] * len(input_ids)
    else:
      first = [self.cls_id, *ids_a, *self.pair_separator_ids]
      input_ids = [*first, *ids_b, self.sep_id]
      token_type_ids = [0] * len(first) + [self.second_type_id] * (len(ids_b) + 1)
    attention_mask = [1] * len(input_ids)
    if pad_to_max_length:
      pad = max_length - len(input_ids)
      input_ids += [self.pad_id] * pad
      token_type_ids += [0] * pad
      attention_mask += [0] * pad
    return dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask)
