r"""Fine-tune a BERT checkpoint on a task with the BERT paper's recipe: sequence 128, batch 32, lr 2e-5, 3 epochs,
10% warmup then linear decay, dropout 0.1, weight decay 0.01.

  python run.py --config=configs/finetune.py:TASK --workdir=DIR --config.init_from=CHECKPOINT

TASK: a GLUE task (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli), squad / squad_v2 (TFDS, or SQuAD JSON
files through task.train_file and task.eval_file), conll2003 (NER), swag or hellaswag (multiple choice),
`cross_encoder` (a re-ranker on scored or 0/1-labelled pairs, `jbert/tasks/cross_encoder/task.py`: task.text_a,
task.text_b, task.label, task.loss=bce|mse; its export/ loads in sentence-transformers' CrossEncoder), or `local`
for your own labelled files:

  python run.py --config=configs/finetune.py:local --workdir=DIR --config.init_from=CHECKPOINT \
      --config.task.train_file=train.csv --config.task.eval_file=dev.csv --config.task.text_a=sentence \
      --config.task.label=label --config.task.label_names=neg,pos

conll2003 and swag also read local files (--config.task.train_file/eval_file/test_file): CoNLL columns or JSONL
`tokens`/`tags` for NER, JSONL `context`/`endings`/`label` or SWAG's CSV for multiple choice (`local` with
--config.task.kind=ner|multiple_choice does the same with your own tag set).

CHECKPOINT is any checkpoint `jbert.load_pretrained` reads (a Hugging Face dir, a TF1 checkpoint, a jbert model
dir or a pretraining workdir); the architecture and the tokenizer come from it.

The keys, each commented, are in `jbert/train/finetune_config.py`, so that an installed jbert (`python -m
jbert.glue`, or Python callers) builds the same config without this checkout. Sections `model` and `optim` take
their defaults (each key documented there) from `jbert.train.architecture` and `jbert.train.optim`.
"""
from jbert.train.finetune_config import get_config  # noqa: F401  (run.py calls get_config)
