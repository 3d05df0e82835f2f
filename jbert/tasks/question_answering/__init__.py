"""Extractive question answering (SQuAD v1.1/v2.0, local SQuAD JSON): `task.py` holds the registered class."""
from jbert.tasks.question_answering.task import QuestionAnswering

__all__ = ["QuestionAnswering"]
