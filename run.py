r"""Pretrain BERT: `python run.py --config=configs/base.py --workdir=DIR [--config.KEY=VALUE ...]`.

Running the same command again resumes from the latest checkpoint in DIR/checkpoints.
"""
import logging
import sys

from absl import app
from absl import flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics.jsonl and TensorBoard logs.")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0 (CPU multi-process).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Processes taking part (found on TPU VMs).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (found on TPU VMs).")
flags.mark_flags_as_required(["config", "workdir"])


def parse_flags(argv):
  """absl parsing, with unknown or mistyped `--config.KEY=VALUE` overrides reported in one line."""
  try:
    return flags.FLAGS(argv)
  except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as e:
    message = " ".join(str(e).replace("\\n", " ").replace("\\", "").split()).strip("'\"")
    sys.exit(f"run.py: invalid config override ({message}). Keys: python -c \"from configs import base; "
             f"print(base.get_config())\"")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  from jbert import distributed  # pylint: disable=g-import-not-at-top  (JAX must not start before flags parse)
  distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
  logging.getLogger("jbert").setLevel(logging.INFO)
  logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every file it writes at INFO.
  from jbert import train  # pylint: disable=g-import-not-at-top
  train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
