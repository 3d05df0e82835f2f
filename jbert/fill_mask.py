r"""Predict the words behind `[MASK]`: the top-k tokens and probabilities for every mask of every text.

  python -m jbert.fill_mask --model=PATH [--top_k=5] "Paris is the [MASK] of France." ...
  python -m jbert.fill_mask --model=PATH --input=texts.txt --output=predictions.jsonl

The model needs masked-LM weights (BertForMaskedLM or BertForPreTraining in any format jbert reads). Texts
given on the command line are printed, one line per mask; with --input every line of the file is a text and
--output (JSONL) gets `{"index": i, "text": ..., "masks": [[{"score", "token", "token_str", "sequence"}, ...],
...]}` per text; --json prints that instead of the table. `jbert.fill_mask(texts, model)` is the Python
function.
"""
from __future__ import annotations

import json
import sys

from absl import app
from absl import flags

from jbert.inference import cli, io
from jbert.inference.mask_filling import fill_mask

DEFAULT_TOP_K = 5
_JSON = flags.DEFINE_bool("json", False, "Print one JSON object per text instead of a table.")
for _flag in (cli.MODEL, cli.INPUT, cli.OUTPUT, cli.COLUMN, cli.TOKENIZER, cli.BATCH_SIZE, cli.MAX_LENGTH, cli.DTYPE,
              cli.TOP_K):
  flags.declare_key_flag(_flag.name)  # --help lists the shared flags this command reads


def main(argv):
  with cli.user_errors("jbert.fill_mask"):
    run(argv[1:])


def run(texts: list[str]) -> None:
  cli.require(cli.MODEL, "a checkpoint with masked-LM weights")
  cli.check_numbers(cli.BATCH_SIZE, cli.MAX_LENGTH, cli.TOP_K, max_length_at_least=3)
  if cli.OUTPUT.value:
    io.check_writable(cli.OUTPUT.value)
  cli.require_model()
  texts = cli.arguments_or_input(texts, "texts", ' ("Paris is the [MASK] of France.")')
  top_k = DEFAULT_TOP_K if cli.TOP_K.value is None else cli.TOP_K.value
  results = fill_mask(texts, cli.MODEL.value, top_k, batch_size=cli.BATCH_SIZE.value,
                      max_length=cli.MAX_LENGTH.value, dtype=cli.DTYPE.value, tokenizer=cli.TOKENIZER.value)
  records = ({"index": i, "text": t, "masks": r} for i, (t, r) in enumerate(zip(texts, results)))
  if cli.OUTPUT.value:
    with io.JsonlWriter(cli.OUTPUT.value) as out:
      for record in records:
        out.write(record)
    print(f"jbert.fill_mask: wrote predictions for {len(texts):,} texts to {cli.OUTPUT.value}", file=sys.stderr)
  elif _JSON.value:
    for record in records:
      print(json.dumps(record, ensure_ascii=False, allow_nan=False))
  else:
    for record in records:
      print(record["text"])
      for m, ranked in enumerate(record["masks"], 1):
        print(f"  [MASK] {m}: " + " | ".join(f"{p['token_str']} {p['score']:.4f}" for p in ranked))


cli.make_callable(__name__, fill_mask)

if __name__ == "__main__":
  app.run(main)
