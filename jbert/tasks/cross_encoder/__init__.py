"""Cross-encoders: sentence-transformers' re-rankers, a sequence classifier over (query, document) pairs scored
or labelled 0/1 (`task.py`)."""
from jbert.tasks.cross_encoder.task import CrossEncoder

__all__ = ["CrossEncoder"]
