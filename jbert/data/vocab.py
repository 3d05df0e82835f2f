"""The vocabulary a prepared corpus carries, so training it needs no `data.vocab`: copied in (`prepare
--vocab=PATH`: a vocab.txt, a WordPiece tokenizer.json or a SentencePiece .model) or trained on the prepared
sentences (`prepare --train_vocab=N`): WordPiece as BERT's, with Hugging Face tokenizers' trainer (BERT's
normaliser and pre-tokeniser, `##` continuations, the special tokens [PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4),
on a seeded sample of `vocab_documents` documents. The trainer keeps pieces seen at least twice, so a small corpus
gives fewer pieces than asked, which is said; one that teaches it no word at all (its characters only) is refused.
A trained vocabulary is recorded beside the parts (`parts/vocab.json`: what it was trained on, with which
settings, and its CRC32C), so a rerun that rewrites the manifest keeps it: training again could number the pieces
of equal counts otherwise, and a model trained on the corpus would then read other ids.
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

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def file_name(source: str) -> str:
  """The name a copied vocabulary takes in the corpus directory (its kind is told by its name)."""
  if source.endswith(".model"):
    return "spm.model"
  return "tokenizer.json" if source.endswith(".json") else "vocab.txt"


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


def train_wordpiece(texts: Iterator[str], vocab_size: int, lowercase: bool) -> list[str]:
  """The pieces of a WordPiece vocabulary trained on `texts`, BERT's special tokens first."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import models, normalizers, pre_tokenizers, trainers  # pylint: disable=g-import-not-at-top
  tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=lowercase,
                                              lowercase=lowercase)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=list(SPECIAL_TOKENS),
                                      continuing_subword_prefix="##", show_progress=False)
  tok.train_from_iterator(texts, trainer=trainer)
  return [piece for piece, _ in sorted(tok.get_vocab().items(), key=lambda item: item[1])]


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
    if options.train_vocab <= len(SPECIAL_TOKENS):
      raise ValueError(f"--train_vocab={options.train_vocab} leaves no room beside the {len(SPECIAL_TOKENS)} special "
                       "tokens; BERT's is 30522.")
    path, record = paths.join(output, "vocab.txt"), paths.join(output, "parts", "vocab.json")
    trained = {"train_vocab": options.train_vocab, "lowercase": options.lowercase, "seed": options.seed,
               "vocab_documents": options.vocab_documents, "shards": list(checksums)}
    if paths.exists(record) and paths.exists(path):
      with paths.open_raw(record) as f:
        kept = json.loads(f.read().decode("utf-8"))
      if kept.get("trained") == trained and kept.get("crc32c") == shards_lib.crc32c(path):
        log("prepare: keeping the vocabulary trained before on these shards (vocab.txt)")
        return "vocab.txt"
    log(f"prepare: training a WordPiece vocabulary of {options.train_vocab} on up to {options.vocab_documents:,} "
        "documents")
    pieces = train_wordpiece(sample_texts(shards, documents, options.vocab_documents, options.seed),
                             options.train_vocab, options.lowercase)
    _check_learned(pieces, options.train_vocab, min(options.vocab_documents, sum(documents)), log)
    data = ("\n".join(pieces) + "\n").encode("utf-8")
    _checked("vocab.txt", data, "the trained vocabulary")
    paths.write_atomic(path, data)
    paths.write_atomic(record, (json.dumps({"trained": trained, "crc32c": shards_lib.crc32c(path)}) + "\n").encode())
    return "vocab.txt"
  return None


def _check_learned(pieces: list[str], asked: int, sampled: int, log: Callable[[str], None]) -> None:
  """Says how many pieces came when fewer than asked; refuses a vocabulary that holds no word, only characters."""
  learned = pieces[len(SPECIAL_TOKENS):]
  if not any(len(p) > 1 and not p.startswith("##") for p in learned):
    raise ValueError(f"--train_vocab={asked}: the {sampled:,} sampled document(s) taught WordPiece {len(pieces)} "
                     "pieces, their characters and no word (a piece must be seen at least twice), too few to train "
                     "a model with; prepare more text, or copy a vocabulary in with --vocab=PATH (e.g. "
                     "bert-base-uncased's vocab.txt). The shards written are kept.")
  if len(pieces) < asked:
    log(f"prepare: the vocabulary has {len(pieces):,} pieces, not the {asked:,} asked: the {sampled:,} sampled "
        "document(s) hold no more pieces seen at least twice (more text gives more)")
