"""A model folder of any kind -> config, params, tokenizer and, for sentence-transformers folders, their settings.

Weights go through `jbert.load_pretrained` (Hugging Face dirs, TF1 checkpoints, jbert model dirs, training
workdirs). A sentence-transformers folder (`modules.json`) is read as its authors set it up
(`jbert.weights.st_folder`): its transformer module's weights and tokenizer, its Pooling, Dense and Normalize
modules, and its maximum length, capped here at the model's positions. Tokenizers are found and read by
`jbert.tokenizer` (`vocab.txt`, a SentencePiece `*.model`, or a WordPiece `tokenizer.json` alone, its added tokens
included).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from jbert import untrusted
from jbert.inference import folder as folder_lib
from jbert.tokenizer import Tokenizer, load_tokenizer
from jbert.weights.st_folder import SentenceTransformerSettings, read_dense

_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "*.model", "vocab.json + merges.txt")


@dataclasses.dataclass
class LoadedModel:
  """Everything inference needs from a model folder. `params` are host arrays until first used."""
  path: str
  config: Any  # jbert.BertConfig
  params: Any
  tokenizer: Tokenizer
  model_cls: type
  sentence_transformer: SentenceTransformerSettings | None = None  # (`jbert.weights.st_folder`)
  label_names: tuple[str, ...] | None = None  # From config.json's id2label, where the checkpoint has one.
  initialised: tuple[str, ...] = ()  # Parameter paths that load_pretrained had to initialise (not trained).
  folder: Any = None  # The `folder.ModelFolder` it was loaded from (head, labels, recorded run config).
  # A sentence-transformers Dense module's {"kernel": [in, out], "bias": [out]} (jbert's layout), else None.
  dense_params: Any = None
  _placed: dict = dataclasses.field(default_factory=dict, repr=False)

  def placed_params(self, sharding) -> Any:
    """The params on `sharding` (e.g. replicated over a mesh), transferred once per sharding."""
    import jax  # pylint: disable=g-import-not-at-top
    if sharding not in self._placed:
      self._placed[sharding] = jax.device_put(self.params, sharding)
    return self._placed[sharding]


def load_model(path: "str | os.PathLike | folder_lib.ModelFolder", model_cls: type | None = None, *,
               tokenizer: str | None = None,
               dtype: str | None = None, **overrides) -> LoadedModel:
  """Loads `path` (any format `jbert.load_pretrained` reads, or a sentence-transformers folder) as `model_cls`.

  Args:
    path: model folder, TF1 checkpoint prefix, jbert model dir or training workdir, or its `folder.resolve`.
    model_cls: the jbert class to build; default `jbert.BertModel`.
    tokenizer: a vocab.txt, *.model, tokenizer.json or a folder holding one; default: found beside the weights
      (for a training workdir, its copy in WORKDIR/tokenizer/, else its config's `data.vocab`).
    dtype: compute dtype ("float32", "bfloat16"); default the checkpoint's.
    overrides: further `load_pretrained` overrides (e.g. scan_layers).

  Raises FileNotFoundError / ValueError with the fix: a folder without a tokenizer, or a sentence-transformers
  folder with modules jbert does not implement, before any weight is read; one without weights, or whose
  tokenizer is larger than the model's vocabulary, once `load_pretrained` has looked.
  """
  from jbert import model as model_lib  # pylint: disable=g-import-not-at-top  (the model and weights only when loading)
  # Follows the path once (or takes a caller's resolution); reads no weights.
  resolved = path if isinstance(path, folder_lib.ModelFolder) else folder_lib.resolve(path)
  path, weights_dir, st_settings = resolved.path, resolved.weights, resolved.sentence_transformer
  model_cls = model_cls or model_lib.BertModel
  tok = _load_tokenizer(tokenizer, resolved.tokenizer, path)
  if dtype is not None:
    overrides["dtype"] = dtype
  from jbert import weights  # pylint: disable=g-import-not-at-top
  config, params, initialised = weights.load_pretrained_report(weights_dir, model_cls, **overrides)
  if st_settings is not None and st_settings.max_length is not None:
    st_settings = dataclasses.replace(st_settings,
                                      max_length=min(st_settings.max_length, config.max_length))
  if tok.vocab_size > config.vocab_size:
    raise ValueError(f"The tokenizer of {path} has {tok.vocab_size} pieces but the model's vocab_size is "
                     f"{config.vocab_size}: they do not belong together; pass the model's own tokenizer.")
  dense_params = None
  if st_settings is not None and st_settings.dense is not None:
    dense_params = read_dense(st_settings.dense, st_settings.dense_dir)
  return LoadedModel(path=path, config=config, params=params, tokenizer=tok, model_cls=model_cls,
                     sentence_transformer=st_settings, label_names=_label_names(weights_dir),
                     initialised=initialised, folder=resolved, dense_params=dense_params)


def _load_tokenizer(explicit: str | None, found: str | None, path: str) -> Tokenizer:
  if explicit is not None:
    return load_tokenizer(explicit)
  if found is not None:
    return load_tokenizer(found)
  raise FileNotFoundError(f"{path} holds no tokenizer ({', '.join(_TOKENIZER_FILES)}); put the model's "
                          "tokenizer beside its weights or pass it explicitly (--tokenizer=FILE).")


def _label_names(folder: str) -> tuple[str, ...] | None:
  config = os.path.join(folder, "config.json") if os.path.isdir(folder) else None
  if config is None or not os.path.isfile(config):
    return None
  id2label = _read_json(config).get("id2label")
  if not id2label:
    return None
  return tuple(str(id2label[k]) for k in sorted(id2label, key=int))


def _read_json(path: str) -> Any:
  return untrusted.read_json(path)  # A regular file, read up to its size; a damaged one is named.
