r"""Pretraining input throughput from raw text, per host core: sequences/s at length 128 and 512.

  python bench/data_pipeline.py [--text=botchan.txt --vocab=bert-base-uncased-vocab.txt]  (../shared/data)

The whole pipeline runs in this one process on one core (no grain workers, a single tokenizer thread):
reading, sentence splitting (sentencex), WordPiece tokenisation, instances, masking and batching. The corpus
is re-read and re-split every epoch, as training does. The last line is a JSON object.
"""
import os

os.environ["RAYON_NUM_THREADS"] = "1"  # One tokenizer thread: a per-core number. Must precede the import.

import json  # noqa: E402
import pathlib  # noqa: E402
import time  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from jbert.data import config as data_config  # noqa: E402
from jbert.data import loader  # noqa: E402

_DATA = pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
_TEXT = flags.DEFINE_string("text", str(_DATA / "botchan.txt"), "Plain-text corpus (source=text).")
_VOCAB = flags.DEFINE_string("vocab", str(_DATA / "bert-base-uncased-vocab.txt"), "WordPiece vocab.txt.")
_SEQUENCES = flags.DEFINE_integer("sequences", 4000, "Sequences measured per length after a warm-up batch.")
_BATCH = flags.DEFINE_integer("batch_size", 64, "Rows per batch.")


def throughput(max_seq_length: int, max_predictions: int) -> float:
  cfg = data_config.default_pretrain_config()
  cfg.source, cfg.text_files, cfg.vocab = "text", _TEXT.value, _VOCAB.value
  cfg.max_seq_length, cfg.max_predictions_per_seq = max_seq_length, max_predictions
  cfg.prefetch_groups = 0  # No background thread: the loop below does all the work on this core.
  tokenizer = loader.build_tokenizer(cfg)
  it = loader.make_pretrain_iterator(cfg, tokenizer, global_batch_size=_BATCH.value, seed=0)
  next(it)
  start, n = time.perf_counter(), 0
  while n < _SEQUENCES.value:
    n += len(next(it)["input_ids"])
  return n / (time.perf_counter() - start)


def main(argv):
  del argv
  for path in (_TEXT.value, _VOCAB.value):
    if not os.path.exists(path):
      raise app.UsageError(f"{path} does not exist; pass --text and --vocab.")
  results = {}
  for length, predictions in ((128, 20), (512, 80)):
    results[f"seq_per_sec_per_core_{length}"] = throughput(length, predictions)
    print(f"max_seq_length={length}: {results[f'seq_per_sec_per_core_{length}']:.0f} sequences/s per core")
  print(json.dumps(results))


if __name__ == "__main__":
  app.run(main)
