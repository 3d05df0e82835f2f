"""Fine-tuning inputs: task registry, features for GLUE / SQuAD / CoNLL-2003 / local files, eval batching."""
from jbert.data.finetune.batching import eval_batches
from jbert.data.finetune.batching import num_eval_batches
from jbert.data.finetune.glue import classification_features
from jbert.data.finetune.glue import classification_metrics
from jbert.data.finetune.local import read_examples
from jbert.data.finetune.ner import IGNORE_INDEX
from jbert.data.finetune.ner import entity_scores
from jbert.data.finetune.ner import ner_features
from jbert.data.finetune.ner import word_predictions
from jbert.data.finetune.squad import spans_to_answers
from jbert.data.finetune.squad import squad_features
from jbert.data.finetune.squad import squad_metrics
from jbert.data.finetune.squad import squad_references
from jbert.data.finetune.tasks import TASKS
from jbert.data.finetune.tasks import Task
from jbert.data.finetune.tasks import get_task
from jbert.data.finetune.tasks import local_task
