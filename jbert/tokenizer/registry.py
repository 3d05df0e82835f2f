"""The tokenizer kinds `load_tokenizer` chooses from. Each kind module registers one `Kind` (the files it reads,
the transformers `tokenizer_class` names it serves, how to load it); `jbert.tokenizer` imports them all and asks
the registry, so nothing outside a kind's module switches on its name.
"""
import dataclasses
import json
from collections.abc import Callable
from typing import Any

from etils import epath

from jbert import untrusted
from jbert.errors import UserError

# A folder's files in the order a folder without tokenizer_config.json's tokenizer_class is searched: the files
# of BERT's WordPiece and jbert's SentencePiece first (what a jbert folder holds), then the Hub's other formats.
SEARCH_ORDER = ("vocab.txt", "*.model", "tokenizer.json", "vocab.json")


@dataclasses.dataclass(frozen=True)
class Kind:
  """One kind of tokenizer.

  Attributes:
    name: what the kind is called in messages and in `prepare --vocab_kind`.
    classes: transformers `tokenizer_class` names (without `Fast`) whose folders this kind reads.
    files: glob patterns of the file the kind loads from a folder, preferred first.
    claims: whether the kind reads `file`, given the folder's tokenizer_config.json (a dict, maybe empty); it
      looks inside the file where the name alone does not tell (tokenizer.json's model type, a .model's pieces).
    load: `load(local_file, tokenizer_config, do_lower_case)` -> a `jbert.tokenizer.Tokenizer`.
    companions: files beside the loaded one that it needs too (copied with it out of a bucket), per file name.
    train: `train(texts, vocab_size, lowercase, seed)` -> `Trained`, for kinds `prepare --vocab_kind` trains
      (reproducibly: the same texts give the same bytes); None for the others.
    trained_file: the name its trained file takes in a prepared corpus.
  """
  name: str
  classes: tuple[str, ...]
  files: tuple[str, ...]
  claims: Callable[[Any, dict], bool]
  load: Callable[[str, dict, "bool | None"], Any]
  companions: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
  train: Callable[..., "Trained"] | None = None
  trained_file: str | None = None


@dataclasses.dataclass(frozen=True)
class Trained:
  """A trained tokenizer file: its bytes, how many ids it has, and how many of its learned pieces span more than
  one character (none: the text taught it no word, only its characters)."""
  data: bytes
  pieces: int
  words: int


_KINDS: dict[str, Kind] = {}


def register(kind: Kind) -> Kind:
  if kind.name in _KINDS:
    raise ValueError(f"tokenizer kind {kind.name!r} registered twice")
  _KINDS[kind.name] = kind
  return kind


def kinds() -> tuple[Kind, ...]:
  return tuple(_KINDS.values())


def get(name: str) -> Kind:
  if name not in _KINDS:
    raise ValueError(f"no tokenizer kind {name!r}; the kinds are {', '.join(_KINDS)}.")
  return _KINDS[name]


def trainable() -> tuple[str, ...]:
  """The kinds `prepare --vocab_kind` can train."""
  return tuple(k.name for k in _KINDS.values() if k.train is not None)


def for_class(tokenizer_class: object) -> Kind | None:
  """The kind serving transformers' `tokenizer_class` (`RobertaTokenizerFast` is `RobertaTokenizer`'s), else
  None (no class stated, or one no kind knows: the files decide)."""
  if not isinstance(tokenizer_class, str):
    return None
  name = tokenizer_class.removesuffix("Fast")
  return next((k for k in _KINDS.values() if name in k.classes), None)


def special_token(config: dict, key: str, default: str) -> str:
  """A special token's text from tokenizer_config.json, written as a string or as an AddedToken dict."""
  value = config.get(key, default)
  if isinstance(value, dict):
    value = value.get("content", default)
  return value if isinstance(value, str) and value else default


def model_max_length(config: dict) -> int | None:
  """tokenizer_config.json's model_max_length; transformers writes a huge number (1e30) for 'unstated'."""
  value = config.get("model_max_length")
  return int(value) if isinstance(value, (int, float)) and 0 < value < 1e12 else None


def is_remote(file) -> bool:
  return str(file).startswith(("gs://", "s3://"))


def read_bytes(file) -> bytes:
  """A tokenizer file's bytes: a bucket's through etils (what the loaders copy locally first), a local one through
  `untrusted` (a FIFO or a link to a device is refused by name, not read forever)."""
  if is_remote(file):
    return epath.Path(file).read_bytes()
  return untrusted.read_bytes(file)


def json_model_type(file) -> str | None:
  """The `model.type` of a Hugging Face tokenizer.json (WordPiece, BPE, Unigram, ...), None for a file that is
  no such JSON. The file is read through `untrusted` (a FIFO or device link is refused by name)."""
  try:
    data = json.loads(read_bytes(file).decode("utf-8"))
  except UserError:
    raise
  except (OSError, ValueError):
    return None
  model = data.get("model") if isinstance(data, dict) else None
  kind = model.get("type") if isinstance(model, dict) else None
  return kind if isinstance(kind, str) else None
