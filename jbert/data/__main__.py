r"""Prepare a corpus once for training, and look at the pretraining batches a config produces.

  python -m jbert.data prepare --input=GLOB[,GLOB] --output=DIR [--train_vocab=30522 | --vocab=PATH]
      [--vocab_kind=wordpiece|bpe|sentencepiece]
  python -m jbert.data --config=configs/tiny.py --show=4      # decoded sequences, masks visible, by row
  python -m jbert.data --config=configs/tiny.py --stats       # masking/NSP fractions, padding, speed; last line JSON

`prepare` reads Parquet, JSONL (.gz/.zst), plain text, BERT-format files and TFDS datasets (`tfds:NAME[:SPLIT]`),
locally or from gs://, with every core, and writes sentence-split documents as ArrayRecord shards, a held-out
split and a manifest into DIR (jbert.data.prepare); train on it with `--config.data.source=prepared
--config.data.prepared=DIR`. A killed prepare resumes when rerun; on a TPU slice every host runs it with
`--num_hosts=N --host_index=I` (tpu/prepare.sh).

In `--show`, a selected position reads `[MASK→cat]` (replaced by [MASK]), `[~dog→cat]` (by a random token) or
`[=cat]` (kept), and segment B follows the first [SEP]. Packed rows (`data.packing`) are shown sequence by
sequence under a line per row (its sequences and tokens); `--stats` counts per sequence and reports the padding
fraction of the rows.
"""
import json
import time
from typing import Iterator

from absl import app
from absl import flags
import numpy as np
from ml_collections import config_flags

from jbert import errors
from jbert.data import finalize
from jbert.data import formats
from jbert.data import manifest
from jbert.data import packing
from jbert.data import prepare
from jbert.data import workers
from jbert.runtime import console

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (uses its data, seed and "
                                          "batch_size).", lock_config=True)
_SHOW = flags.DEFINE_integer("show", 0, "Print this many decoded sequences.")
_STATS = flags.DEFINE_bool("stats", False, "Measure masking/NSP fractions, padding and sequences/s over --batches.")
_BATCHES = flags.DEFINE_integer("batches", 50, "Batches measured by --stats.")
# loader (grain, and with it JAX) is imported by --show/--stats alone: prepare and its spawned workers skip it.
_SPLIT = flags.DEFINE_enum("split", "train", ["train", "eval"], "Which split to read.")
# -- prepare --
_INPUT = flags.DEFINE_string("input", None, "prepare: comma-separated globs (local, gs://, any fsspec URL) of "
                             "Parquet, JSONL (.gz/.zst) or text files, and/or tfds:NAME[:SPLIT].")
_OUTPUT = flags.DEFINE_string("output", None, "prepare: the corpus directory (local or gs://).")
_FORMAT = flags.DEFINE_enum("format", "auto", ["auto", *formats.FORMATS[:-1]], "prepare: the input format; auto "
                            "reads the suffix (.parquet, .jsonl/.ndjson/.json, else text). `bert`: a sentence per "
                            "line, blank lines between documents.")
_TEXT_COLUMN = flags.DEFINE_string("text_column", "text", "prepare: the Parquet column holding a document.")
_TEXT_KEY = flags.DEFINE_string("text_key", "text", "prepare: the JSONL field (or TFDS feature) holding a document.")
_LANGUAGE = flags.DEFINE_string("language", "en", "prepare: sentencex language code for sentence splitting.")
_MAX_LINE = flags.DEFINE_integer("max_line_chars", 20_000, "prepare: longer lines are cut (counted).")
_MAX_RECORD = flags.DEFINE_float("max_record_mb", 64.0, "prepare: longer records are skipped unread (counted).")
_TFDS_DIR = flags.DEFINE_string("tfds_data_dir", None, "prepare: TFDS data dir of tfds: inputs.")
_SHARD_MB = flags.DEFINE_float("shard_mb", 32.0, "prepare: MB of input per output shard (a unit of work).")
_EVAL_DOCS = flags.DEFINE_integer("eval_documents", 2000, "prepare: documents held out for evaluation (at most a "
                                  "tenth), drawn at random, those of several sentences first.")
_SEED = flags.DEFINE_integer("seed", 0, "prepare: seed of the held-out and vocabulary samples.")
_WORKERS = flags.DEFINE_integer("workers", 0, "prepare: worker processes (0: one per core; 1: in this process).")
_NUM_HOSTS = flags.DEFINE_integer("num_hosts", 1, "prepare: hosts sharing the work (each runs the same command).")
_HOST_INDEX = flags.DEFINE_integer("host_index", 0, "prepare: this host's index in [0, num_hosts).")
_FINALIZE = flags.DEFINE_bool("finalize", False, "prepare: only write the manifest of a corpus whose shards are all "
                              "written (after every host finished).")
_VOCAB = flags.DEFINE_string("vocab", None, "prepare: a vocabulary (vocab.txt, tokenizer.json, .model) to copy in.")
_TRAIN_VOCAB = flags.DEFINE_integer("train_vocab", 0, "prepare: train a vocabulary of --vocab_kind of this size "
                                    "(BERT: 30522, RoBERTa: 50265, XLM-R: 250002) on the prepared sentences.")
_VOCAB_KIND = flags.DEFINE_string("vocab_kind", None, "prepare: the kind --train_vocab trains: wordpiece (default; "
                                  "BERT's vocab.txt), bpe (RoBERTa's byte-level BPE, tokenizer.json) or "
                                  "sentencepiece (XLM-R's sentencepiece.bpe.model).")
_LOWERCASE = flags.DEFINE_bool("lowercase", True, "prepare: the trained vocabulary is uncased (as bert-base-uncased).")
_VOCAB_DOCS = flags.DEFINE_integer("vocab_documents", 200_000, "prepare: documents sampled to train the vocabulary.")


def unmask(batch: dict[str, np.ndarray]) -> np.ndarray:
  """The input ids before masking."""
  original = batch["input_ids"].copy()
  rows, cols = np.nonzero(batch["masked_lm_weights"])
  original[rows, batch["masked_lm_positions"][rows, cols]] = batch["masked_lm_ids"][rows, cols]
  return original


def render(batch: dict[str, np.ndarray], row: int, tokenizer) -> str:
  """One sequence of an unpacked batch as text with its selected positions marked, and its NSP label."""
  n = int(batch["attention_mask"][row].sum())
  tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][row, :n].tolist())
  for pos, orig, weight in zip(batch["masked_lm_positions"][row], batch["masked_lm_ids"][row],
                               batch["masked_lm_weights"][row]):
    if weight:
      now, (was,) = int(batch["input_ids"][row, pos]), tokenizer.convert_ids_to_tokens([int(orig)])
      if now == int(orig):
        tokens[pos] = f"[={was}]"
      elif now == tokenizer.mask_id:
        tokens[pos] = f"[MASK→{was}]"
      else:
        tokens[pos] = f"[~{tokens[pos]}→{was}]"
  label = ("IsNext", "NotNext")[int(batch["next_sentence_labels"][row])]
  return f"{label}: {' '.join(tokens)}"


def shown(batches: Iterator[dict[str, np.ndarray]], count: int, tokenizer) -> Iterator[str]:
  """The first `count` sequences of `batches` as `render` lines; packed rows each under a line of their own."""
  for batch in batches:
    sequences = packing.unpack(batch, tokenizer.pad_id)
    rows = np.nonzero(batch["sequence_weights"])[0] if packing.is_packed(batch) else range(len(batch["input_ids"]))
    previous = None
    for i, row in enumerate(rows):
      if count <= 0:
        return
      if packing.is_packed(batch) and row != previous:
        yield (f"row of {int(batch['sequence_weights'][row].sum())} sequence(s), "
               f"{int(batch['attention_mask'][row].sum())}/{batch['input_ids'].shape[1]} tokens:")
        previous = row
      yield render(sequences, i, tokenizer)
      count -= 1


def measure(batches: list[dict[str, np.ndarray]], tokenizer) -> dict[str, float]:
  """Fractions over `batches`: selected/candidate tokens, the replacement shares, IsNext share (per sequence),
  and the padding of the rows."""
  counts = dict(candidates=0, selected=0, mask=0, random=0, kept=0, is_next=0, sequences=0, tokens=0, rows=0,
                row_tokens=0)
  for packed in batches:
    counts["rows"] += len(packed["input_ids"])
    counts["row_tokens"] += packed["input_ids"].size
    batch = packing.unpack(packed, tokenizer.pad_id)
    original = unmask(batch)
    weights = batch["masked_lm_weights"].astype(bool)
    now = np.take_along_axis(batch["input_ids"], batch["masked_lm_positions"], axis=1)[weights]
    was = batch["masked_lm_ids"][weights]
    counts["candidates"] += int((~tokenizer.special_mask[original]).sum())
    counts["selected"] += int(weights.sum())
    counts["mask"] += int((now == tokenizer.mask_id).sum())
    counts["kept"] += int((now == was).sum())
    counts["random"] += int(((now != tokenizer.mask_id) & (now != was)).sum())
    counts["is_next"] += int((batch["next_sentence_labels"] == 0).sum())
    counts["sequences"] += len(batch["input_ids"])
    counts["tokens"] += int(batch["attention_mask"].sum())
  selected = max(counts["selected"], 1)
  sequences = counts["sequences"]
  return dict(masked_fraction=counts["selected"] / max(counts["candidates"], 1),
              mask_token_fraction=counts["mask"] / selected,
              random_token_fraction=counts["random"] / selected,
              kept_fraction=counts["kept"] / selected, nsp_positive_fraction=counts["is_next"] / sequences,
              mean_sequence_tokens=counts["tokens"] / sequences, sequences=sequences, rows=counts["rows"],
              sequences_per_row=sequences / counts["rows"],
              padding_fraction=1 - counts["tokens"] / counts["row_tokens"])


def main(argv):
  console.quiet_library_logs()  # gcsfs's INFO line for every file opened on gs://, and JAX's start-up lines
  with errors.reported("jbert.data"):
    _main(argv)


def _prepare() -> None:
  if _CONFIG.value is not None or _SHOW.value or _STATS.value:
    raise errors.UserError("prepare takes --input and --output, not --config/--show/--stats.")
  if not _OUTPUT.value:
    raise errors.UserError(f"prepare needs --output=DIR; usage: {manifest.PREPARE}")
  if not _INPUT.value and not _FINALIZE.value:
    raise errors.UserError(f"prepare needs --input=GLOB; usage: {manifest.PREPARE}")
  settings = formats.Settings(format=_FORMAT.value, text_column=_TEXT_COLUMN.value, text_key=_TEXT_KEY.value,
                              language=_LANGUAGE.value, max_line_chars=_MAX_LINE.value,
                              max_record_bytes=int(_MAX_RECORD.value * (1 << 20)), tfds_data_dir=_TFDS_DIR.value)
  options = prepare.Options(
      inputs=_INPUT.value or "", output=_OUTPUT.value.rstrip("/"), settings=settings, shard_mb=_SHARD_MB.value,
      eval_documents=_EVAL_DOCS.value, seed=_SEED.value, workers=_WORKERS.value, num_hosts=_NUM_HOSTS.value,
      host_index=_HOST_INDEX.value, vocab=_VOCAB.value, train_vocab=_TRAIN_VOCAB.value,
      lowercase=_LOWERCASE.value, vocab_documents=_VOCAB_DOCS.value, vocab_kind=_VOCAB_KIND.value)
  prepare.check(options)
  with workers.stopped_by_signals("jbert.data", "prepare interrupted; rerun the same command to finish it (the "
                                  "shards written are kept)."):
    if _FINALIZE.value:
      finalize.finalize(options)
    else:
      prepare.prepare(options)


def _main(argv):
  if argv[1:] == ["prepare"]:
    _prepare()
    return
  if len(argv) > 1:
    raise errors.UserError(f"Unexpected arguments: {argv[1:]}; the command is `prepare`, or none with --config.")
  if _CONFIG.value is None:
    raise errors.UserError("--config=configs/NAME.py is required.")
  if not (_SHOW.value or _STATS.value):
    raise errors.UserError("Nothing to do: pass --show=N and/or --stats.")
  config = _CONFIG.value
  packing.check(config.data)  # before JAX is imported and the tokenizer (which may generate the synthetic corpus)
  from jbert.data import loader  # pylint: disable=g-import-not-at-top
  tokenizer = loader.build_tokenizer(config.data)
  start = time.perf_counter()
  it = loader.make_pretrain_iterator(config.data, tokenizer, global_batch_size=config.batch_size,
                                     seed=config.seed, split=_SPLIT.value)
  first = next(it)
  first_batch_seconds = time.perf_counter() - start
  if _SHOW.value:
    def batches():
      yield first
      yield from it
    for line in shown(batches(), _SHOW.value, tokenizer):
      print(line, end="\n" if line.startswith("row of ") else "\n\n")
  if _STATS.value:
    batches = [next(it) for _ in range(_BATCHES.value)]
    stats = measure([first, *batches], tokenizer)
    # Batches are sliced from whole document groups, which a background thread prepares ahead: timing next()
    # measures the slicing. What a host spends per sequence is the time of whole groups, made here in this
    # process with nothing ahead (reading, splitting, tokenising, instances, masking).
    sequences, seconds = loader.time_groups(config.data, tokenizer, seed=config.seed, split=_SPLIT.value,
                                            min_sequences=_BATCHES.value * config.batch_size)
    stats["sequences_per_sec"] = sequences / seconds
    stats["first_batch_seconds"] = first_batch_seconds
    for key, value in stats.items():
      print(f"{key:>24}: {value:.4f}")
    print(json.dumps(stats))


if __name__ == "__main__":
  app.run(main)
