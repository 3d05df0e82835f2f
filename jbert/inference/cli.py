"""Flags and error handling shared by the inference commands (`jbert.embed`, `jbert.fill_mask`, ...).

The flags are defined here once, so that importing several of the commands in one process never defines a
flag twice.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import types
from typing import Any, Callable, Iterator

from absl import flags

from jbert.inference import runner

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


@contextlib.contextmanager
def user_errors(command: str) -> Iterator[None]:
  """Bad input (a missing file, a wrong flag value, a model that does not fit) becomes one line on stderr and
  exit status 2 instead of a traceback. SIGTERM is handled like Ctrl-C, so output files are cleaned up too.
  Entered first thing by every command, so it also spreads XLA:CPU over the cores before JAX starts
  (`runner.use_every_core`)."""
  runner.use_every_core()
  previous = signal.signal(signal.SIGTERM, _interrupt)
  try:
    yield
  except (FileNotFoundError, ValueError, TypeError) as e:
    print(f"{command}: {e}", file=sys.stderr)
    sys.exit(2)
  except KeyboardInterrupt:
    print(f"{command}: interrupted; no output was written.", file=sys.stderr)
    sys.exit(130)
  finally:
    signal.signal(signal.SIGTERM, previous)


def _interrupt(signum, frame):
  del signum, frame
  raise KeyboardInterrupt


def require(flag: flags.FlagHolder, what: str) -> None:
  if flag.value is None:
    raise ValueError(f"--{flag.name} is required: {what}.")


def make_callable(module_name: str, function: Callable[..., Any]) -> None:
  """Makes the command module `module_name` callable as `function`: `jbert.embed` (and the like) names both the
  module and the function (a lazy export of `jbert`), and importing the module replaces the package attribute."""

  class _CallableModule(types.ModuleType):

    def __call__(self, *args, **kwargs):
      return function(*args, **kwargs)

  sys.modules[module_name].__class__ = _CallableModule
