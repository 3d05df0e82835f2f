r"""Predict with a fine-tuned model: one JSON object per input, in input order.

  python -m jbert.predict --model=WORKDIR --input=dev.jsonl --output=predictions.jsonl
  python -m jbert.predict --model=WORKDIR/export --input=texts.txt --output=out.jsonl
  python -m jbert.predict --model=DIR --input=squad_dev.json --output=answers.jsonl --max_length=384

--model is a fine-tuning workdir, its export/ folder, or any folder with a fine-tuned head and its tokenizer. The
task that trained the model (recorded with it, else told by its head) reads the inputs; a workdir or its export
brings the run's preprocessing (max_seq_length, text columns, SQuAD windows and null threshold); flags override
it, and other folders take defaults (--max_length 128, question answering 384 with --doc_stride=128). Label names
come from the checkpoint. What each task reads and writes:

  sequence classification  .jsonl/.csv/.tsv with `text` (+ `text_b`) or the run's columns (--column,
                           --pair_column), or .txt (one text per line; --pairs: `A<TAB>B`)
                           -> {"label": ..., "probabilities": {label: p}}, or {"value": x} for a regressor
  NER                      .txt (a sentence per line), .conll, or .jsonl/.csv/.tsv with `tokens` or `text`;
                           a .txt/.tsv of CoNLL columns is read as columns, as training reads it
                           -> {"tokens": [...], "tags": [...]}
  question answering       a SQuAD .json, or .jsonl/.csv/.tsv with `question`, `context` (+ `id`)
                           -> {"id": ..., "answer": text ("" for no answer), "score": p}
  multiple choice          .jsonl with `context` and `endings`, or SWAG's .csv
                           -> {"label": index, "probabilities": [...]}

The output is written under a temporary name and renamed when complete. `jbert.predict(inputs, model)` is the
Python function.
"""
from __future__ import annotations

import os
import sys
import time

from absl import app
from absl import flags

from jbert import tasks
from jbert.inference import cli, io
from jbert.inference.prediction import Predictor, predict
from jbert.tasks import options as task_options

# The settings of the tasks this command serves, as their classes declare them (`jbert.tasks.options`): each is a
# flag, unset unless given (a workdir's run then decides, else the declared default).
OPTIONS = task_options.collect(cls for cls in tasks.TASKS.classes() if cls.predicts)
_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float}
_OPTION_FLAGS = {name: _DEFINE[option.type](name, None, option.flag_help(dict.fromkeys(c.title for c in classes)))
                 for name, (option, classes) in OPTIONS.items()}
_MINIMUM = {name: (option.minimum, option.help) for name, (option, _) in OPTIONS.items()
            if option.minimum is not None}

OUTPUT_SUFFIXES = (".jsonl",)
for _flag in (cli.MODEL, cli.INPUT, cli.OUTPUT, cli.COLUMN, cli.PAIR_COLUMN, cli.PAIRS, cli.TOKENIZER, cli.BATCH_SIZE,
              cli.MAX_LENGTH, cli.DTYPE, cli.PACKING):
  flags.declare_key_flag(_flag.name)  # --help lists the shared flags this command reads


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments {argv[1:]}; inputs go in --input=FILE.")
  with cli.user_errors("jbert.predict"):  # Also keeps Orbax's INFO lines of loading a workdir off the console.
    run()


def run() -> None:
  cli.require(cli.MODEL, "the fine-tuning workdir or model folder")
  cli.require(cli.INPUT, "the file of inputs")
  cli.require(cli.OUTPUT, "the .jsonl file to write")
  cli.check_numbers(cli.BATCH_SIZE, cli.MAX_LENGTH, *_OPTION_FLAGS.values(), max_length_at_least=3,
                    minimum=_MINIMUM)
  if os.path.splitext(cli.OUTPUT.value)[1].lower() not in OUTPUT_SUFFIXES:
    raise ValueError(f"--output={cli.OUTPUT.value}: use a .jsonl file (one JSON object per input).")
  io.check_writable(cli.OUTPUT.value)
  cli.require_model()
  cli.require_input()
  predictor = Predictor(cli.MODEL.value, batch_size=cli.BATCH_SIZE.value, dtype=cli.DTYPE.value,
                        tokenizer=cli.TOKENIZER.value, max_length=cli.MAX_LENGTH.value, packing=cli.PACKING.value,
                        **{name: holder.value for name, holder in _OPTION_FLAGS.items()})
  # Every problem of the input file surfaces before the weights load.
  examples = predictor.read(cli.INPUT.value, column=cli.COLUMN.value, pair_column=cli.PAIR_COLUMN.value,
                            pairs=cli.PAIRS.value)
  if not examples:
    raise ValueError(f"{cli.INPUT.value} holds no inputs; nothing to predict (no output written).")
  predictor.model  # pylint: disable=pointless-statement  (loads the weights and tokenizer: their errors first)
  source = f"settings of {predictor.recorded_from}" if predictor.recorded_from else "default settings and flags"
  print(f"jbert.predict: {len(examples):,} inputs, {predictor.info.head.architecture} ({predictor.kind}), "
        f"max_length={predictor.max_length}, {source}", file=sys.stderr)
  start = time.perf_counter()
  predictions = predictor(examples)
  with io.JsonlWriter(cli.OUTPUT.value) as out:
    for prediction in predictions:
      out.write(prediction)
  elapsed = time.perf_counter() - start
  print(f"jbert.predict: wrote {len(predictions):,} predictions to {cli.OUTPUT.value} "
        f"({len(predictions) / elapsed:,.1f} inputs/s)", file=sys.stderr)


cli.make_callable(__name__, predict)

if __name__ == "__main__":
  app.run(main)
