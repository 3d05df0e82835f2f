"""Inference: model outputs as features, sentence embeddings, fill-mask, fine-tuned heads' predictions, and the
batch runner beneath them.

  loading       any model folder (sentence-transformers included) -> LoadedModel
  text          texts / pairs -> BERT features, truncated and counted
  runner        length-sorted, bucketed, data-parallel batches with a process-wide executable cache
  embedding     pooled (and normalised) embeddings, hidden-layer features: `embed`
  mask_filling  top-k predictions for every [MASK]: `fill_mask`
  prediction    labels, values, answers, tags or endings of fine-tuned models: `predict`, `Predictor`
  io            txt / JSONL / CSV / TSV inputs; .npy and JSONL outputs written atomically
  progress      the stderr progress line
  cli           flags shared by the commands `python -m jbert.embed` / `jbert.fill_mask` / `jbert.predict`
"""
import importlib

# Resolved on first use, so that `python -m jbert.embed` does not import what only prediction needs (every task
# module, grain, ml_collections: ~0.3 s of each command's start on docs/performance.md's 2-core host).
_EXPORTS = {
    "POOLINGS": "jbert.inference.embedding",
    "Embedder": "jbert.inference.embedding",
    "embed": "jbert.inference.embedding",
    "fill_mask": "jbert.inference.mask_filling",
    "Predictor": "jbert.inference.prediction",
    "predict": "jbert.inference.prediction",
    "LoadedModel": "jbert.inference.loading",
    "SentenceTransformerSettings": "jbert.inference.loading",
    "load_model": "jbert.inference.loading",
    "Runner": "jbert.inference.runner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name in _EXPORTS:
    return getattr(importlib.import_module(_EXPORTS[name]), name)
  raise AttributeError(f"module 'jbert.inference' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS))
