"""Command line: train a SentencePiece model, or show how a vocabulary tokenizes text.

  python -m jbert.tokenizer train --input=GLOB --vocab_size=N --model_type=unigram|bpe --out=PREFIX \
      [--lowercase]
  python -m jbert.tokenizer show --vocab=PATH TEXT
"""
import argparse
import glob
import json
import sys

from jbert import tokenizer


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="python -m jbert.tokenizer", description=__doc__.split("\n")[0])
  commands = parser.add_subparsers(dest="command", required=True)
  train = commands.add_parser("train", help="train a SentencePiece model with [PAD] [UNK] [CLS] [SEP] [MASK] "
                              "at ids 0..4")
  train.add_argument("--input", required=True, help="glob of text files, comma-separated globs allowed")
  train.add_argument("--vocab_size", type=int, required=True)
  train.add_argument("--model_type", choices=("unigram", "bpe"), default="unigram")
  train.add_argument("--out", required=True, help="output prefix: writes PREFIX.model and PREFIX.vocab")
  train.add_argument("--lowercase", action="store_true", help="case-fold the text")
  train.add_argument("--character_coverage", type=float, default=0.9995)
  train.add_argument("--input_sentence_size", type=int, default=0, help="lines to sample; 0 uses all")
  show = commands.add_parser("show", help="print the pieces and ids of TEXT")
  show.add_argument("--vocab", required=True, help="vocab.txt, *.model or a directory with one")
  show.add_argument("--do_lower_case", choices=("true", "false"), default=None)
  show.add_argument("text", nargs="+")
  return parser


def main(argv: list[str] | None = None) -> int:
  parser = _parser()
  args = parser.parse_args(argv)
  if args.command == "train":
    files = sorted({f for pattern in args.input.split(",") for f in glob.glob(pattern)})
    if not files:
      parser.error(f"--input={args.input} matches no files; pass a glob of text files.")
    tok = tokenizer.train(files, args.out, args.vocab_size, model_type=args.model_type,
                          lowercase=args.lowercase, character_coverage=args.character_coverage,
                          input_sentence_size=args.input_sentence_size)
    print(json.dumps(dict(model=f"{args.out}.model", vocab_size=tok.vocab_size, pad_id=tok.pad_id,
                          unk_id=tok.unk_id, cls_id=tok.cls_id, sep_id=tok.sep_id, mask_id=tok.mask_id)))
  else:
    lower = None if args.do_lower_case is None else args.do_lower_case == "true"
    tok = tokenizer.load_tokenizer(args.vocab, do_lower_case=lower)
    ids, offsets = tok.ids_with_offsets(" ".join(args.text))
    print(repr(tok))
    for piece, i, (start, end) in zip(tok.convert_ids_to_tokens(ids), ids, offsets):
      print(f"{i:>8}  {piece}  [{start}:{end}]")
  return 0


if __name__ == "__main__":
  sys.exit(main())
