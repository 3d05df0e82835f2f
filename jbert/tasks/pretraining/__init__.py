"""BERT's pretraining (masked LM + next-sentence prediction) on the corpus pipeline: `task.py`."""
from jbert.tasks.pretraining.task import Pretraining

__all__ = ["Pretraining"]
