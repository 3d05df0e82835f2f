"""Sequence classification and regression (GLUE, local CSV/TSV/JSONL files): `task.py` holds the
registered class."""
from jbert.tasks.classification.task import SequenceClassification

__all__ = ["SequenceClassification"]
