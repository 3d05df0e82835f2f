"""The inputs the bench scripts' tests run them on: the tiny vocabulary and a small English text."""
import pathlib

from inference.tiny_models import write_vocab

TEXT = ("The cat sat on the mat. A big red dog ran quickly under the blue tree! Is it day? "
        "It was a happy day, and a sad night. Paris is the capital of France.\n")


def vocab_and_corpus(folder: pathlib.Path, repeats: int) -> tuple[pathlib.Path, pathlib.Path]:
  """(vocab.txt, corpus.txt) in `folder`: the tiny vocabulary, and TEXT `repeats` times."""
  corpus = folder / "corpus.txt"
  corpus.write_text(TEXT * repeats, encoding="utf-8")
  return write_vocab(folder), corpus
