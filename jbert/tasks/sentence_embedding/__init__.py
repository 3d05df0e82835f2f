"""Bi-encoders (sentence-transformers' training objectives): the registered tasks (`task.py`), the encoder a run
trains and its config keys (`encoder.py`), the losses over pooled embeddings (`losses.py`) and the evaluation
metrics (`metrics.py`)."""
from jbert.tasks.sentence_embedding.task import SentenceEmbedding

__all__ = ["SentenceEmbedding"]
