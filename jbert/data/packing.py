"""Padding-free pretraining rows: masked instances laid end to end in rows of `max_seq_length` tokens.

A document group's instances are masked one by one, exactly as unpacked (`jbert.data.masking`), and only then
packed, so a packed stream holds the same sequences with the same masks as the unpacked stream of the same seed,
grouped differently. Best-fit decreasing, per group: instances longest first (ties in the group's shuffled
order) each go to the open row whose free tokens fit it most tightly (the oldest such row), else to a new row;
a row also holds at most `max_sequences` sequences and `max_predictions` masked positions, so nothing is ever
cut or dropped. The rows are then shuffled (seeded by the group), so long and short instances mix across
batches as before. Everything is a function of the group's instances and seed: the same seed gives the same rows.

A packed row carries, besides `input_ids, token_type_ids, attention_mask` [T] (token types per sequence, 0 for
A, 1 for B): `segment_ids` [T] (1..k its sequences, 0 padding), `position_ids` [T] (restarting at each sequence),
`masked_lm_positions, masked_lm_ids, masked_lm_weights` [P] (positions in the row, sequence after sequence),
and per slot [S]: `cls_positions` (each sequence's [CLS]), `next_sentence_labels` and `sequence_weights` (1 for
a sequence, 0 for an empty slot). With `jbert.model`'s segments the model computes on each sequence exactly what
it does on the sequence alone (`docs/ARCHITECTURE.md`, "Packed rows").

The batch stays `batch_size` rows of `max_seq_length` tokens. BERT's recipe (batch, learning rate, steps) was set
for rows that are nearly full, as a packed row is: the tokens per step stay what the recipe meant, and a corpus of
short documents puts more, rather than emptier, sequences in each step.
"""
from __future__ import annotations

import dataclasses

import numpy as np

# The arrays of a packed batch, and the per-slot ones among them.
SLOT_KEYS = ("cls_positions", "next_sentence_labels", "sequence_weights")
PACKED_KEYS = ("input_ids", "token_type_ids", "attention_mask", "segment_ids", "position_ids",
               "masked_lm_positions", "masked_lm_ids", "masked_lm_weights", *SLOT_KEYS)


@dataclasses.dataclass(frozen=True)
class Layout:
  """The sizes of a packed row beyond its tokens.

  Attributes:
    max_sequences: S, the slots of a row (`data.max_sequences_per_row`).
    max_predictions: the masked positions of a row: `max_predictions_per_seq`, as unpacked, so the MLM head
      costs what it did. A full row's rate needs no more: each sequence rounds its own share (at most half a
      position up) but brings 2-3 specials that are never masked (BERT: 0.3-0.45 positions fewer); measured,
      packed rows of 128 tokens hold at most 19 at 15%. The packer counts predictions too: a row that would need
      more is closed, so no prediction is ever dropped.
  """
  max_sequences: int
  max_predictions: int

  @classmethod
  def of(cls, max_predictions_per_seq: int, max_sequences: int) -> "Layout":
    return cls(int(max_sequences), int(max_predictions_per_seq))

  @classmethod
  def from_config(cls, data_cfg) -> "Layout | None":
    """The layout `data_cfg` trains with, or None when `data.packing` is off."""
    if not data_cfg.get("packing", False):
      return None
    return cls.of(data_cfg.max_predictions_per_seq, data_cfg.max_sequences_per_row)


def shortest_sequence(data_cfg) -> int:
  """The fewest tokens a sequence of this data can have: pretraining's [CLS] A [SEP] B [SEP] with NSP, [CLS] a
  token [SEP] without; a fine-tuning example of an empty text, [CLS] [SEP]."""
  if "nsp" not in data_cfg:
    return 2
  return 5 if data_cfg.nsp else 3  # None: phase 2's, taken from init_from later; bounded as without NSP until then


def check(data_cfg) -> None:
  """Raises ValueError with the fix if the packing settings cannot work, or ask for slots no row can fill (each
  slot costs every batch its [CLS] gather and NSP or label logits, whether a sequence fills it or not)."""
  if not data_cfg.get("packing", False):
    return
  slots, length = data_cfg.max_sequences_per_row, data_cfg.max_seq_length
  if slots < 1:
    raise ValueError(f"data.max_sequences_per_row={slots} must be >= 1 with data.packing "
                     "(the default follows max_seq_length: one slot per 8 tokens).")
  most = length // shortest_sequence(data_cfg)
  if slots > most:
    raise ValueError(f"--config.data.max_sequences_per_row={slots} exceeds what a row of {length} tokens can hold: "
                     f"{most} sequences of the shortest, {shortest_sequence(data_cfg)} tokens; set it to at most "
                     f"{most} (unset, it is one per 8 tokens: {-(-length // 8)}).")


def assign(lengths: np.ndarray, predictions: np.ndarray, *, max_tokens: int, layout: Layout
           ) -> tuple[np.ndarray, np.ndarray, int]:
  """Best-fit decreasing: (row [n], slot [n], rows) for instances of `lengths` tokens and `predictions` masked
  positions. Slots number a row's sequences in the order they joined it."""
  n = len(lengths)
  row, slot = np.zeros(n, np.int64), np.zeros(n, np.int64)
  free, room, used = [], [], []  # per row: free tokens, free predictions, slots taken
  by_free = [[] for _ in range(max_tokens + 1)]  # open rows (a free slot) by their free tokens, oldest first
  for i in np.argsort(-np.asarray(lengths), kind="stable"):
    length, wanted = int(lengths[i]), int(predictions[i])
    chosen = -1
    for space in range(length, max_tokens + 1):
      for r in by_free[space]:
        if room[r] >= wanted:
          chosen = r
          break
      if chosen >= 0:
        by_free[space].remove(chosen)
        break
    if chosen < 0:
      chosen = len(free)
      free.append(max_tokens)
      room.append(layout.max_predictions)
      used.append(0)
    row[i], slot[i] = chosen, used[chosen]
    free[chosen] -= length
    room[chosen] -= wanted
    used[chosen] += 1
    if used[chosen] < layout.max_sequences and free[chosen] > 0:
      by_free[free[chosen]].append(chosen)
  return row, slot, len(free)


def starts(sizes: np.ndarray, row: np.ndarray, slot: np.ndarray, rows: int) -> np.ndarray:
  """[n] where each item of `sizes` starts within its row: the sum of the sizes of the row's earlier slots."""
  order = np.lexsort((slot, row))
  out = np.zeros(len(sizes), np.int64)
  first = np.searchsorted(row[order], np.arange(rows))                            # each row's first slot
  before = np.cumsum(sizes[order]) - sizes[order]                                 # exclusive running sum
  out[order] = before - before[first][row[order]]
  return out


def pack(instances: dict[str, np.ndarray], *, layout: Layout, pad_id: int, rng: np.random.Generator
         ) -> dict[str, np.ndarray]:
  """Masked unpacked instances (`instances.pack` + `masking.Masker`: [n, T] and [n, P] arrays, labels [n]) as
  shuffled packed rows (module docstring): int32 [R, T], [R, layout.max_predictions] and [R, S] arrays."""
  ids = instances["input_ids"]
  t = ids.shape[1]
  real = instances["attention_mask"].astype(bool)                                 # [n, T], a prefix of each row
  picked = instances["masked_lm_weights"].astype(bool)                            # [n, P], a prefix of each row
  lengths, predictions = real.sum(1), picked.sum(1)
  row, slot, rows = assign(lengths, predictions, max_tokens=t, layout=layout)
  # Each instance's first token and first prediction within its row.
  offset, first_prediction = (starts(sizes, row, slot, rows) for sizes in (lengths, predictions))
  s, p = layout.max_sequences, layout.max_predictions
  packed = {k: np.zeros((rows, t), np.int32) for k in PACKED_KEYS[:5]}
  packed.update({k: np.zeros((rows, p), np.int32) for k in PACKED_KEYS[5:8]})
  packed.update({k: np.zeros((rows, s), np.int32) for k in SLOT_KEYS})
  packed["input_ids"][:] = pad_id
  inst, pos = np.nonzero(real)
  dst = (row[inst], offset[inst] + pos)
  packed["input_ids"][dst] = ids[inst, pos]
  packed["token_type_ids"][dst] = instances["token_type_ids"][inst, pos]
  packed["attention_mask"][dst] = 1
  packed["segment_ids"][dst] = slot[inst] + 1
  packed["position_ids"][dst] = pos
  inst, j = np.nonzero(picked)
  dst = (row[inst], first_prediction[inst] + j)
  packed["masked_lm_positions"][dst] = instances["masked_lm_positions"][inst, j] + offset[inst]
  packed["masked_lm_ids"][dst] = instances["masked_lm_ids"][inst, j]
  packed["masked_lm_weights"][dst] = 1
  packed["cls_positions"][row, slot] = offset
  packed["next_sentence_labels"][row, slot] = instances["next_sentence_labels"]
  packed["sequence_weights"][row, slot] = 1
  shuffled = rng.permutation(rows)
  return {k: v[shuffled] for k, v in packed.items()}


def is_packed(batch: dict[str, np.ndarray]) -> bool:
  return "sequence_weights" in batch


def sequences_in(batch: dict[str, np.ndarray]) -> int:
  """The sequences of a batch, packed or not."""
  return int(batch["sequence_weights"].sum()) if is_packed(batch) else len(batch["input_ids"])


def unpack(batch: dict[str, np.ndarray], pad_id: int = 0) -> dict[str, np.ndarray]:
  """The sequences of packed rows as unpacked instances ([n, T], [n, P] and [n] arrays, P the row's prediction
  width), row by row and slot by slot: what `--show`/`--stats` read and tests compare. An unpacked batch is
  returned as it is."""
  if not is_packed(batch):
    return batch
  t, p = batch["input_ids"].shape[1], batch["masked_lm_positions"].shape[1]
  rows, slots = np.nonzero(batch["sequence_weights"])
  n = len(rows)
  out = {k: np.zeros((n, t), np.int32) for k in ("input_ids", "token_type_ids", "attention_mask")}
  out["input_ids"][:] = pad_id
  out.update({k: np.zeros((n, p), np.int32) for k in ("masked_lm_positions", "masked_lm_ids",
                                                      "masked_lm_weights")})
  out["next_sentence_labels"] = batch["next_sentence_labels"][rows, slots].astype(np.int32)
  for i, (r, s) in enumerate(zip(rows, slots)):
    here = batch["segment_ids"][r] == s + 1
    start, length = int(batch["cls_positions"][r, s]), int(here.sum())
    for key in ("input_ids", "token_type_ids"):
      out[key][i, :length] = batch[key][r, start:start + length]
    out["attention_mask"][i, :length] = 1
    positions = batch["masked_lm_positions"][r]
    mine = (batch["masked_lm_weights"][r] > 0) & here[positions]
    k = int(mine.sum())
    out["masked_lm_positions"][i, :k] = positions[mine] - start
    out["masked_lm_ids"][i, :k] = batch["masked_lm_ids"][r][mine]
    out["masked_lm_weights"][i, :k] = 1
  return out


# -- fine-tuning: whole examples laid end to end --------------------------------------------------------------------

# Per-slot arrays of a packed fine-tuning row [S]: each sequence's [CLS] position and weight (0: an empty slot).
EXAMPLE_SLOT_KEYS = ("cls_positions", "sequence_weights")


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where each of n examples went: `row`, `slot`, `offset` (its first token in the row), `length` ([n] each) in
  `rows` rows."""
  row: np.ndarray
  slot: np.ndarray
  offset: np.ndarray
  length: np.ndarray
  rows: int

  @property
  def slots(self) -> int:
    """The most sequences a row holds."""
    return int(self.slot.max()) + 1 if len(self.slot) else 1


def example_lengths(attention_mask: np.ndarray) -> np.ndarray:
  """[n] tokens of each featurised example (its attention mask is a prefix of the row)."""
  return np.asarray(attention_mask).astype(bool).sum(-1).astype(np.int64)


def place(lengths: np.ndarray, *, max_tokens: int, max_sequences: int) -> Placement:
  """Best-fit decreasing placement (`assign`) of examples of `lengths` tokens in rows of `max_tokens`."""
  lengths = np.asarray(lengths, np.int64)
  row, slot, rows = assign(lengths, np.zeros_like(lengths), max_tokens=max_tokens,
                           layout=Layout(max_sequences, 0))
  return Placement(row, slot, starts(lengths, row, slot, rows), lengths, rows)


def pack_examples(features: dict[str, np.ndarray], placement: Placement, *, rows: int, slots: int,
                  token_keys: dict[str, int], example_keys: tuple[str, ...] = (), pad_id: int = 0,
                  row_length: int | None = None) -> dict[str, np.ndarray]:
  """Featurised examples ([n, T] token arrays, [n] per-example ones) as `rows` packed rows of T tokens.

  Out: `input_ids, token_type_ids, attention_mask, segment_ids, position_ids` and each of `token_keys` [rows, T]
  (positions past the sequences hold `token_keys[key]`: NER's ignored label), `cls_positions, sequence_weights` and
  each of `example_keys` [rows, slots] (0 in an empty slot). `rows` and `slots` may exceed what `placement` uses
  (empty rows are padding; with segment ids, padding attends to padding only, so no softmax is empty).
  `row_length`: the rows' tokens, T by default (multiple choice: C·T, an example's endings in one row).
  """
  if rows < placement.rows or slots < placement.slots:
    raise ValueError(f"{placement.rows} rows of {placement.slots} slots do not fit in {rows} rows of {slots}.")
  ids = np.asarray(features["input_ids"])
  t = row_length or ids.shape[1]
  real = np.arange(ids.shape[1])[None, :] < placement.length[:, None]              # [n, T]
  inst, pos = np.nonzero(real)
  dst = (placement.row[inst], placement.offset[inst] + pos)
  out = {"input_ids": np.full((rows, t), pad_id, np.int32)}
  for key in ("token_type_ids", "attention_mask", "segment_ids", "position_ids"):
    out[key] = np.zeros((rows, t), np.int32)
  out["input_ids"][dst] = ids[inst, pos]
  out["token_type_ids"][dst] = np.asarray(features["token_type_ids"])[inst, pos]
  out["attention_mask"][dst] = 1
  out["segment_ids"][dst] = placement.slot[inst] + 1
  out["position_ids"][dst] = pos
  for key, fill in token_keys.items():
    value = np.asarray(features[key])
    out[key] = np.full((rows, t), fill, value.dtype)
    out[key][dst] = value[inst, pos]
  at = (placement.row, placement.slot)
  out["cls_positions"] = np.zeros((rows, slots), np.int32)
  out["cls_positions"][at] = placement.offset
  out["sequence_weights"] = np.zeros((rows, slots), np.int32)
  out["sequence_weights"][at] = 1
  for key in example_keys:
    value = np.asarray(features[key])
    out[key] = np.zeros((rows, slots, *value.shape[1:]), value.dtype)
    out[key][at] = value
  return out


def unpack_outputs(outputs: dict[str, np.ndarray], placement: Placement, *, token_outputs: tuple[str, ...] = (),
                   length: int) -> dict[str, np.ndarray]:
  """Per-row outputs of packed rows back to one row per example, in example order: per-slot outputs
  [rows, S, ...] -> [n, ...]; `token_outputs` [rows, T, ...] -> [n, length, ...], zeros past each example."""
  out = {}
  for name, value in outputs.items():
    value = np.asarray(value)
    if name not in token_outputs:
      out[name] = value[placement.row, placement.slot]
      continue
    n = len(placement.row)
    result = np.zeros((n, length, *value.shape[2:]), value.dtype)
    real = np.arange(length)[None, :] < placement.length[:, None]
    inst, pos = np.nonzero(real)
    result[inst, pos] = value[placement.row[inst], placement.offset[inst] + pos]
    out[name] = result
  return out


def row_counts(needed: np.ndarray, multiple: int = 1) -> tuple[int, int]:
  """(usual, most) rows per data shard for batches that need `needed` rows each, rounded up to `multiple`:
  `most` holds every batch, `usual` (<= most) minimises the rows of the whole run when the batches that need
  more than it take `most`; a run then meets at most two shapes."""
  needed = -(-np.asarray(needed, np.int64) // multiple) * multiple
  most = int(needed.max())
  candidates = np.unique(needed)
  cost = np.array([np.where(needed <= r, r, most).sum() for r in candidates])
  return int(candidates[len(cost) - 1 - int(np.argmin(cost[::-1]))]), most  # a tie: the larger, fewer shapes


def place_choices(lengths: np.ndarray, *, max_tokens: int, max_examples: int) -> tuple[Placement, Placement]:
  """Multiple choice (`lengths` [n, C]: `example_lengths` of [n, C, T] masks): (examples, endings). Each example's
  C endings stay together, laid end to end as consecutive segments of one row (best fit by their total length, at
  most `max_examples` examples a row); ending c of the example in slot e is sequence slot e·C + c of its row."""
  lengths = np.asarray(lengths)
  n, c = lengths.shape
  examples = place(lengths.sum(1), max_tokens=max_tokens, max_sequences=max_examples)
  before = np.cumsum(lengths, 1) - lengths                                       # each ending's start in its example
  endings = Placement(np.repeat(examples.row, c), (examples.slot[:, None] * c + np.arange(c)).reshape(n * c),
                      (examples.offset[:, None] + before).reshape(n * c), lengths.reshape(n * c), examples.rows)
  return examples, endings


def pack_choices(features: dict[str, np.ndarray], examples: Placement, endings: Placement, *, rows: int,
                 max_examples: int, example_keys: tuple[str, ...] = (), pad_id: int = 0) -> dict[str, np.ndarray]:
  """Multiple-choice examples ([n, C, T] inputs, [n] labels) as `rows` packed rows of C·T tokens: the endings'
  `pack_examples` arrays ([rows, C·T]; `cls_positions`, `sequence_weights` [rows, E·C], E = `max_examples`) and
  each of `example_keys` [rows, E]."""
  ids = np.asarray(features["input_ids"])
  n, c, t = ids.shape
  flat = {k: np.asarray(features[k]).reshape(n * c, t) for k in ("input_ids", "token_type_ids", "attention_mask")}
  out = pack_examples(flat, endings, rows=rows, slots=max_examples * c, token_keys={}, pad_id=pad_id,
                      row_length=c * t)
  for key in example_keys:
    value = np.asarray(features[key])
    out[key] = np.zeros((rows, max_examples, *value.shape[1:]), value.dtype)
    out[key][examples.row, examples.slot] = value
  return out


def pack_texts(features: dict[str, np.ndarray], placement: Placement, *, rows: int, slots: int,
               example_keys: tuple[str, ...] = (), pad_id: int = 0, first_slot: int = 0) -> dict[str, np.ndarray]:
  """Bi-encoder examples ([n, K, T] inputs: K texts each, `placement` of their n·K texts example by example) as
  `rows` packed rows of T tokens, every text a sequence of its own: `pack_examples`' arrays, each of
  `example_keys` per example [n, ...] as it is, and `text_slots` [n, K], each text's slot in the global batch's
  flattened [rows·slots] (`first_slot`: where this data shard's rows start)."""
  ids = np.asarray(features["input_ids"])
  n, k, t = ids.shape
  flat = {key: np.asarray(features[key]).reshape(n * k, t) for key in ("input_ids", "token_type_ids",
                                                                      "attention_mask")}
  out = pack_examples(flat, placement, rows=rows, slots=slots, token_keys={}, pad_id=pad_id)
  out.update({key: np.asarray(features[key]) for key in example_keys})
  out["text_slots"] = (first_slot + placement.row * slots + placement.slot).reshape(n, k).astype(np.int32)
  return out
