r"""ELECTRA pretraining (Clark et al. 2020, replaced-token detection) with the paper's hyper-parameters (its Table 6):
small | base | large, and tiny, the CPU demo's size on the generated corpus (as configs/tiny.py).

  python run.py --config=configs/electra.py:tiny --workdir=/tmp/electra_tiny
  python -m jbert.data prepare --input='gs://BUCKET/wikipedia/*.parquet' --output=gs://BUCKET/wiki --train_vocab=30522
  python run.py --config=configs/electra.py:small --workdir=gs://BUCKET/electra_small \
      --config.data.prepared=gs://BUCKET/wiki

WORKDIR/export is the discriminator as transformers' ElectraForPreTraining (what one fine-tunes, with
--config.init_from=WORKDIR/export), WORKDIR/export_generator the generator as ElectraForMaskedLM. The loss, the
metrics and the generator's size: jbert/tasks/electra/task.py. Everything else (corpus, packing, resume, sharding) is
pretraining's: configs/base.py.
"""
import ml_collections

from configs import base
from jbert import tasks

# name: (layers, hidden, heads, FFN, embedding_size, generator fraction, peak lr, batch, steps, length, mask rate)
SIZES = {
    "tiny": (2, 128, 2, 512, 128, 0.25, 1e-3, 32, 600, 64, 0.15),
    "small": (12, 256, 4, 1024, 128, 0.25, 5e-4, 128, 1_000_000, 128, 0.15),
    "base": (12, 768, 12, 3072, 768, 1 / 3, 2e-4, 256, 766_000, 512, 0.15),
    "large": (24, 1024, 16, 4096, 1024, 0.25, 2e-4, 2048, 400_000, 512, 0.25),
}


def get_config(arg=None):
  if arg not in SIZES:
    raise ValueError(f"configs/electra.py:{arg}: name a size, one of {list(SIZES)} (e.g. configs/electra.py:small).")
  layers, hidden, heads, ffn, embedding, fraction, lr, batch, steps, length, mask = SIZES[arg]
  config = base.get_config()
  with config.unlocked():
    config.batch_size = batch
    config.total_steps = steps
    config.model.preset = "base"
    config.model.num_hidden_layers = layers
    config.model.hidden_size = hidden
    config.model.num_attention_heads = heads
    config.model.intermediate_size = ffn
    config.model.model_type = "electra"       # its export is transformers' Electra* (jbert/model/families)
    config.model.embedding_size = embedding   # embedding tables' width, projected to hidden_size; shared with
                                              # the generator
    config.model.use_pooler = False           # ELECTRA's encoder has no pooler (its classifier has one)
    config.model.pooler_act = "gelu"          # ELECTRA's classification head: dense + gelu on [CLS]
    config.model.pooler_dropout = True        # ... with dropout before it
    config.model.lm_head_act = "gelu"         # the generator's MLM head activation
    config.model.max_position_embeddings = 512
    config.data.nsp = False                   # replaced-token detection only
    config.data.short_seq_prob = 0.0          # full-length sequences
    config.data.max_seq_length = length
    config.data.masked_lm_prob = mask
    config.data.mask_token_prob = 0.85        # google-research/electra's masking: 85% [MASK], 15% kept, none
    config.data.random_token_prob = 0.0       # random (the generator's samples are the replacements)
    config.optim.learning_rate = lr
    config.optim.warmup_steps = 10_000
    config.optim.b2 = 0.999
    config.optim.eps = 1e-6
    config.optim.weight_decay = 0.01
    config.task = ml_collections.ConfigDict(tasks.config_section("electra_pretraining"))
    config.task.generator_hidden_size = fraction
    if arg == "tiny":
      config.log_every_steps = 50
      config.eval_every_steps = 200
      config.eval_batches = 4
      config.checkpoint_every_steps = 200
      config.model.dtype = "float32"          # CPUs compute bf16 slowly
      config.model.scan_layers = False
      config.model.max_position_embeddings = 128
      config.data.source = "synthetic"
      config.data.vocab = None
      config.data.worker_count = 0            # worker processes only slow a 2-core CPU down
      config.optim.warmup_steps = 60
  config.lock()
  return config
