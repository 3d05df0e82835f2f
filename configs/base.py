r"""BERT-base pretraining, phase 1, with the paper's recipe: sequence 128, batch 256, lr 1e-4, 10k warmup, 1M steps,
MLM+NSP on English Wikipedia from TFDS.

  python run.py --config=configs/base.py --workdir=gs://BUCKET/bert_base

Sections `data` and `optim` take their defaults (each key documented there) from `jbert.data.config` and
`jbert.optim`; this file sets what the recipe fixes.
"""
import ml_collections

from jbert import optim
from jbert import sharding
from jbert.data import config as data_config


def model_config(preset: str) -> ml_collections.ConfigDict:
  """A BertConfig preset; every other key, when not None, overrides the preset's value."""
  return ml_collections.ConfigDict({
      "preset": preset,                       # tiny | mini | small | medium | base | large
      "vocab_size": ml_collections.FieldReference(None, field_type=int),  # None: the tokenizer's size
      "hidden_size": ml_collections.FieldReference(None, field_type=int),  # width H
      "num_hidden_layers": ml_collections.FieldReference(None, field_type=int),  # depth L
      "num_attention_heads": ml_collections.FieldReference(None, field_type=int),  # heads N; H % N == 0
      "intermediate_size": ml_collections.FieldReference(None, field_type=int),  # MLP width, 4H in presets
      "max_position_embeddings": ml_collections.FieldReference(None, field_type=int),  # longest sequence
      "hidden_dropout_prob": ml_collections.FieldReference(None, field_type=float),  # 0.1 in presets
      "attention_probs_dropout_prob": ml_collections.FieldReference(None, field_type=float),  # 0.1 in presets
      "hidden_act": ml_collections.FieldReference(None, field_type=str),  # gelu (erf) | gelu_new (tanh)
      "dtype": "bfloat16",                    # compute dtype; softmax, LayerNorm statistics and losses stay fp32
      "param_dtype": "float32",               # master weights and optimiser state
      "scan_layers": True,                    # nn.scan over layers: compile time independent of depth
      "remat_policy": "none",                 # none | full | dots | dots_no_batch: activation recomputation
      "attention_impl": "xla",                # xla (jax.nn.dot_product_attention) | cudnn | einsum
  })


def get_config(arg=None):
  del arg
  config = ml_collections.ConfigDict()
  config.seed = 0                             # one seed for initialisation, data order, masks and dropout
  config.batch_size = 256                     # GLOBAL sequences per optimiser step, across all processes
  config.total_steps = 1_000_000              # optimiser steps; also where the learning rate reaches zero
  config.log_every_steps = 100                # metrics.jsonl, TensorBoard and console cadence
  config.eval_every_steps = 10_000            # held-out MLM/NSP accuracy cadence; 0 disables evaluation
  config.eval_batches = 20                    # global batches in the held-out evaluation
  config.checkpoint_every_steps = 5_000       # Orbax save cadence (plus the last step and on SIGTERM)
  config.max_checkpoints_to_keep = 3          # older steps are deleted once a newer one is complete
  config.async_checkpointing = True           # write checkpoints in the background while training goes on
  config.init_from = ml_collections.FieldReference(None, field_type=str)  # load_pretrained path for the params

  config.model = model_config("base")

  config.data = data_config.default_pretrain_config()
  config.data.source = "tfds"
  config.data.tfds_name = "wikipedia/20230601.en"
  config.data.max_seq_length = 128
  config.data.max_predictions_per_seq = 20
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
  # Logical axis name -> mesh axis (or axes, or None). See jbert/sharding.py for the meaning of each name.
  config.logical_axis_rules = [list(rule) for rule in sharding.DEFAULT_RULES]
  config.lock()
  return config
