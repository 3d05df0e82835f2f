"""Multiple choice (SWAG, local files of a context and K endings): `task.py` holds the registered class."""
from jbert.tasks.multiple_choice.task import MultipleChoice

__all__ = ["MultipleChoice"]
