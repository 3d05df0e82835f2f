r"""A tiny BERT pretrained offline on CPU in a few minutes on a generated corpus: the README's demo.

  python run.py --config=configs/tiny.py --workdir=/tmp/jbert_tiny
  python run.py --config=configs/tiny.py:fast --workdir=/tmp/jbert_tiny_fast   # without attention dropout
"""
from configs import base


def get_config(arg=None):
  config = base.get_config(arg)
  config.batch_size = 32
  config.total_steps = 600
  config.log_every_steps = 50
  config.eval_every_steps = 200
  config.eval_batches = 4
  config.checkpoint_every_steps = 200
  config.model.preset = "tiny"
  config.model.dtype = "float32"              # CPUs compute bf16 slowly
  config.model.scan_layers = False
  config.model.max_position_embeddings = 128
  config.data.source = "synthetic"
  config.data.vocab = None
  config.data.worker_count = 0                # worker processes only slow a 2-core CPU down
  config.data.max_seq_length = 64
  config.data.max_predictions_per_seq = 10
  config.optim.learning_rate = 1e-3
  config.optim.warmup_steps = 60
  return config
