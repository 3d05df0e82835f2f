r"""Phase 2 of BERT pretraining, starting from a phase-1 run, as in the paper's last 10%: longer sequences.

  python run.py --config=configs/phase2.py:base --workdir=DIR2 --config.init_from=DIR1
  python run.py --config=configs/phase2.py:tiny --workdir=/tmp/jbert_tiny_p2 --config.init_from=/tmp/jbert_tiny

The argument picks the phase-1 config (base, large or tiny); everything not set here is that config's.
`init_from` takes the phase-1 workdir: its latest checkpoint's parameters, and with them the architecture, the
tokenizer and the data settings: the corpus and its recipe (NSP, masking) are those that trained the workdir
(`jbert.data.corpus`; a `--config.data.KEY` given here wins, and WORKDIR/history.jsonl records what was taken).
The optimiser restarts with its own warmup. The sequence length is the longest the phase-1
model has positions for: 512 for base and large (the paper's), 128 for the tiny demo, whose model has
max_position_embeddings=128 (configs/tiny.py); `max_predictions_per_seq` keeps BERT's 15% (80 at 512, 20 at 128).
"""
import importlib

from jbert.data import corpus

# Phase-1 config -> (max_seq_length, max_predictions_per_seq, total_steps, warmup_steps, batch_size or None
# to keep phase 1's, remat_policy).
PHASE2 = {
    "base": (512, 80, 100_000, 1_000, 256, "dots_no_batch"),  # 512-token activations dominate memory
    "large": (512, 80, 100_000, 1_000, 256, "dots_no_batch"),
    "tiny": (128, 20, 200, 20, None, "none"),  # a third of the demo's phase 1; a tiny model needs no remat
}


def get_config(arg="base"):
  arg = arg or "base"
  if arg not in PHASE2:
    raise ValueError(f"configs/phase2.py:{arg}: the argument names the phase-1 config, one of {sorted(PHASE2)}.")
  config = importlib.import_module(f"configs.{arg}").get_config()
  seq, predictions, steps, warmup, batch, remat = PHASE2[arg]
  config.data.max_seq_length = seq
  config.data.max_predictions_per_seq = predictions
  config.total_steps = steps
  config.optim.warmup_steps = warmup
  config.batch_size = batch or config.batch_size
  config.model.remat_policy = remat
  corpus.leave_to_init_from(config.data)      # phase 1's corpus and recipe, from init_from's workdir
  return config
