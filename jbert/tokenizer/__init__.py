"""Tokenizers of the BERT family behind one interface: BERT's WordPiece (`vocab.txt` or a WordPiece
`tokenizer.json`; DistilBERT and ELECTRA too), jbert's SentencePiece (`*.model`), RoBERTa's byte-level BPE
(`vocab.json` + `merges.txt` or `tokenizer.json`) and XLM-R's SentencePiece (`sentencepiece.bpe.model` or
`tokenizer.json`), one module per kind registering itself (registry.py); `find_tokenizer` locates the one that
belongs to a model directory, checkpoint or training run and `load_tokenizer` loads it as its kind."""
import json
import os
import pathlib
import tempfile

from etils import epath

from jbert import untrusted
from jbert.errors import UserError
from jbert.tokenizer import registry
from jbert.tokenizer.base import SPECIAL_TOKENS, Tokenizer, truncate_pair
# Imported in the order a folder's file is offered to the kinds (registry.kinds()).
from jbert.tokenizer.wordpiece import WordPieceTokenizer
from jbert.tokenizer.spm import SentencePieceTokenizer, train
from jbert.tokenizer.bpe import ByteLevelBPETokenizer
from jbert.tokenizer.xlmr import XLMRobertaTokenizer

__all__ = ["RUN_TOKENIZER_DIR", "SPECIAL_TOKENS", "ByteLevelBPETokenizer", "SentencePieceTokenizer", "Tokenizer",
           "WordPieceTokenizer", "XLMRobertaTokenizer", "find_tokenizer", "load_tokenizer", "train", "truncate_pair"]

# A training run keeps a copy of its tokenizer in WORKDIR/tokenizer/, beside WORKDIR/checkpoints/.
RUN_TOKENIZER_DIR = "tokenizer"
_SUFFIXES = (".txt", ".model", ".json")


def _read_json(file: epath.Path):
  """A JSON file beside a tokenizer: a local one through `untrusted` (a regular file, read up to its size)."""
  if str(file).startswith(("gs://", "s3://")):
    return json.loads(file.read_text(encoding="utf-8"))
  return untrusted.read_json(file)


def _config(directory: epath.Path) -> dict:
  """The tokenizer_config.json of a folder ({} when it has none, or one that is no JSON object)."""
  file = directory / "tokenizer_config.json"
  try:
    config = _read_json(file) if file.exists() else {}
  except UserError:  # A FIFO or a link to a device is refused by name, not skipped.
    raise
  except (OSError, ValueError):
    return {}
  return config if isinstance(config, dict) else {}


def _usable(file: epath.Path) -> bool:
  return file.is_file() or (file.exists() and not file.is_dir())  # a FIFO is named by the reader, not skipped


def _kind_of(file: epath.Path, config: dict) -> registry.Kind | None:
  """The kind that reads `file`: the one tokenizer_config.json's tokenizer_class names if it claims the file,
  else the first that does."""
  stated = registry.for_class(config.get("tokenizer_class"))
  if stated is not None and stated.claims(file, config):
    return stated
  return next((kind for kind in registry.kinds() if kind.claims(file, config)), None)


def _in_directory(directory: epath.Path) -> epath.Path | None:
  """The tokenizer file of `directory`: the first of its tokenizer_class's files (tokenizer_config.json), else
  its vocab.txt or single *.model, else a tokenizer.json some kind reads (transformers writes one beside vocab.txt;
  RoBERTa's and XLM-R's folders have it), else RoBERTa's vocab.json with merges.txt."""
  config = _config(directory)
  stated = registry.for_class(config.get("tokenizer_class"))
  if stated is not None:
    for pattern in stated.files:
      for file in sorted(directory.glob(pattern)):
        if _usable(file) and stated.claims(file, config):
          return file
  candidates = sorted(directory.glob("vocab.txt")) + sorted(directory.glob("*.model"))
  if len(candidates) > 1:
    raise ValueError(f"Directory {directory} holds several tokenizers {[c.name for c in candidates]}; pass the "
                     "file to use.")
  if candidates:
    return candidates[0]
  for name in ("tokenizer.json", "vocab.json"):
    file = directory / name
    if _usable(file) and _kind_of(file, config) is not None:
      return file
  return None


def find_tokenizer(path: str | os.PathLike) -> str | None:
  """The tokenizer file of the model, checkpoint or run at `path` (local or gs://), or None if it has none.

  `path` may be a tokenizer file itself; a Hugging Face or jbert model directory (vocab.txt, one *.model such as
  XLM-R's sentencepiece.bpe.model, a tokenizer.json, RoBERTa's vocab.json + merges.txt; tokenizer_config.json's
  tokenizer_class picks among them); an original TF1 checkpoint, as its directory or its `bert_model.ckpt` prefix
  (vocab.txt beside bert_config.json); or a jbert training workdir or its `checkpoints/` directory (the copy in
  WORKDIR/tokenizer/).
  """
  path = epath.Path(path)
  if path.is_file() and path.suffix in _SUFFIXES and (
      path.suffix != ".json" or _kind_of(path, _config(path.parent)) is not None):
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
    raise FileNotFoundError(f"Tokenizer path {path} does not exist; pass a vocab.txt, a SentencePiece .model, a "
                            "tokenizer.json, a vocab.json (with merges.txt) or a directory holding one.")
  if not path.is_dir():
    return path
  found = find_tokenizer(path)
  if found is None:
    raise FileNotFoundError(f"Directory {path} holds no tokenizer (vocab.txt, a *.model, a tokenizer.json, "
                            f"vocab.json with merges.txt, or {RUN_TOKENIZER_DIR}/ with one); pass a tokenizer file.")
  return epath.Path(found)


def _local(file: epath.Path, companions: tuple[str, ...] = ()) -> pathlib.Path:
  """`file` (and the `companions` beside it), copied to a temporary directory when it is remote (gs://): the
  tokenizer libraries open local files only, and every host of a TPU slice can read the same bucket."""
  if not str(file).startswith(("gs://", "s3://")):
    return pathlib.Path(file)
  local_dir = pathlib.Path(tempfile.mkdtemp(prefix="jbert-tokenizer-"))
  for name in (file.name, *companions):
    (local_dir / name).write_bytes((file.parent / name).read_bytes())
  return local_dir / file.name


def load_tokenizer(path: str | os.PathLike, do_lower_case: bool | None = None) -> Tokenizer:
  """The tokenizer of a file or folder (see `find_tokenizer`: model directories, TF1 checkpoints, training
  workdirs), of the kind its tokenizer_config.json's tokenizer_class names or its files tell: BERT's (and
  DistilBERT's, ELECTRA's) WordPiece from vocab.txt or tokenizer.json, jbert's SentencePiece (`train`), RoBERTa's
  byte-level BPE (vocab.json + merges.txt, or tokenizer.json), XLM-R's and CamemBERT's SentencePiece
  (sentencepiece.bpe.model with fairseq's ids, or tokenizer.json). Special tokens and model_max_length come from
  tokenizer_config.json where it states them.

  Args:
    path: file or directory, local or remote (`gs://...`).
    do_lower_case: WordPiece: None takes it from tokenizer_config.json, else from the tokenizer.json's
      normalizer, else detects it from the vocabulary (uncased when no piece but bracketed specials has an
      upper-case letter); True/False overrides. The other kinds: None or the files' own setting, which training
      fixed (another value is an error).
  """
  found = _resolve(epath.Path(path))
  config = _config(found.parent)
  kind = _kind_of(found, config)
  if kind is None:
    raise ValueError(f"Cannot tell the tokenizer kind of {found}: expected a WordPiece vocabulary (vocab.txt, or a "
                     "tokenizer.json with a WordPiece, BPE or Unigram model), RoBERTa's vocab.json with merges.txt, "
                     "or a SentencePiece model (*.model).")
  file = _local(found, kind.companions.get(found.name, ()))
  return kind.load(str(file), config, do_lower_case)
