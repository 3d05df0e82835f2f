"""jbert: BERT in JAX/Flax for TPU pod slices.

Public names are resolved lazily so that `import jbert` stays cheap (no TensorFlow, no torch) and a tool that
needs only the tokenizer does not pay for the model.
"""
import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "BertConfig": "jbert.model",
    "BertModel": "jbert.model",
    "BertForPreTraining": "jbert.model",
    "BertForMaskedLM": "jbert.model",
    "BertForSequenceClassification": "jbert.model",
    "BertForTokenClassification": "jbert.model",
    "BertForQuestionAnswering": "jbert.model",
    "BertForMultipleChoice": "jbert.model",
    "load_pretrained": "jbert.weights",
    "save_pretrained": "jbert.weights",
    "load_tokenizer": "jbert.tokenizer",
    "embed": "jbert.inference",
    "fill_mask": "jbert.inference",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f"module 'jbert' has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + __all__)
