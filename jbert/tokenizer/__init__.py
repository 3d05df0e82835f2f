"""Tokenizers: BERT WordPiece (`vocab.txt`, or a WordPiece `tokenizer.json`) and SentencePiece (`*.model`) behind
one interface; `find_tokenizer` locates the one that belongs to a model directory, checkpoint or training run."""
import json
import os
import pathlib
import tempfile

from etils import epath

from jbert import untrusted
from jbert.errors import UserError
from jbert.tokenizer.base import SPECIAL_TOKENS, Tokenizer, truncate_pair
from jbert.tokenizer.spm import SentencePieceTokenizer, train
from jbert.tokenizer.wordpiece import WordPieceTokenizer

__all__ = ["RUN_TOKENIZER_DIR", "SPECIAL_TOKENS", "SentencePieceTokenizer", "Tokenizer", "WordPieceTokenizer",
           "find_tokenizer", "load_tokenizer", "train", "truncate_pair"]

# A training run keeps a copy of its tokenizer in WORKDIR/tokenizer/, beside WORKDIR/checkpoints/.
RUN_TOKENIZER_DIR = "tokenizer"
_SUFFIXES = (".txt", ".model", ".json")


def _read_json(file: epath.Path):
  """A JSON file beside a tokenizer: a local one through `untrusted` (a regular file, read up to its size)."""
  if str(file).startswith(("gs://", "s3://")):
    return json.loads(file.read_text(encoding="utf-8"))
  return untrusted.read_json(file)


def _is_wordpiece_json(file: epath.Path) -> bool:
  try:
    return (_read_json(file).get("model") or {}).get("type") == "WordPiece"
  except UserError:  # Not a file a folder should hold: named, not skipped.
    raise
  except (OSError, ValueError, AttributeError):
    return False


def _in_directory(directory: epath.Path) -> epath.Path | None:
  """The vocab.txt or single *.model of `directory`, else its WordPiece tokenizer.json (transformers writes one
  beside vocab.txt; some model directories have only the json)."""
  candidates = sorted(directory.glob("vocab.txt")) + sorted(directory.glob("*.model"))
  if len(candidates) > 1:
    raise ValueError(f"Directory {directory} holds several tokenizers {[c.name for c in candidates]}; pass the "
                     "file to use.")
  if candidates:
    return candidates[0]
  candidate = directory / "tokenizer.json"  # A FIFO or a link to a device is refused by name, not skipped.
  if (candidate.is_file() or (candidate.exists() and not candidate.is_dir())) and _is_wordpiece_json(candidate):
    return directory / "tokenizer.json"
  return None


def find_tokenizer(path: str | os.PathLike) -> str | None:
  """The tokenizer file of the model, checkpoint or run at `path` (local or gs://), or None if it has none.

  `path` may be a tokenizer file itself; a Hugging Face or jbert model directory (vocab.txt, a WordPiece
  tokenizer.json, or one *.model); an original TF1 checkpoint, as its directory or its `bert_model.ckpt` prefix
  (vocab.txt beside bert_config.json); or a jbert training workdir or its `checkpoints/` directory (the copy in
  WORKDIR/tokenizer/).
  """
  path = epath.Path(path)
  if path.is_file() and path.suffix in _SUFFIXES and (path.suffix != ".json" or _is_wordpiece_json(path)):
    return os.fspath(path)
  directory = path if path.is_dir() else path.parent  # a TF1 prefix or a file inside a model directory
  if not directory.is_dir():
    return None
  candidates = [directory, directory / RUN_TOKENIZER_DIR]
  if directory.name == "checkpoints":
    candidates.append(directory.parent / RUN_TOKENIZER_DIR)
  for candidate in candidates:
    found = _in_directory(candidate) if candidate.is_dir() else None
    if found is not None:
      return os.fspath(found)
  return None


def _resolve(path: epath.Path) -> epath.Path:
  """The tokenizer file that `path` names: itself, or the one `find_tokenizer` finds in a directory."""
  if not path.exists():
    raise FileNotFoundError(f"Tokenizer path {path} does not exist; pass a vocab.txt, a SentencePiece .model "
                            "or a directory holding one.")
  if not path.is_dir():
    return path
  found = find_tokenizer(path)
  if found is None:
    raise FileNotFoundError(f"Directory {path} holds neither vocab.txt nor a *.model (nor a WordPiece "
                            f"tokenizer.json, nor {RUN_TOKENIZER_DIR}/ with one); pass a tokenizer file.")
  return epath.Path(found)


def _local(file: epath.Path) -> pathlib.Path:
  """`file`, copied to a temporary directory when it is remote (gs://): both tokenizer libraries open local
  files only, and every host of a TPU slice can read the same bucket."""
  if not str(file).startswith(("gs://", "s3://")):
    return pathlib.Path(file)
  local = pathlib.Path(tempfile.mkdtemp(prefix="jbert-tokenizer-")) / file.name
  local.write_bytes(file.read_bytes())
  return local


def _stated_lower_case(config_file: epath.Path) -> bool | None:
  """`do_lower_case` of a Hugging Face tokenizer_config.json beside a vocab.txt (transformers reads it too), so a
  cased tokenizer saved over an uncased-looking vocabulary stays cased; None where no such file says."""
  try:
    stated = _read_json(config_file).get("do_lower_case") if config_file.exists() else None
  except UserError:
    raise
  except (OSError, ValueError, AttributeError):
    return None
  return stated if isinstance(stated, bool) else None


def load_tokenizer(path: str | os.PathLike, do_lower_case: bool | None = None) -> Tokenizer:
  """A tokenizer from a BERT `vocab.txt` or a WordPiece `tokenizer.json` (WordPiece), a SentencePiece `*.model`,
  or a directory with one (see `find_tokenizer`: model directories, TF1 checkpoints, training workdirs).

  Args:
    path: file or directory, local or remote (`gs://...`).
    do_lower_case: WordPiece: None takes it from a tokenizer_config.json beside the vocab.txt or tokenizer.json,
      else from the tokenizer.json's normalizer, else detects it from the vocabulary
      (uncased when no piece but bracketed specials has an upper-case letter); True/False overrides.
      SentencePiece: None or the model's own setting, which training fixed.
  """
  found = _resolve(epath.Path(path))
  if do_lower_case is None and found.suffix in (".txt", ".json"):  # transformers lets the config override the json.
    do_lower_case = _stated_lower_case(found.parent / "tokenizer_config.json")
  file = _local(found)
  if file.suffix == ".model":
    return SentencePieceTokenizer(str(file), do_lower_case=do_lower_case)
  if file.suffix == ".txt" or (file.suffix == ".json" and _is_wordpiece_json(epath.Path(file))):
    return WordPieceTokenizer(str(file), do_lower_case=do_lower_case)
  raise ValueError(f"Cannot tell the tokenizer kind of {file}: expected a WordPiece vocabulary (*.txt, one "
                   "piece per line, or a tokenizer.json with a WordPiece model) or a SentencePiece model (*.model).")
