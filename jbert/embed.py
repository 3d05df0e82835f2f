r"""Embed a file of texts: one row per input, in input order.

  python -m jbert.embed --model=PATH --input=texts.txt --output=emb.npy [--pooling=mean --normalize]
  python -m jbert.embed --model=PATH --input=data.jsonl --column=sentence --output=emb.jsonl
  python -m jbert.embed --model=PATH --input=pairs.tsv --column=a --pair_column=b --output=emb.npy

A sentence-transformers folder brings its pooling, normalisation and maximum length; other checkpoints need
--pooling. Inputs: .txt (one text per line; an empty line embeds `[CLS] [SEP]`; --pairs for `A<TAB>B`), .jsonl,
.csv or .tsv. Outputs: .npy (float32 [N, D]) or .jsonl (`{"index": i, "embedding": [...]}` per line). The input
streams through in chunks, so files larger than memory work; the output is written under a temporary name and
renamed when complete. `import jbert; jbert.embed(texts, model)` is the Python function.
"""
from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags

from jbert.data import files
from jbert.inference import cli, io, runner
from jbert.inference.embedding import LAYER_COMBINES, Embedder, embed
from jbert.inference.progress import ProgressLine

_LAYERS = flags.DEFINE_string("layers", None, "Hidden states to pool, e.g. -1 (default) or -4,-3,-2,-1 "
                              "(0 = embeddings output).")
_COMBINE = flags.DEFINE_enum("layer_combine", "concat", list(LAYER_COMBINES), "How --layers are joined.")

OUTPUT_SUFFIXES = (".npy", ".jsonl")
for _flag in (cli.MODEL, cli.INPUT, cli.OUTPUT, cli.COLUMN, cli.PAIR_COLUMN, cli.PAIRS, cli.TOKENIZER, cli.BATCH_SIZE,
              cli.MAX_LENGTH, cli.DTYPE, cli.POOLING, cli.NORMALIZE, cli.CHUNK_SIZE, cli.PROGRESS, cli.PACKING):
  flags.declare_key_flag(_flag.name)  # --help lists the shared flags this command reads


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}; texts go in --input=FILE.")
  with cli.user_errors("jbert.embed"):
    run()


def run() -> None:
  cli.require(cli.MODEL, "the model folder")
  cli.require(cli.INPUT, "the file of texts")
  cli.require(cli.OUTPUT, "the .npy or .jsonl file to write")
  cli.check_numbers(cli.BATCH_SIZE, cli.CHUNK_SIZE, cli.MAX_LENGTH, max_length_at_least=2)
  suffix = os.path.splitext(cli.OUTPUT.value)[1].lower()
  if suffix not in OUTPUT_SUFFIXES:
    raise ValueError(f"--output={cli.OUTPUT.value}: use a .npy (float32 [N, D]) or .jsonl file.")
  io.check_writable(cli.OUTPUT.value)
  cli.require_model()
  cli.require_input()
  read = dict(column=cli.COLUMN.value, pair_column=cli.PAIR_COLUMN.value, pairs=cli.PAIRS.value)
  total = files.scan(cli.INPUT.value, **read)  # Every decoding or format problem surfaces before the model loads.
  if total == 0:
    raise ValueError(f"{cli.INPUT.value} holds no inputs; nothing to embed (no output written).")
  embedder = Embedder(cli.MODEL.value, pooling=cli.POOLING.value, normalize=cli.NORMALIZE.value,
                      layers=_LAYERS.value, layer_combine=_COMBINE.value, batch_size=cli.BATCH_SIZE.value,
                      max_length=cli.MAX_LENGTH.value, dtype=cli.DTYPE.value, tokenizer=cli.TOKENIZER.value,
                      packing=cli.PACKING.value)
  s = embedder.settings
  print(f"jbert.embed: {total:,} inputs, pooling={','.join(s.pooling)} normalize={s.normalize} "
        f"layers={list(s.layers)} max_length={s.max_length} -> {embedder.dim} dims", file=sys.stderr)
  enabled = total >= runner.PROGRESS_MIN_ROWS if cli.PROGRESS.value is None else cli.PROGRESS.value
  progress = ProgressLine(total, "embed", enabled=enabled)
  start = time.perf_counter()
  records = files.iter_records(cli.INPUT.value, **read)
  chunk_size = runner.DEFAULT_CHUNK_SIZE if cli.CHUNK_SIZE.value is None else cli.CHUNK_SIZE.value
  if suffix == ".npy":
    with io.NpyWriter(cli.OUTPUT.value) as out:
      for block in embedder.stream(records, chunk_size, progress):
        out.write(block)
  else:
    with io.JsonlWriter(cli.OUTPUT.value) as out:
      index = 0
      for block in embedder.stream(records, chunk_size, progress):
        for row in block:
          out.write({"index": index, "embedding": row.tolist()})
          index += 1
  progress.close()
  embedder.report_truncation(total)
  elapsed = time.perf_counter() - start
  print(f"jbert.embed: wrote {total:,} x {embedder.dim} embeddings to {cli.OUTPUT.value} "
        f"({total / elapsed:,.1f} inputs/s)", file=sys.stderr)


cli.make_callable(__name__, embed)

if __name__ == "__main__":
  app.run(main)
