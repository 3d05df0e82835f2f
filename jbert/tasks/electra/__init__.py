"""ELECTRA's replaced-token detection on pretraining's batches, a generator beside the discriminator: `task.py`."""
from jbert.tasks.electra.task import ReplacedTokenDetection

__all__ = ["ReplacedTokenDetection"]
