r"""BERT-base pretraining, phase 1, with the paper's recipe: sequence 128, batch 256, lr 1e-4, 10k warmup, 1M steps,
MLM+NSP on a prepared corpus (English Wikipedia: docs/pretraining.md, "Pretraining BERT-base on English Wikipedia on
a TPU slice").

  python -m jbert.data prepare --input='gs://BUCKET/wikipedia/*.parquet' --output=gs://BUCKET/wiki --train_vocab=30522
  python run.py --config=configs/base.py --workdir=gs://BUCKET/bert_base --config.data.prepared=gs://BUCKET/wiki

RoBERTa's recipe (no NSP, FULL-SENTENCES, its model type and optimiser): configs/roberta.py.

The vocabulary is the prepared corpus's own (or `--config.data.vocab`). Without `data.prepared` the run says what
to run and stops before anything compiles; `--config.data.source=text|files|tfds` reads other sources directly.

Sections `model`, `data` and `optim` take their defaults (each key documented there) from `jbert.train.architecture`,
`jbert.data.config` and `jbert.train.optim`; this file sets what the recipe fixes. With `init_from`, the architecture
and the tokenizer come from that checkpoint (`jbert.train.architecture`).
"""
import ml_collections

from jbert.train import architecture
from jbert.train import optim
from jbert.runtime import sharding
from jbert.data import config as data_config


PRESETS = ("fast",)


def get_config(arg=None):
  if arg and arg not in PRESETS:
    raise ValueError(f"configs/base.py:{arg}: the argument names a preset, one of {list(PRESETS)}.")
  config = ml_collections.ConfigDict()
  config.seed = 0                             # one seed for initialisation, data order, masks and dropout
  config.batch_size = 256                     # GLOBAL rows of max_seq_length tokens per optimiser step, across
                                              # all processes (data.packing: several short sequences a row)
  config.total_steps = 1_000_000              # optimiser steps; also where the learning rate reaches zero
  config.log_every_steps = 100                # metrics.jsonl, TensorBoard and console cadence
  config.eval_every_steps = 10_000            # held-out MLM/NSP accuracy cadence; 0 disables evaluation
  config.eval_batches = 20                    # global batches in the held-out evaluation
  config.checkpoint_every_steps = 5_000       # Orbax save cadence (plus the last step and on SIGTERM)
  config.max_checkpoints_to_keep = 3          # older steps are deleted once a newer one is complete
  config.async_checkpointing = True           # write checkpoints in the background while training goes on
  config.allow_data_restart = False           # True: a damaged data state restarts the stream, not an older step
  config.init_from = ml_collections.FieldReference(None, field_type=str)  # load_pretrained path for the params
  # Keys (comma-separated, dotted; a section covers its keys) a rerun may change from the config that trained
  # the workdir (WORKDIR/config.json); each change is recorded in WORKDIR/history.jsonl. Cadences, total_steps
  # upward and the mesh need none.
  config.allow_changes = ""

  config.model = architecture.default_config("base")
  if arg == "fast":
    # No attention dropout (MosaicBERT's recipe), so training runs the platform's fused attention kernel (splash
    # on TPU, cuDNN on GPU) instead of the explicit softmax dropout needs; its effect on the demo: docs/performance.md.
    config.model.attention_probs_dropout_prob = 0.0

  config.data = data_config.default_pretrain_config()
  config.data.source = "prepared"             # --config.data.prepared=DIR from `python -m jbert.data prepare`
  config.data.max_seq_length = 128            # max_predictions_per_seq follows masked_lm_prob: 20 at 0.15
  config.data.worker_count = 4

  config.optim = optim.default_config()
  config.optim.learning_rate = 1e-4
  config.optim.warmup_steps = 10_000

  config.mesh = ml_collections.ConfigDict({
      "data": -1,                             # pure data parallelism; -1 takes the devices the others leave
      "fsdp": 1,                              # data parallelism with sharded weights/optimiser state
      "tensor": 1,                            # tensor parallelism over heads/mlp/vocab; divides the head count
      "dcn_data": 1,                          # slices joined over DCN (multi-slice); multiplies the data axis
  })
  # Logical axis name -> mesh axis (or axes, or None). See jbert/runtime/sharding.py for the meaning of each name.
  config.logical_axis_rules = [list(rule) for rule in sharding.DEFAULT_RULES]
  config.lock()
  return config
