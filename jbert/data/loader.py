"""The pretraining input pipeline on grain: documents → groups → instances → dynamic masks → batches.

Each of `process_count` shards owns the documents `process_index::process_count` of the split. An epoch is a
seeded permutation of the shard's documents cut into groups of about `docs_per_group`; group `g` of epoch `e`
is element `e * groups_per_epoch + g` of an infinite `grain.MapDataset`, so any position is reachable without
replaying data. A group is read, tokenised in one `batch_ids` call, cut into instances (one generator per
document, seeded by (seed, epoch, document)), shuffled and masked (a generator seeded by (seed, epoch, shard,
group)); `RebatchIterDataset` then slices fixed-size batches across group boundaries. Every epoch redraws
instances, the random next segments and the masks. Groups whose documents all tokenise to nothing are skipped,
up to a bound past which the input is reported as holding no text (a file of NUL bytes would otherwise be read
forever).

`check_data` validates the settings and opens the sources (no tokenisation), for the trainer to call before it
loads or compiles a model.

Checkpointing: `make_pretrain_iterator` returns a `grain.DatasetIterator`; `get_state()` is a
JSON-serialisable dict (with or without worker processes) that `set_state` takes back in a NEW iterator built
with the same config, seed, shard and `worker_count`, continuing with the next batch. The trainer stores it as
JSON, one file per shard (`jbert/checkpoint/manager.py`); `grain.checkpoint.CheckpointSave` would do as well.
"""
import logging
import math
import time

import grain
import ml_collections
import numpy as np

from jbert import tokenizer as tokenizer_lib
from jbert.data import instances as instances_lib
from jbert.data import masking
from jbert.data import prepared
from jbert.data import sources
from jbert.data import synthetic

log = logging.getLogger(__name__)

SPLITS = ("train", "eval")
EVAL_SEED = 0  # Held-out batches are the same whatever the training seed, so runs compare.


def build_tokenizer(data_cfg: ml_collections.ConfigDict) -> tokenizer_lib.Tokenizer:
  """The tokenizer of `data.vocab`; without one, the prepared corpus's own (source=prepared) or the generated
  vocabulary (source=synthetic)."""
  if data_cfg.vocab:
    return tokenizer_lib.load_tokenizer(data_cfg.vocab)
  if data_cfg.source == "synthetic":
    return tokenizer_lib.load_tokenizer(synthetic.ensure_corpus(data_cfg.synthetic_dir).vocab)
  if data_cfg.source == "prepared":
    found = prepared.vocab_of(data_cfg.prepared)
    if found:
      return tokenizer_lib.load_tokenizer(found)
    raise ValueError(f"data.vocab is None and the prepared corpus {data_cfg.prepared} carries no vocabulary: set "
                     "--config.data.vocab=PATH (a vocab.txt or SentencePiece .model), or prepare the corpus with "
                     "--vocab=PATH or --train_vocab=30522.")
  raise ValueError(f"data.vocab is None with source={data_cfg.source!r}; set --config.data.vocab to a "
                   "vocab.txt or a SentencePiece .model (`python -m jbert.tokenizer train` makes one).")


def make_source(data_cfg: ml_collections.ConfigDict, split: str) -> tuple[sources.DocumentSource, int, int]:
  """The documents of `split` as `(source, start, stop)`: the split is `source[start:stop]`.

  Without a separate eval split (tfds_eval_split / eval_files), the last `eval_documents` documents (at most
  a tenth) are held out of training and form the eval split. A corpus of fewer than ten documents (a novel
  without blank lines is one) cannot spare whole ones: the last tenth of each document's sentences is held out
  instead. `eval_documents=0` holds nothing out. A prepared corpus holds out what its manifest names.
  """
  if split not in SPLITS:
    raise ValueError(f"split={split!r}; expected one of {SPLITS}.")
  source, cut = data_cfg.source, data_cfg.max_line_chars
  if source == "synthetic":
    corpus = synthetic.ensure_corpus(data_cfg.synthetic_dir)
    path = corpus.train if split == "train" else corpus.eval
    src = sources.BertFormatFiles(str(path), cut, what="synthetic")
    return src, 0, len(src)
  if source == "prepared":
    src = prepared.PreparedDocuments(data_cfg.prepared, split)
    if not len(src) and split == "eval":
      raise ValueError(f"{data_cfg.prepared} holds no held-out documents ({src.manifest['documents']} document(s), "
                       "at most a tenth are held out): prepare more text or a larger --eval_documents, or disable "
                       "evaluation (eval_every_steps=0).")
    return src, 0, len(src)
  if source == "tfds":
    held_out = not data_cfg.tfds_eval_split
    name = data_cfg.tfds_split if split == "train" or held_out else data_cfg.tfds_eval_split
    src = sources.TfdsDocuments(data_cfg.tfds_name, name, data_cfg.tfds_text_key, data_cfg.tfds_data_dir,
                                data_cfg.language, cut)
  elif source in ("files", "text"):
    key = "files" if source == "files" else "text_files"
    held_out = not data_cfg.eval_files
    what = key if split == "train" or held_out else "eval_files"
    patterns = data_cfg[what]
    if not patterns:
      raise ValueError(f"source={source!r} needs data.{key}: set --config.data.{key}=GLOB.")
    if source == "files":
      src = sources.BertFormatFiles(patterns, cut, what=what)
    else:
      src = sources.TextFiles(patterns, data_cfg.language, cut, what=what)
  else:
    raise ValueError(f"data.source={source!r}; expected one of prepared, tfds, files, text, synthetic.")
  if not held_out:
    return src, 0, len(src)
  n_eval = min(data_cfg.eval_documents, len(src) // 10)
  if n_eval:
    return (src, 0, len(src) - n_eval) if split == "train" else (src, len(src) - n_eval, len(src))
  if data_cfg.eval_documents > 0:
    return sources.HeldOutSentences(src, "head" if split == "train" else "tail"), 0, len(src)
  if split == "train":
    return src, 0, len(src)
  eval_key = "tfds_eval_split" if source == "tfds" else "eval_files"
  raise ValueError(f"No held-out documents for evaluation: data.eval_documents=0 and no eval split; set "
                   f"data.{eval_key} or eval_documents, or disable evaluation (eval_every_steps=0).")


class GroupMaker:
  """Element `index` of the infinite group dataset: the masked, shuffled instances of one document group."""

  def __init__(self, data_cfg, tokenizer, source, doc_ids: np.ndarray, seed: int, shard: int):
    self.source, self.tokenizer, self.doc_ids, self.seed, self.shard = source, tokenizer, doc_ids, seed, shard
    self.max_seq_length, self.short_seq_prob, self.nsp = (
        data_cfg.max_seq_length, data_cfg.short_seq_prob, bool(data_cfg.nsp))
    self.groups_per_epoch = max(1, math.ceil(len(doc_ids) / data_cfg.docs_per_group))
    self._groups = (-1, [])
    self.masker = masking.Masker(
        special_mask=tokenizer.special_mask,
        continuation_mask=tokenizer.continuation_mask if data_cfg.whole_word_masking else None,
        mask_id=tokenizer.mask_id, max_predictions=data_cfg.max_predictions_per_seq,
        masked_lm_prob=data_cfg.masked_lm_prob, mask_token_prob=data_cfg.mask_token_prob,
        random_token_prob=data_cfg.random_token_prob)

  def _epoch_groups(self, epoch: int) -> list[np.ndarray]:
    """The epoch's document order cut into groups; the last epoch's is kept, as groups come in order."""
    if self._groups[0] != epoch:
      order = np.random.default_rng([self.seed, epoch, self.shard, 0]).permutation(self.doc_ids)
      self._groups = (epoch, np.array_split(order, self.groups_per_epoch))
    return self._groups[1]

  def documents(self, doc_ids: np.ndarray) -> tuple[list[int], list[list[list[int]]]]:
    """Tokenised documents, with empty sentences and then empty documents dropped."""
    texts = self.source.get_many(doc_ids)
    flat = self.tokenizer.batch_ids([s for doc in texts for s in doc])
    kept_ids, docs, start = [], [], 0
    for d, doc in zip(doc_ids, texts):
      sentences = [ids for ids in flat[start:start + len(doc)] if ids]
      start += len(doc)
      if sentences:
        kept_ids.append(int(d))
        docs.append(sentences)
    return kept_ids, docs

  def __call__(self, index: int, unused_element=None) -> dict[str, np.ndarray]:
    epoch, group = divmod(int(index), self.groups_per_epoch)
    doc_ids, docs = self.documents(self._epoch_groups(epoch)[group])
    if self.nsp:
      found = []
      for position, d in enumerate(doc_ids):
        rng = np.random.default_rng([self.seed, epoch, d])
        found += instances_lib.document_instances(docs, position, self.max_seq_length, self.short_seq_prob, rng)
    else:  # FULL-SENTENCES across the group's documents, in the epoch's random order
      rng = np.random.default_rng([self.seed, epoch, self.shard, group, 2])
      found = instances_lib.full_sentences(docs, self.max_seq_length, self.short_seq_prob, self.tokenizer.sep_id,
                                           rng)
    rng = np.random.default_rng([self.seed, epoch, self.shard, group, 1])
    batch = instances_lib.pack([found[i] for i in rng.permutation(len(found))], self.max_seq_length,
                               self.tokenizer.cls_id, self.tokenizer.sep_id, self.tokenizer.pad_id)
    batch.update(self.masker(batch["input_ids"], rng))
    return batch


# At most this many groups in a row may hold no text: beyond a corpus's own bound (below), 100 groups of
# randomly drawn documents with no text at all mean a corpus that is essentially empty.
MAX_EMPTY_GROUPS = 100


class _SkipEmptyGroups(grain.IterDataset):
  """Drops groups without rows (every document in them tokenised to nothing), and stops with an error naming
  the input after `limit` of them in a row, where the data would otherwise be read forever."""

  def __init__(self, parent: grain.IterDataset, limit: int, origin: str):
    super().__init__(parent)
    self.limit, self.origin = limit, origin

  def __iter__(self) -> grain.DatasetIterator:
    return _SkipEmptyGroupsIterator(self._parent.__iter__(), self.limit, self.origin)


class _SkipEmptyGroupsIterator(grain.DatasetIterator):
  """The state is the parent's, so checkpoints hold the same as with a plain filter."""

  def __init__(self, parent: grain.DatasetIterator, limit: int, origin: str):
    super().__init__(parent)
    self.limit, self.origin = limit, origin

  def __next__(self) -> dict[str, np.ndarray]:
    for _ in range(self.limit):
      group = next(self._parent)
      if len(group["input_ids"]):
        return group
    raise ValueError(f"{self.origin}: {self.limit} document group(s) in a row held no text the tokenizer keeps "
                     "(only control characters such as NUL bytes, or whitespace); check that these are text "
                     "files in UTF-8 and that data.vocab suits them.")

  def get_state(self):
    return self._parent.get_state()

  def set_state(self, state):
    self._parent.set_state(state)


def empty_group_limit(groups_per_epoch: int) -> int:
  """Consecutive empty groups that prove a shard has no usable text: every epoch covers all of the shard's
  documents, so one that has text puts a non-empty group in each epoch and at most 2 * (groups_per_epoch - 1)
  empty ones in a row (the end of one epoch and the start of the next)."""
  return min(2 * groups_per_epoch - 1, MAX_EMPTY_GROUPS)


def _validate(data_cfg, global_batch_size: int, process_index: int, process_count: int) -> None:
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} must lie in [0, process_count={process_count}).")
  if global_batch_size % process_count or global_batch_size < process_count:
    raise ValueError(f"global_batch_size={global_batch_size} must be a positive multiple of the "
                     f"{process_count} data shards (processes); change batch_size or data.num_shards.")
  _validate_lengths(data_cfg)


def _validate_lengths(data_cfg) -> None:
  if data_cfg.max_seq_length < 8:
    raise ValueError(f"data.max_seq_length={data_cfg.max_seq_length} is too short; use at least 8.")
  if data_cfg.max_predictions_per_seq > data_cfg.max_seq_length:
    raise ValueError(f"data.max_predictions_per_seq={data_cfg.max_predictions_per_seq} exceeds "
                     f"max_seq_length={data_cfg.max_seq_length}; lower it (BERT: 20 at 128, 80 at 512).")
  needed = int(np.round((data_cfg.max_seq_length - 2) * data_cfg.masked_lm_prob))
  if data_cfg.max_predictions_per_seq < needed:
    raise ValueError(f"data.max_predictions_per_seq={data_cfg.max_predictions_per_seq} caps masking below "
                     f"data.masked_lm_prob={data_cfg.masked_lm_prob}, which selects {needed} tokens of a full "
                     f"{data_cfg.max_seq_length}-token sequence: set max_predictions_per_seq to at least {needed} "
                     "(configs/base.py leaves it to follow masked_lm_prob).")
  if data_cfg.docs_per_group < 1:
    raise ValueError(f"data.docs_per_group={data_cfg.docs_per_group} must be >= 1.")


def check_data(data_cfg: ml_collections.ConfigDict, eval_enabled: bool, num_shards: int = 1) -> None:
  """Checks the data settings before anything expensive (loading or compiling a model) happens: the source and
  its keys, that its files exist and are readable (or the TFDS dataset is prepared), that every one of
  `num_shards` data shards gets training documents, and, with `eval_enabled`, that a held-out split can be
  formed. Documents are counted, not tokenised (a held-out tail is sentence-split once). Raises ValueError or
  FileNotFoundError with the fix.
  """
  if num_shards < 1:
    raise ValueError(f"num_shards={num_shards} must be >= 1.")
  _validate_lengths(data_cfg)
  splits = ("train", "eval") if eval_enabled else ("train",)
  for split in splits:
    source, start, stop = make_source(data_cfg, split)
    if stop - start < num_shards:
      raise ValueError(f"The {split} split of {source.origin} holds {stop - start} document(s), fewer than the "
                       f"{num_shards} data shards (one per process unless data.num_shards is set): use more "
                       "documents, or fewer shards or processes.")
    if isinstance(source, sources.HeldOutSentences):
      source.check()
  if eval_enabled and data_cfg.nsp:
    problem = _eval_nsp_problem(data_cfg)
    if problem:
      log.warning("held-out evaluation: %s, so its NSP accuracy means nothing (the MLM figures do); hold out more "
                  "(data.eval_documents, data.eval_files, or a larger corpus) or train without NSP "
                  "(data.nsp=False).", problem)


# Held-out splits at most this large are read whole to see whether they can make NSP pairs.
_NSP_CHECK_DOCUMENTS = 64


def _eval_nsp_problem(data_cfg) -> str | None:
  """Why the held-out split cannot make both kinds of NSP pair, or None: a random next segment needs a second
  document, an IsNext pair a document of two sentences."""
  source, start, stop = make_source(data_cfg, "eval")
  if isinstance(source, prepared.PreparedDocuments):
    documents, several = stop - start, source.manifest["held_out"].get("several_sentences")
  elif stop - start <= _NSP_CHECK_DOCUMENTS:
    sizes = [len(d) for d in source.get_many(range(start, stop))]
    documents, several = sum(n > 0 for n in sizes), sum(n > 1 for n in sizes)
  else:
    documents, several = stop - start, None
  if documents < 2:
    return (f"the held-out split of {source.origin} holds {documents} document(s): every random next segment "
            "(NotNext) comes from that same document")
  if several == 0:
    return (f"no held-out document of {source.origin} has two sentences: every example is NotNext")
  return None


def _dataset(data_cfg, tokenizer, *, batch_size: int, seed: int, process_index: int, process_count: int,
             split: str, worker_count: int) -> grain.IterDataset:
  source, start, stop = make_source(data_cfg, split)
  doc_ids = np.arange(start, stop)[process_index::process_count]
  if not len(doc_ids):
    raise ValueError(f"Data shard {process_index} of {process_count} has no {split} documents: the split "
                     f"holds {stop - start}. Use more documents or fewer shards (data.num_shards).")
  maker = GroupMaker(data_cfg, tokenizer, source, doc_ids, seed, process_index)
  groups = grain.MapDataset.range(maker.groups_per_epoch).repeat().map_with_index(maker)
  read = grain.ReadOptions(num_threads=1, prefetch_buffer_size=data_cfg.prefetch_groups)
  ds = _SkipEmptyGroups(groups.to_iter_dataset(read), empty_group_limit(maker.groups_per_epoch), source.origin)
  ds = grain.experimental.RebatchIterDataset(ds, batch_size, drop_remainder=True)
  if worker_count:
    from absl import flags  # pylint: disable=g-import-not-at-top
    if not flags.FLAGS.is_parsed():  # grain's workers read absl flags; outside an absl app none were parsed.
      flags.FLAGS.mark_as_parsed()
    ds = ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=worker_count,
                                                     per_worker_buffer_size=data_cfg.worker_buffer_size))
  return ds


def time_groups(data_cfg: ml_collections.ConfigDict, tokenizer: tokenizer_lib.Tokenizer, *, seed: int,
                min_sequences: int, split: str = "train") -> tuple[int, float]:
  """(sequences, seconds): whole document groups of `split` made one after the other in this process, until at
  least `min_sequences` rows: the honest cost of a sequence (no prefetch thread or worker hides any of it)."""
  source, start, stop = make_source(data_cfg, split)
  maker = GroupMaker(data_cfg, tokenizer, source, np.arange(start, stop), seed, 0)
  sequences, began = 0, time.perf_counter()
  for index in range(MAX_EMPTY_GROUPS + maker.groups_per_epoch * 1000):
    sequences += len(maker(index)["input_ids"])
    if sequences >= min_sequences:
      break
  return sequences, time.perf_counter() - began


def make_pretrain_iterator(data_cfg: ml_collections.ConfigDict, tokenizer: tokenizer_lib.Tokenizer, *,
                           global_batch_size: int, seed: int, process_index: int = 0, process_count: int = 1,
                           split: str = "train") -> grain.DatasetIterator:
  """This shard's endless stream of batches: dicts of int32 arrays with `global_batch_size // process_count`
  rows (`input_ids, token_type_ids, attention_mask` [B, T]; `masked_lm_positions, masked_lm_ids,
  masked_lm_weights` [B, P]; `next_sentence_labels` [B], 0 = B follows A, 1 = random).

  Shards read disjoint documents. `get_state()` / `set_state()` checkpoint the stream (module docstring).
  """
  _validate(data_cfg, global_batch_size, process_index, process_count)
  return iter(_dataset(data_cfg, tokenizer, batch_size=global_batch_size // process_count, seed=seed,
                       process_index=process_index, process_count=process_count, split=split,
                       worker_count=data_cfg.worker_count))


def make_eval_batches(data_cfg: ml_collections.ConfigDict, tokenizer: tokenizer_lib.Tokenizer, *,
                      global_batch_size: int, process_index: int = 0, process_count: int = 1,
                      num_batches: int, seed: int = EVAL_SEED) -> list[dict[str, np.ndarray]]:
  """`num_batches` batches of this shard from the eval split, the same on every call (fixed seed, masks)."""
  _validate(data_cfg, global_batch_size, process_index, process_count)
  ds = _dataset(data_cfg, tokenizer, batch_size=global_batch_size // process_count, seed=seed,
                process_index=process_index, process_count=process_count, split="eval", worker_count=0)
  it = iter(ds)
  return [next(it) for _ in range(num_batches)]
