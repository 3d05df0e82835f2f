"""Pretraining instances from tokenised documents, as google-research/bert `create_pretraining_data.py`.

`document_instances` follows `create_instances_from_document` step for step: a target length of
`max_seq_length - 3` (with probability `short_seq_prob` a random one in [2, max]), chunks of whole sentences,
segment A a random-length prefix of the chunk, and segment B either the real continuation or (half the time,
always for a one-sentence chunk) a random stretch of another document, the unused sentences then being put
back. `truncate_seq_pair` cuts the longer segment one token at a time from a random end; here the cut counts
come in closed form (longest first, ties off B) with the front share drawn binomially, the same distribution.

Differences, all deliberate: a document is paired with random documents of its own group (a random sample of
the corpus, see loader.py) instead of the whole corpus; instances are redrawn every epoch (the original's
`dupe_factor` copies become epochs).

MLM-only training (`nsp=False`) takes RoBERTa's FULL-SENTENCES instead (`full_sentences`): whole sentences packed
in order up to the sequence length, across document boundaries with an extra [SEP] between documents, so no
sequence is short for want of text (RoBERTa, section 4.2: better than DOC-SENTENCES at the same batch size).
"""
from collections.abc import Sequence

import numpy as np

from jbert.tokenizer import truncate_pair

Document = Sequence[Sequence[int]]  # sentences, each a sequence of token ids


def _cut_random_ends(tokens: list[int], cut: int, rng: np.random.Generator) -> list[int]:
  """`tokens` less `cut` tokens, each taken from the front or the back with equal chance."""
  if cut <= 0:
    return tokens
  front = int(rng.binomial(cut, 0.5))
  return tokens[front:len(tokens) - (cut - front)]


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int,
                      rng: np.random.Generator) -> tuple[list[int], list[int]]:
  """BERT's `truncate_seq_pair`: longest first, ties off B, each token from a random end."""
  kept_a, kept_b = truncate_pair(tokens_a, tokens_b, max_num_tokens)
  return (_cut_random_ends(tokens_a, len(tokens_a) - len(kept_a), rng),
          _cut_random_ends(tokens_b, len(tokens_b) - len(kept_b), rng))


def _target_length(max_num_tokens: int, short_seq_prob: float, rng: np.random.Generator) -> int:
  if rng.random() < short_seq_prob:
    return int(rng.integers(2, max_num_tokens + 1))
  return max_num_tokens


def document_instances(documents: Sequence[Document], index: int, max_seq_length: int, short_seq_prob: float,
                       rng: np.random.Generator) -> list[tuple[list[int], list[int], int]]:
  """NSP instances of `documents[index]` as `(tokens_a, tokens_b, is_random_next)`.

  Args:
    documents: the group; documents and their sentences must be non-empty.
    index: the document to cut into instances; the others supply random next segments.
    max_seq_length: sequence length with [CLS] and [SEP]s.
    short_seq_prob: chance of a shorter target length for this document.
    rng: this document's generator.
  """
  document = documents[index]
  max_num_tokens = max_seq_length - 3
  target_seq_length = _target_length(max_num_tokens, short_seq_prob, rng)

  instances = []
  current_chunk, current_length, i = [], 0, 0
  while i < len(document):
    current_chunk.append(document[i])
    current_length += len(document[i])
    if i == len(document) - 1 or current_length >= target_seq_length:
      a_end = int(rng.integers(1, len(current_chunk))) if len(current_chunk) >= 2 else 1
      tokens_a = [t for sentence in current_chunk[:a_end] for t in sentence]
      tokens_b = []
      is_random_next = len(current_chunk) == 1 or rng.random() < 0.5
      if is_random_next:
        target_b_length = target_seq_length - len(tokens_a)
        # As the original: ten tries at another document, then whatever came up (a one-document group).
        for _ in range(10):
          random_index = int(rng.integers(len(documents)))
          if random_index != index:
            break
        random_document = documents[random_index]
        for sentence in random_document[int(rng.integers(len(random_document))):]:
          tokens_b.extend(sentence)
          if len(tokens_b) >= target_b_length:
            break
        i -= len(current_chunk) - a_end  # The unused sentences are not wasted.
      else:
        tokens_b = [t for sentence in current_chunk[a_end:] for t in sentence]
      tokens_a, tokens_b = truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
      instances.append((tokens_a, tokens_b, int(is_random_next)))
      current_chunk, current_length = [], 0
    i += 1
  return instances


def full_sentences(documents: Sequence[Document], max_seq_length: int, short_seq_prob: float, sep_id: int,
                   rng: np.random.Generator) -> list[tuple[list[int], list[int], int]]:
  """RoBERTa's FULL-SENTENCES over `documents` in their order, as `(tokens, [], 0)`: whole sentences added to a
  sequence while they fit in `max_seq_length - 2` tokens ([CLS] and the final [SEP] aside), an extra [SEP]
  between the last sentence of a document and the first of the next; a sentence that does not fit starts the
  next sequence, and one longer than a whole sequence is cut at random ends. With `short_seq_prob`, a
  sequence's target length is drawn from [2, max] as BERT's are (RoBERTa's recipe sets it to 0)."""
  max_num_tokens = max_seq_length - 2
  found, current = [], []
  target = _target_length(max_num_tokens, short_seq_prob, rng)
  for document in documents:
    for position, sentence in enumerate(document):
      joint = [sep_id] if position == 0 and current else []
      if current and len(current) + len(joint) + len(sentence) > target:
        found.append((current, [], 0))
        current, joint = [], []
        target = _target_length(max_num_tokens, short_seq_prob, rng)
      current = current + joint + list(sentence)
      if len(current) >= target:
        found.append((_cut_random_ends(current, len(current) - target, rng), [], 0))
        current = []
        target = _target_length(max_num_tokens, short_seq_prob, rng)
  if current:
    found.append((current, [], 0))
  return found


def pack(instances: Sequence[tuple[list[int], list[int], int]], max_seq_length: int, cls_id: int, sep_id: int,
         pad_id: int) -> dict[str, np.ndarray]:
  """`[CLS] A [SEP] B [SEP]` (or `[CLS] A [SEP]` when B is empty), padded: int32 arrays `[n, T]` and `[n]`."""
  n = len(instances)
  input_ids = np.full((n, max_seq_length), pad_id, np.int32)
  token_type_ids = np.zeros((n, max_seq_length), np.int32)
  lengths = np.empty(n, np.int64)
  for row, (tokens_a, tokens_b, _) in enumerate(instances):
    ids = [cls_id, *tokens_a, sep_id, *tokens_b, sep_id] if tokens_b else [cls_id, *tokens_a, sep_id]
    input_ids[row, :len(ids)] = ids
    token_type_ids[row, len(tokens_a) + 2:len(ids)] = 1
    lengths[row] = len(ids)
  attention_mask = (np.arange(max_seq_length) < lengths[:, None]).astype(np.int32)
  labels = np.array([label for _, _, label in instances], np.int32).reshape(n)
  return dict(input_ids=input_ids, token_type_ids=token_type_ids, attention_mask=attention_mask,
              next_sentence_labels=labels)
