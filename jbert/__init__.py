"""jbert: BERT in JAX/Flax for TPU pod slices.

Public names are resolved lazily so that `import jbert` stays cheap (no JAX, TensorFlow or torch until used) and
a tool that needs only the tokenizer does not pay for the model. The model classes are those of the head
registry (`jbert.model.registry.heads()`).
"""
import importlib

from jbert.runtime import platforms as _platforms
from jbert.runtime import storage as _storage
from jbert.version import __version__

# Before any storage client is imported: an emulator named by STORAGE_EMULATOR_HOST reaches every client.
_storage.configure()
# Before JAX starts a backend: libtpu on a machine without TPU chips stays unloaded (jbert.runtime.platforms).
_platforms.skip_absent_tpu()

_EXPORTS = {
    "BertConfig": "jbert.model",
    "load_pretrained": "jbert.weights",
    "save_pretrained": "jbert.weights",
    "describe": "jbert.weights",
    "load_tokenizer": "jbert.tokenizer",
    "embed": "jbert.inference",
    "fill_mask": "jbert.inference",
    "predict": "jbert.inference",
    "enable_compile_cache": "jbert.runtime.compile_cache",
}


def _model_classes() -> dict[str, type]:
  registry = importlib.import_module("jbert.model.registry")
  return {head.architecture: head.cls for head in registry.heads()}


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  if name[:1].isupper():  # a model class: BertModel, BertFor..., SentenceEncoder
    classes = _model_classes()
    if name in classes:
      return classes[name]
  if name == "__all__":
    return sorted([*_EXPORTS, *_model_classes()])
  raise AttributeError(f"module 'jbert' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS) | set(_model_classes()))
