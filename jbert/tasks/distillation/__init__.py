"""Distillation: a student of a fine-tuned sequence classifier (`task.py`), the teacher's outputs computed once
and cached (`teacher_cache.py`)."""
from jbert.tasks.distillation.task import Distillation

__all__ = ["Distillation"]
