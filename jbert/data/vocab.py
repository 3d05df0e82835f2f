"""The vocabulary a prepared corpus carries, so training it needs no `data.vocab`: copied in (`prepare
--vocab=PATH`: a vocab.txt, a tokenizer.json or a SentencePiece .model) or trained on the prepared sentences
(`prepare --train_vocab=N --vocab_kind=KIND`) on a seeded sample of `vocab_documents` documents, by the trainer of
the tokenizer kind (jbert/tokenizer's registry): `wordpiece` (BERT's vocab.txt, [PAD] [UNK] [CLS] [SEP] [MASK] at
0-4), `bpe` (RoBERTa's byte-level BPE, tokenizer.json) or `sentencepiece` (XLM-R's sentencepiece.bpe.model). Each
trainer gives the same bytes for the same sample. Pieces must be seen at least twice, so a small corpus gives fewer
pieces than asked, which is said; one that teaches no word at all (its characters only) is refused.
A trained vocabulary is recorded beside the parts (`parts/vocab.json`: what it was trained on, with which
settings, and its CRC32C), so a rerun that rewrites the manifest keeps it rather than training again.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence

import numpy as np

from jbert import tokenizer as tokenizer_lib
from jbert.data import paths
from jbert.data import shards as shards_lib

RECORD = "parts/vocab.json"  # what a trained vocabulary was trained on, and its CRC32C
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_TITLES = {"wordpiece": "WordPiece", "bpe": "byte-level BPE", "sentencepiece": "SentencePiece"}


def file_name(source: str) -> str:
  """The name a copied vocabulary takes in the corpus directory (its kind is told by its name)."""
  if source.endswith(".model"):
    return "spm.model"
  return "tokenizer.json" if source.endswith(".json") else "vocab.txt"


def trainable_kinds() -> tuple[str, ...]:
  """The values of `prepare --vocab_kind`."""
  return tokenizer_lib.registry.trainable()


def _checked(name: str, data: bytes, where: str) -> None:
  """Loads the vocabulary from a local copy: a file that is no vocabulary is refused before it is installed."""
  with tempfile.TemporaryDirectory() as tmp:
    local = os.path.join(tmp, name)
    with open(local, "wb") as f:
      f.write(data)
    try:
      tokenizer_lib.load_tokenizer(local).check_unique()
    except (ValueError, OSError) as e:
      raise ValueError(f"{where} is not a usable vocabulary: {e}") from e


def sample_texts(shards: Sequence[str], documents: Sequence[int], sample: int, seed: int) -> Iterator[str]:
  """The sentences of `sample` documents drawn without replacement (seeded), read back from the shards."""
  import grain  # pylint: disable=g-import-not-at-top  (grain's ArrayRecord reader)
  if any(paths.is_url(s) and not s.startswith("gs://") for s in shards):
    raise ValueError("--train_vocab reads the prepared shards back, which ArrayRecord can do from local disk or "
                     "gs:// only; prepare into such an --output, or pass --vocab=PATH.")
  source = grain.sources.ArrayRecordDataSource([f"{s}[0:{n}]" for s, n in zip(shards, documents) if n])
  total = len(source)
  chosen = np.sort(np.random.default_rng(seed).choice(total, min(sample, total), replace=False))
  for start in range(0, len(chosen), 1024):
    for record in source.__getitems__([int(i) for i in chosen[start:start + 1024]]):
      yield from record.decode("utf-8").split("\n")


def install(options, output: str, shards: Sequence[str], documents: Sequence[int], checksums: Sequence[str],
            log: Callable[[str], None]) -> str | None:
  """Copies or trains the vocabulary into `output`; its file name, or None when the corpus has none. `checksums`:
  the shards' CRC32C, which identify what a vocabulary was trained on."""
  if options.vocab:
    name = file_name(options.vocab)
    data = paths.read_bytes(options.vocab)
    _checked(name, data, f"--vocab={options.vocab}")
    paths.write_atomic(paths.join(output, name), data)
    return name
  if options.train_vocab:
    kind = tokenizer_lib.registry.get(options.vocab_kind or "wordpiece")
    if options.train_vocab <= len(SPECIAL_TOKENS):
      raise ValueError(f"--train_vocab={options.train_vocab} leaves no room beside the {len(SPECIAL_TOKENS)} special "
                       "tokens; BERT's is 30522.")
    name = kind.trained_file
    path, record = paths.join(output, name), paths.join(output, RECORD)
    trained = {"train_vocab": options.train_vocab, "lowercase": options.lowercase, "seed": options.seed,
               "vocab_documents": options.vocab_documents, "shards": list(checksums)}
    if kind.name != "wordpiece":  # a WordPiece corpus prepared before the kinds keeps its record
      trained["vocab_kind"] = kind.name
    kept = _record(output) if paths.exists(path) else None
    if kept is not None and kept.get("trained") == trained and kept.get("crc32c") == shards_lib.crc32c(path):
      log(f"prepare: keeping the vocabulary trained before on these shards ({name})")
      return name
    log(f"prepare: training a {_TITLES.get(kind.name, kind.name)} vocabulary of {options.train_vocab} on up to "
        f"{options.vocab_documents:,} documents")
    result = kind.train(sample_texts(shards, documents, options.vocab_documents, options.seed),
                        options.train_vocab, options.lowercase, options.seed)
    _check_learned(result, kind.name, options.train_vocab, min(options.vocab_documents, sum(documents)), log)
    _checked(name, result.data, "the trained vocabulary")
    paths.write_atomic(path, result.data)
    paths.write_atomic(record, (json.dumps({"trained": trained, "crc32c": shards_lib.crc32c(path)}) + "\n").encode())
    return name
  return None


def _record(output: str) -> dict | None:
  """parts/vocab.json of `output`; None when it is missing or unreadable (the vocabulary is then trained again)."""
  try:
    with paths.open_raw(paths.join(output, RECORD)) as f:
      kept = json.loads(f.read().decode("utf-8"))
  except (OSError, ValueError):
    return None
  return kept if isinstance(kept, dict) else None


def damage(options, output: str, name: str | None) -> str | None:
  """What is wrong with the vocabulary `name` that a finished corpus in `output` carries, or None when it is
  intact: a trained one must have the CRC32C its record (parts/vocab.json) holds, a copied one the bytes of
  --vocab. A rerun that finds damage installs it again (`install`: the same sample trains the same bytes), as it
  writes a damaged shard again."""
  if not name:
    return None
  path = paths.join(output, name)
  if not paths.exists(path):
    return f"{path} is missing"
  if options.vocab:
    return None if paths.read_bytes(path) == paths.read_bytes(options.vocab) else (
        f"{path} is not the bytes of --vocab={options.vocab}")
  if not options.train_vocab:
    return None
  kept, record = _record(output), paths.join(output, RECORD)
  if kept is None:
    return f"{record}, the record of {path}, is missing or unreadable"
  crc = shards_lib.crc32c(path)
  return None if kept.get("crc32c") == crc else (
      f"{path} is damaged (CRC32C {crc}, where {record} records {kept.get('crc32c')})")


def _check_learned(result, kind: str, asked: int, sampled: int, log: Callable[[str], None]) -> None:
  """Says how many pieces came when fewer than asked; refuses a vocabulary that holds no word, only characters."""
  title = _TITLES.get(kind, kind)
  if not result.words:
    raise ValueError(f"--train_vocab={asked}: the {sampled:,} sampled document(s) taught {title} {result.pieces} "
                     "pieces, their characters and no word (a piece must be seen at least twice), too few to train "
                     "a model with; prepare more text, or copy a vocabulary in with --vocab=PATH (e.g. "
                     "bert-base-uncased's vocab.txt). The shards written are kept.")
  if result.pieces < asked:
    log(f"prepare: the vocabulary has {result.pieces:,} pieces, not the {asked:,} asked: the {sampled:,} sampled "
        "document(s) hold no more pieces seen at least twice (more text gives more)")
