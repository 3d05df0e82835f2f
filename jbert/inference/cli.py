"""Flags and error handling shared by the inference commands (`jbert.embed`, `jbert.fill_mask`, ...).

The flags are defined here once, so that importing several of the commands in one process never defines a
flag twice; each command declares the ones it reads as its key flags, so its `--help` lists them.

Errors a user causes (a bad flag value, a missing or unreadable input, a model that does not fit, an output
that cannot be written) are one line on stderr and exit status 2; JBERT_TRACEBACK=1 shows their traceback
instead, for bug reports. Any other exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import types
from typing import Any, Callable, Iterator, Mapping

from absl import flags
from absl import logging

from jbert import errors
from jbert.data import files
from jbert.inference import embedding, io, progress, runner
from jbert.runtime import compile_cache, console, storage

MODEL = flags.DEFINE_string("model", None, "Model folder: sentence-transformers, Hugging Face, jbert model dir, "
                            "training workdir, or a TF1 checkpoint prefix.")
TOKENIZER = flags.DEFINE_string("tokenizer", None, "vocab.txt, *.model or tokenizer.json, when the model folder "
                                "has none.")
BATCH_SIZE = flags.DEFINE_integer("batch_size", runner.DEFAULT_BATCH_SIZE, "Rows per batch (a multiple of the "
                                  "local device count; rounded up to one).")
MAX_LENGTH = flags.DEFINE_integer("max_length", None, "Tokens per input incl. special tokens; longer inputs are "
                                  "truncated. Default: the sentence-transformers folder's, else the model's "
                                  "max_position_embeddings (jbert.predict: the fine-tuning run's).")
DTYPE = flags.DEFINE_enum("dtype", None, ["float32", "bfloat16"], "Compute dtype (default: the checkpoint's).")
INPUT = flags.DEFINE_string("input", None, "Input file: .txt (one text per line), .jsonl, .csv or .tsv.")
OUTPUT = flags.DEFINE_string("output", None, "Output file (.npy or .jsonl, as the command allows).")
COLUMN = flags.DEFINE_string("column", None, "JSONL/CSV/TSV input: the text column (default 'text', or a CSV's "
                             "only column; jbert.predict: the fine-tuning run's where the file has it).")
PAIR_COLUMN = flags.DEFINE_string("pair_column", None, "JSONL/CSV/TSV input: a second text per record (pairs).")
PAIRS = flags.DEFINE_bool("pairs", False, "Text input: each line is `text<TAB>pair`.")
# Read by several commands (jbert.embed, jbert.search, jbert.fill_mask).
POOLING = flags.DEFINE_string("pooling", None, f"One or more (comma-separated, concatenated) of "
                              f"{', '.join(embedding.POOLINGS)}. Default: the sentence-transformers folder's.")
NORMALIZE = flags.DEFINE_bool("normalize", None, "Unit-length embeddings. Default: the sentence-transformers "
                              "folder's (its Normalize module), else off.")
CHUNK_SIZE = flags.DEFINE_integer("chunk_size", None, "Inputs sorted and embedded together; bounds memory "
                                  f"(default {runner.DEFAULT_CHUNK_SIZE}; jbert.search index: 8192, the unit an "
                                  "interrupted build keeps).")
PACKING = flags.DEFINE_bool("packing", True, "Several inputs a row (rows of up to --max_length tokens), each computed "
                            "alone: a few compiled shapes whatever the lengths (jbert.predict: where the task packs). "
                            "--nopacking pads each length-sorted batch to a bucket length instead.")
PROGRESS = flags.DEFINE_bool("progress", None, "Progress line on stderr (default: for 2048 inputs or more).")
TOP_K = flags.DEFINE_integer("top_k", None, "Predictions per mask (jbert.fill_mask, default 5); hits per query "
                             "(jbert.search query, default 10).")


# Exceptions that mean the user's input, files or storage, not jbert, went wrong.
USER_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError, io.OutputError, ValueError,
               TypeError)


@contextlib.contextmanager
def user_errors(command: str) -> Iterator[None]:
  """Bad input (a missing file, a wrong flag value, a model that does not fit, an output that cannot be written)
  becomes one line on stderr and exit status 2 instead of a traceback (JBERT_TRACEBACK=1 keeps it). SIGTERM is
  handled like Ctrl-C, so output files are cleaned up too. Entered first thing by every command, so it also
  spreads XLA:CPU over the cores, quiets the libraries' INFO lines (JAX's "Unable to initialize backend
  'tpu'", Orbax's per-step notices) before JAX starts (`--verbosity` still brings them back) and turns on the
  persistent compile cache (`jbert.runtime.compile_cache`), so a second call compiles nothing."""
  runner.use_every_core()
  console.quiet_library_logs()
  compile_cache.enable()
  verbosity = logging.get_verbosity()
  if "verbosity" in flags.FLAGS and not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  progress.INTERRUPTED.clear()
  previous = signal.signal(signal.SIGTERM, _interrupt)
  try:
    yield
  except USER_ERRORS as e:
    if errors.show_traceback():
      raise
    errors.exit_with(command, e)
  except KeyboardInterrupt:
    print(f"{command}: interrupted; no output was written.", file=sys.stderr)
    sys.exit(130)
  finally:
    signal.signal(signal.SIGTERM, previous)
    progress.INTERRUPTED.clear()
    logging.set_verbosity(verbosity)


def _interrupt(signum, frame):
  del signum, frame
  progress.INTERRUPTED.set()  # in case Python drops the exception below (see progress.INTERRUPTED)
  raise KeyboardInterrupt


def require(flag: flags.FlagHolder, what: str) -> None:
  if flag.value is None:
    raise ValueError(f"--{flag.name} is required: {what}.")


# The least value of each numeric flag that can work, and what the flag is, for the message. A chunk of 0 rows
# used to be read as "no chunks": the whole input in memory at once.
MINIMUM = {
    "batch_size": (1, "rows per batch"),
    "chunk_size": (1, "inputs embedded together, which bounds memory; leave it unset for "
                   f"{runner.DEFAULT_CHUNK_SIZE}"),
    "top_k": (1, "predictions per mask"),
}


def check_numbers(*holders: flags.FlagHolder, max_length_at_least: int | None = None,
                  minimum: Mapping[str, tuple[int | float, str]] | None = None) -> None:
  """Numeric flags that cannot work are refused before any file or model is read: each one of `MINIMUM` or of a
  command's own `minimum` (a task's declared options, for jbert.predict), --max_length (which must hold [CLS] and
  [SEP] and a token or two between them), and float flags that are NaN."""
  least_of = {**MINIMUM, **(minimum or {})}
  for holder in holders:
    value = holder.value
    if value is None:
      continue
    if isinstance(value, float) and math.isnan(value):
      raise errors.UserError(f"--{holder.name}=nan is not a number; give a number (or leave it unset).")
    least, what = least_of.get(holder.name, (None, ""))
    if holder.name == "max_length":
      least, what = max_length_at_least, "tokens per input, [CLS] and [SEP] included"
    if least is not None and value < least:
      raise errors.UserError(f"--{holder.name}={value} must be at least {least} ({what}).")


def require_input() -> None:
  """--input names a file; checked before its suffix, so that a folder is not reported as a file format."""
  path = INPUT.value
  if os.path.isdir(path):
    raise IsADirectoryError(f"--input={path} is a directory; name a file in it.")
  if not os.path.exists(path):
    raise FileNotFoundError(f"--input={path} does not exist.")


def arguments_or_input(texts: list[str], what: str, example: str = "") -> list[str]:
  """The texts given as arguments, or else the records of --input (its --column): one of the two, not empty."""
  if INPUT.value:
    if texts:
      raise ValueError(f"Give {what} either as arguments or with --input, not both.")
    require_input()
    files.scan(INPUT.value, column=COLUMN.value)
    texts = list(files.iter_records(INPUT.value, column=COLUMN.value))
  if not texts:
    raise ValueError(f"No {what}: pass them as arguments{example} or with --input=FILE.")
  return texts


def require_model() -> None:
  """--model names something that exists (a folder, or a TF1 checkpoint prefix), checked before the other
  flags so that a typo in the path is not reported as a problem of the flags that depend on the model."""
  from jbert.weights import remote  # pylint: disable=g-import-not-at-top
  path = MODEL.value
  storage.require([path], "--model")
  if not remote.exists(path):
    raise FileNotFoundError(f"--model={path} does not exist; pass a model folder (Hugging Face, "
                            "sentence-transformers, jbert, a training workdir) or a TF1 checkpoint prefix.")


def make_callable(module_name: str, function: Callable[..., Any]) -> None:
  """Makes the command module `module_name` callable as `function`: `jbert.embed` (and the like) names both the
  module and the function (a lazy export of `jbert`), and importing the module replaces the package attribute."""

  class _CallableModule(types.ModuleType):

    def __call__(self, *args, **kwargs):
      return function(*args, **kwargs)

  sys.modules[module_name].__class__ = _CallableModule
