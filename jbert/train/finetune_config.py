"""The fine-tuning config: the BERT paper's recipe (sequence 128, batch 32, lr 2e-5, 3 epochs, 10% warmup then
linear decay, dropout 0.1, weight decay 0.01) with a task's `task` section and its departures from the recipe.

`configs/finetune.py:TASK` is this `get_config(TASK)` (run.py's users read its docstring for the tasks); it lives
in the package so that commands installed without the checkout (`python -m jbert.glue`) and Python callers build
the same config: `train_and_evaluate(finetune_config.get_config("sst2"), workdir)` after setting `init_from`.
Sections `model` and `optim` take their defaults (each key documented there) from `jbert.train.architecture`
and `jbert.train.optim`; the `task` keys are documented where their task declares them.
"""
import ml_collections

from jbert import tasks
from jbert.runtime import sharding
from jbert.train import architecture
from jbert.train import optim


def _optional(field_type):
  return ml_collections.FieldReference(None, field_type=field_type)


def get_config(arg="sst2"):
  config = ml_collections.ConfigDict()
  config.seed = 0                             # initialisation of new heads, data order and dropout
  config.batch_size = 32                      # GLOBAL sequences per optimiser step, across all processes
  config.eval_batch_size = _optional(int)     # sequences per evaluation batch; None: batch_size
  config.total_steps = _optional(int)         # optimiser steps; None: num_epochs over the training set
  config.num_epochs = 3.0                     # passes over the training set when total_steps is None
  config.log_every_steps = 50                 # metrics.jsonl, TensorBoard and console cadence
  config.eval_every_steps = 0                 # dev-set evaluation cadence; 0: only after the last step
  config.checkpoint_every_steps = 1_000       # Orbax save cadence (plus the last step and on SIGTERM)
  config.max_checkpoints_to_keep = 1          # older steps are deleted once a newer one is complete
  config.async_checkpointing = True           # write checkpoints in the background while training goes on
  config.init_from = _optional(str)           # the checkpoint to fine-tune (architecture and tokenizer too)
  config.keep_best = _optional(str)           # an eval metric (accuracy; validation_matched/accuracy for several
                                              # splits): its best step's params are exported; None: the last's
  config.keep_best_mode = _optional(str)      # max | min; None: min for losses, max for the rest
  config.allow_data_restart = False           # True: a damaged data state restarts the stream, not an older step
  # Keys (comma-separated, dotted; a section covers its keys) a rerun may change from the config that trained
  # the workdir (WORKDIR/config.json); each change is recorded in WORKDIR/history.jsonl. Cadences, total_steps
  # upward and the mesh need none.
  config.allow_changes = ""

  # The task's own keys (`jbert.tasks.config_section`: data files and columns, or SQuAD's window settings).
  config.task = ml_collections.ConfigDict(tasks.config_section(arg or "sst2"))

  config.model = architecture.default_config(preset=None)
  config.model.dtype = "float32"              # fine-tuning is short; TPUs still multiply in bf16 passes
  config.model.scan_layers = ml_collections.FieldReference(None, field_type=bool)  # None: unrolled on CPU,
                                              # scanned on TPU/GPU, as the workdir's checkpoints on a rerun

  config.data = ml_collections.ConfigDict({
      "max_seq_length": 128,                  # tokens per example, [CLS] and [SEP]s included
      "vocab": _optional(str),                # vocab.txt / *.model; None: init_from's tokenizer
      "num_shards": 0,                        # data shards (0: one per process); fix it to keep the global
                                              # batches, and exact resume, across process counts
      "bucketing": True,                      # batches of rows of similar length, cut to a few bucket lengths
                                              # (jbert/data/streams.py; not SQuAD's windows); False: every
                                              # batch padded to max_seq_length. Packed tasks ignore it
      "packing": True,                        # each batch's examples laid end to end in rows of max_seq_length
                                              # tokens, each attending to itself only (jbert/data/packing.py):
                                              # the same examples per step and per-example losses, almost no
                                              # padding. Classification, regression, cross-encoder, NER,
                                              # multiple choice (rows of C x max_seq_length: an example's
                                              # endings side by side), bi-encoder training; SQuAD says so
                                              # and keeps its windows
      "max_sequences_per_row": 0,             # packing: examples a row holds at most; unless set, one per 8
                                              # tokens of max_seq_length (8 at 64, 16 at 128)
  })
  config.data.max_sequences_per_row = (-(-config.data.get_ref("max_seq_length") // 8)).to_int()

  config.optim = optim.default_config()
  config.optim.learning_rate = 2e-5
  config.optim.warmup_steps = None            # None: warmup_fraction (10%) of total_steps

  config.mesh = ml_collections.ConfigDict({
      "data": -1,                             # pure data parallelism; -1 takes the devices the others leave
      "fsdp": 1,                              # data parallelism with sharded weights/optimiser state
      "tensor": 1,                            # tensor parallelism over heads/mlp/vocab; divides the head count
      "dcn_data": 1,                          # slices joined over DCN (multi-slice); multiplies the data axis
  })
  # Logical axis name -> mesh axis (or axes, or None). See jbert/runtime/sharding.py for the meaning of each name.
  config.logical_axis_rules = [list(rule) for rule in sharding.DEFAULT_RULES]

  named = tasks.TASKS.datasets().get(config.task.name)
  for key, value in (named.recipe if named else {}).items():  # the dataset's departures from the recipe
    target, *path = config, *key.split(".")
    for part in path[:-1]:
      target = target[part]
    target[path[-1]] = value
  config.lock()
  return config
