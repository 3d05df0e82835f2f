r"""Command line: train a SentencePiece model, or show how a vocabulary tokenizes text.

  python -m jbert.tokenizer train --input=GLOB --vocab_size=N --model_type=unigram|bpe --out=PREFIX \
      [--lowercase]
  python -m jbert.tokenizer show --vocab=PATH [--do_lower_case=true|false] TEXT...
"""
import glob
import json
import sys

from absl import flags

from jbert import errors
from jbert import tokenizer

PROG = "python -m jbert.tokenizer"
COMMANDS = ("train", "show")
USAGE = "usage:\n" + __doc__.split("\n", 2)[2].rstrip()  # the docstring's command lines

# Flags of their own (not absl's global FLAGS): `main(argv)` parses afresh on every call, and the names
# (--input, --vocab, ...) cannot clash with those of another module loaded in the same process.
_FLAGS = flags.FlagValues()
_INPUT = flags.DEFINE_string("input", None, "train: glob of text files, comma-separated globs allowed.",
                             flag_values=_FLAGS)
_VOCAB_SIZE = flags.DEFINE_integer("vocab_size", None, "train: pieces, the five special tokens included.",
                                   lower_bound=6, flag_values=_FLAGS)
_MODEL_TYPE = flags.DEFINE_enum("model_type", "unigram", ["unigram", "bpe"], "train: SentencePiece algorithm.",
                                flag_values=_FLAGS)
_OUT = flags.DEFINE_string("out", None, "train: output prefix; writes PREFIX.model and PREFIX.vocab.",
                           flag_values=_FLAGS)
_LOWERCASE = flags.DEFINE_bool("lowercase", False, "train: case-fold the text.", flag_values=_FLAGS)
_COVERAGE = flags.DEFINE_float("character_coverage", 0.9995, "train: fraction of characters the pieces cover.",
                               flag_values=_FLAGS)
_SENTENCES = flags.DEFINE_integer("input_sentence_size", 0, "train: lines to sample; 0 uses all.",
                                  flag_values=_FLAGS)
_SHOW_VOCAB = flags.DEFINE_string("vocab", None, "show: vocab.txt, *.model, tokenizer.json, vocab.json (with "
                                  "merges.txt) or a model folder.",
                                  flag_values=_FLAGS)
_DO_LOWER_CASE = flags.DEFINE_bool("do_lower_case", None, "show: override the vocabulary's lower-casing.",
                                   flag_values=_FLAGS)


def _help() -> str:
  own = [name for name in sorted(_FLAGS) if name not in ("flagfile", "undefok")]
  return "\n".join([__doc__.split("\n")[0], USAGE, "flags:", *(f"  --{n}: {_FLAGS[n].help}" for n in own)])


def _exit(message: str) -> None:
  """argparse's convention, which scripts calling this CLI rely on: the reason, the usage, exit status 2."""
  print(f"{PROG}: {message}\n{USAGE}", file=sys.stderr)
  sys.exit(2)


def _train() -> None:
  missing = [f"--{name}" for name, flag in (("input", _INPUT), ("vocab_size", _VOCAB_SIZE), ("out", _OUT))
             if flag.value is None]
  if missing:
    _exit(f"train needs {', '.join(missing)}.")
  files = sorted({f for pattern in _INPUT.value.split(",") for f in glob.glob(pattern)})
  if not files:
    _exit(f"--input={_INPUT.value} matches no files; pass a glob of text files.")
  tok = tokenizer.train(files, _OUT.value, _VOCAB_SIZE.value, model_type=_MODEL_TYPE.value,
                        lowercase=_LOWERCASE.value, character_coverage=_COVERAGE.value,
                        input_sentence_size=_SENTENCES.value)
  print(json.dumps(dict(model=f"{_OUT.value}.model", vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                        unk_id=tok.unk_id, cls_id=tok.cls_id, sep_id=tok.sep_id, mask_id=tok.mask_id)))


def _show(words: list[str]) -> None:
  if _SHOW_VOCAB.value is None:
    _exit("show needs --vocab=PATH (a vocab.txt, a *.model, a tokenizer.json or a model folder).")
  if not words:
    _exit("show needs the text to tokenize after the flags.")
  tok = tokenizer.load_tokenizer(_SHOW_VOCAB.value, do_lower_case=_DO_LOWER_CASE.value)
  ids, offsets = tok.ids_with_offsets(" ".join(words))
  print(repr(tok))
  for piece, i, (start, end) in zip(tok.convert_ids_to_tokens(ids), ids, offsets):
    print(f"{i:>8}  {piece}  [{start}:{end}]")


def main(argv: list[str] | None = None) -> int:
  """Runs the command in `argv` (default: sys.argv[1:]), absl flags anywhere among the words."""
  argv = sys.argv[1:] if argv is None else list(argv)
  if any(a in ("-h", "--help", "--helpfull") for a in argv):
    print(_help())
    return 0
  _FLAGS.unparse_flags()
  try:
    words = _FLAGS([PROG, *argv])[1:]
  except flags.Error as e:
    _exit(str(e))
  if not words or words[0] not in COMMANDS:
    _exit(f"give a command, one of {', '.join(COMMANDS)}.")
  with errors.reported(PROG):  # a vocabulary or corpus that cannot be used: one line, exit 2
    if words[0] == "train":
      if len(words) > 1:
        _exit(f"train takes no words besides its flags; got {words[1:]}.")
      _train()
    else:
      _show(words[1:])
  return 0


if __name__ == "__main__":
  sys.exit(main())
