r"""Phase 2 (sequence 512) of BERT pretraining, starting from a phase-1 checkpoint, as in the paper's last 10%.

  python run.py --config=configs/phase2.py:base --workdir=DIR2 --config.init_from=DIR1

The argument picks the phase-1 config (base or large). `init_from` takes the phase-1 workdir (its latest
checkpoint's parameters; the optimiser restarts with its own warmup).
"""
import importlib


def get_config(arg="base"):
  config = importlib.import_module(f"configs.{arg or 'base'}").get_config()
  config.total_steps = 100_000
  config.data.max_seq_length = 512
  config.data.max_predictions_per_seq = 80
  config.batch_size = 256
  config.optim.warmup_steps = 1_000
  config.model.remat_policy = "dots_no_batch"  # 512-token activations dominate memory
  return config
