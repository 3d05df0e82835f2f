"""Token classification (CoNLL NER, local tagged files): the softmax tagger (`task.py`) and its variant with a
linear-chain CRF over the tags, `task.crf=true` (`crf.py`)."""
from jbert.tasks.token_classification.task import TokenClassification
from jbert.tasks.token_classification.crf import CRFTokenClassification

__all__ = ["CRFTokenClassification", "TokenClassification"]
