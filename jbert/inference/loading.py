"""A model folder of any kind -> config, params, tokenizer and, for sentence-transformers folders, their settings.

Weights go through `jbert.load_pretrained` (Hugging Face dirs, TF1 checkpoints, jbert model dirs, training
workdirs). A sentence-transformers folder (`modules.json`) is read as its authors set it up: the transformer
module's weights and tokenizer (the folder root or `0_Transformer/`), `1_Pooling/config.json` (the legacy
`pooling_mode_*` booleans or the newer `pooling_mode`), an optional Dense projection (`2_Dense/config.json` and
its `linear.weight`/`linear.bias`), an optional Normalize module, and the maximum length
(`sentence_bert_config.json`'s `max_seq_length`, else the tokenizer's `model_max_length`, capped at the model's
positions). Tokenizers are found and read by `jbert.tokenizer` (`vocab.txt`, a SentencePiece `*.model`, or a
WordPiece `tokenizer.json` alone, its added tokens included).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

from jbert import errors, untrusted
from jbert.model import pooling as pooling_lib
from jbert.model.sentence import Projection
from jbert.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger("jbert")

ST_POOLING_MODES = pooling_lib.ST_MODES  # sentence-transformers' Pooling modes
# The Dense activations jbert runs, as sentence-transformers names them (`activation_function`, a torch class).
TORCH_ACTIVATIONS = {"tanh": "torch.nn.modules.activation.Tanh", "identity": "torch.nn.modules.linear.Identity",
                     "relu": "torch.nn.modules.activation.ReLU", "gelu": "torch.nn.modules.activation.GELU",
                     "sigmoid": "torch.nn.modules.activation.Sigmoid"}
DENSE_ACTIVATIONS = {path.rsplit(".", 1)[-1]: name for name, path in TORCH_ACTIVATIONS.items()}  # by class name
# The modules jbert runs, in the order they must come.
ST_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_TOKENIZER_FILES = ("vocab.txt", "tokenizer.json", "*.model")
# A tokenizer_config.json `model_max_length` this large means "no limit" (transformers' VERY_LARGE_INTEGER).
_NO_LIMIT = 10 ** 9


@dataclasses.dataclass(frozen=True)
class SentenceTransformerSettings:
  """What a sentence-transformers folder fixes: pooling modes (concatenated in this order; None without a Pooling
  module), normalisation, maximum length in tokens (special tokens included), whether texts are lower-cased
  first, and its Dense projection (`dense_dir`: the module's folder, holding its weights)."""
  pooling: tuple[str, ...] | None
  normalize: bool
  max_length: int | None
  lowercase: bool = False
  dense: Projection | None = None
  dense_dir: str | None = None


@dataclasses.dataclass
class LoadedModel:
  """Everything inference needs from a model folder. `params` are host arrays until first used."""
  path: str
  config: Any  # jbert.BertConfig
  params: Any
  tokenizer: Tokenizer
  model_cls: type
  sentence_transformer: SentenceTransformerSettings | None = None
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
  import jbert  # pylint: disable=g-import-not-at-top  (the model and weights only when loading)
  from jbert.inference import folder as folder_lib  # pylint: disable=g-import-not-at-top
  # Follows the path once (or takes a caller's resolution); reads no weights.
  resolved = path if isinstance(path, folder_lib.ModelFolder) else folder_lib.resolve(path)
  path, weights_dir, st_settings = resolved.path, resolved.weights, resolved.sentence_transformer
  model_cls = model_cls or jbert.BertModel
  tok = _load_tokenizer(tokenizer, resolved.tokenizer, path)
  if dtype is not None:
    overrides["dtype"] = dtype
  from jbert import weights  # pylint: disable=g-import-not-at-top
  config, params, initialised = weights.load_pretrained_report(weights_dir, model_cls, **overrides)
  if st_settings is not None and st_settings.max_length is not None:
    st_settings = dataclasses.replace(st_settings,
                                      max_length=min(st_settings.max_length, config.max_position_embeddings))
  if tok.vocab_size > config.vocab_size:
    raise ValueError(f"The tokenizer of {path} has {tok.vocab_size} pieces but the model's vocab_size is "
                     f"{config.vocab_size}: they do not belong together; pass the model's own tokenizer.")
  dense_params = None
  if st_settings is not None and st_settings.dense is not None:
    dense_params = read_dense(st_settings.dense, st_settings.dense_dir)
  return LoadedModel(path=path, config=config, params=params, tokenizer=tok, model_cls=model_cls,
                     sentence_transformer=st_settings, label_names=_label_names(weights_dir),
                     initialised=initialised, folder=resolved, dense_params=dense_params)


def is_sentence_transformer(path: str | os.PathLike) -> bool:
  # lexists: a modules.json that is no regular file (a FIFO, a link to a device) is refused by name, not ignored.
  return os.path.lexists(os.path.join(os.fspath(path), "modules.json"))


def read_sentence_transformer(path: str) -> tuple[SentenceTransformerSettings, str]:
  """(settings, folder of the transformer module's weights) of a sentence-transformers folder."""
  modules = _read_json(os.path.join(path, "modules.json"))
  if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
    raise ValueError(f"{path}/modules.json is not a list of modules ({{\"type\": ..., \"path\": ...}}); the folder "
                     "is damaged or not a sentence-transformers model.")
  kinds = {}
  for module in modules:
    kind = str(module.get("type", "")).rsplit(".", 1)[-1]
    if kind not in ST_MODULES:
      raise ValueError(f"{path}/modules.json has a {errors.shorten(str(module.get('type')))} module "
                       f"({errors.preview(module.get('path'))}); jbert "
                       f"reads {', '.join(ST_MODULES[:-1])} and {ST_MODULES[-1]} modules only.")
    if kind in kinds:
      raise ValueError(f"{path}/modules.json has two {kind} modules; jbert reads one of each.")
    if any(ST_MODULES.index(k) > ST_MODULES.index(kind) for k in kinds):
      raise ValueError(f"{path}/modules.json puts its {kind} module after {', '.join(kinds)}; jbert runs them in "
                       f"the order {' -> '.join(ST_MODULES)}.")
    kinds[kind] = os.path.normpath(os.path.join(path, module.get("path", "")))
  if "Transformer" not in kinds:
    raise ValueError(f"{path}/modules.json has no Transformer module; it is not a BERT sentence encoder.")
  transformer_dir = kinds["Transformer"]
  pooling = None  # Without a Pooling module the folder gives token vectors: the caller must choose a pooling.
  if "Pooling" in kinds:
    pooling = _pooling_modes(_read_json(os.path.join(kinds["Pooling"], "config.json")), kinds["Pooling"])
  st_config = {}
  for folder in dict.fromkeys((transformer_dir, os.path.normpath(path))):
    candidate = os.path.join(folder, "sentence_bert_config.json")
    if os.path.lexists(candidate):
      st_config = _read_json(candidate)
      break
  max_length = st_config.get("max_seq_length")
  if max_length is None:
    tok_config = os.path.join(transformer_dir, "tokenizer_config.json")
    limit = _read_json(tok_config).get("model_max_length") if os.path.lexists(tok_config) else None
    max_length = int(limit) if limit is not None and limit < _NO_LIMIT else None
  dense = None
  if "Dense" in kinds:
    if pooling is None:
      raise ValueError(f"{path}/modules.json has a Dense module but no Pooling module before it; jbert projects "
                       "pooled sentence vectors only.")
    dense = _dense(_read_json(os.path.join(kinds["Dense"], "config.json")), kinds["Dense"])
  settings = SentenceTransformerSettings(pooling=pooling, normalize="Normalize" in kinds,
                                         max_length=None if max_length is None else int(max_length),
                                         lowercase=bool(st_config.get("do_lower_case", False)), dense=dense,
                                         dense_dir=kinds.get("Dense"))
  return settings, transformer_dir


def _dense(config: dict[str, Any], folder: str) -> Projection:
  """A Dense module's config.json as a `Projection`; what jbert cannot run is refused by name."""
  if config.get("use_residual"):
    raise ValueError(f"{folder}/config.json asks for use_residual=true; jbert runs Dense modules without a "
                     "residual connection only.")
  name = config.get("activation_function", TORCH_ACTIVATIONS["tanh"]) or TORCH_ACTIVATIONS["identity"]
  activation = DENSE_ACTIVATIONS.get(str(name).rsplit(".", 1)[-1])
  if activation is None:
    raise ValueError(f"{folder}/config.json has activation_function {errors.preview(name)}; jbert runs "
                     f"{', '.join(DENSE_ACTIVATIONS)}.")
  try:
    return Projection(int(config["in_features"]), int(config["out_features"]), bool(config.get("bias", True)),
                      activation)
  except KeyError as e:
    raise ValueError(f"{folder}/config.json lacks {errors.preview(e.args[0])}; it is not a sentence-transformers Dense "
                     "module's config.") from None


def read_dense(projection: Projection, folder: str) -> dict[str, Any]:
  """A Dense module's weights (`linear.weight` [out, in], `linear.bias`) as {"kernel": [in, out], "bias"}."""
  from jbert.weights import hf_io  # pylint: disable=g-import-not-at-top
  state = hf_io.read_state_dict(folder)
  want = {"linear.weight": (projection.out_features, projection.in_features)}
  if projection.bias:
    want["linear.bias"] = (projection.out_features,)
  for name, shape in want.items():
    if name not in state or tuple(state[name].shape) != shape:
      got = "missing" if name not in state else f"of shape {tuple(state[name].shape)}"
      raise ValueError(f"{folder}: the Dense weight {name} is {got}; its config.json asks for {shape}.")
  params = {"kernel": state["linear.weight"].T.copy()}
  if projection.bias:
    params["bias"] = state["linear.bias"]
  return params


def _pooling_modes(config: dict[str, Any], folder: str) -> tuple[str, ...]:
  if "pooling_mode" in config:
    mode = config["pooling_mode"]
    modes = (mode,) if isinstance(mode, str) else tuple(mode)
  else:
    modes = tuple(name for key, name in _LEGACY_POOLING_KEYS.items() if config.get(key))
  unknown = [m for m in modes if m not in ST_POOLING_MODES]
  if unknown or not modes:
    raise ValueError(f"{folder}/config.json asks for pooling {errors.preview(list(modes))}; jbert knows "
                     f"{', '.join(ST_POOLING_MODES)}.")
  if config.get("include_prompt") is False:
    log.warning("%s: include_prompt=false has no effect here: jbert adds no prompts to the texts.", folder)
  return modes


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
