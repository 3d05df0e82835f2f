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
from jbert.inference.embedding import POOLINGS, Embedder, embed
from jbert.inference.mask_filling import fill_mask
from jbert.inference.prediction import Predictor, predict
from jbert.inference.loading import LoadedModel, SentenceTransformerSettings, load_model
from jbert.inference.runner import Runner

__all__ = ["POOLINGS", "Embedder", "LoadedModel", "Predictor", "Runner", "SentenceTransformerSettings", "embed",
           "fill_mask", "load_model", "predict"]
