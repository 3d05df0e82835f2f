r"""Look at the pretraining batches a config produces.

  python -m jbert.data --config=configs/tiny.py --show=4      # decoded examples, masks visible
  python -m jbert.data --config=configs/tiny.py --stats       # masking/NSP fractions, speed; last line JSON

In `--show`, a selected position reads `[MASK→cat]` (replaced by [MASK]), `[~dog→cat]` (by a random token) or
`[=cat]` (kept), and segment B follows the first [SEP].
"""
import json
import time

from absl import app
from absl import flags
import numpy as np
from ml_collections import config_flags

from jbert import errors
from jbert.data import loader

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (uses its data, seed and "
                                          "batch_size).", lock_config=True)
_SHOW = flags.DEFINE_integer("show", 0, "Print this many decoded examples.")
_STATS = flags.DEFINE_bool("stats", False, "Measure masking/NSP fractions and sequences/s over --batches.")
_BATCHES = flags.DEFINE_integer("batches", 50, "Batches measured by --stats.")
_SPLIT = flags.DEFINE_enum("split", "train", loader.SPLITS, "Which split to read.")


def unmask(batch: dict[str, np.ndarray]) -> np.ndarray:
  """The input ids before masking."""
  original = batch["input_ids"].copy()
  rows, cols = np.nonzero(batch["masked_lm_weights"])
  original[rows, batch["masked_lm_positions"][rows, cols]] = batch["masked_lm_ids"][rows, cols]
  return original


def render(batch: dict[str, np.ndarray], row: int, tokenizer) -> str:
  """One example as text with its selected positions marked, and its NSP label."""
  n = int(batch["attention_mask"][row].sum())
  tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][row, :n].tolist())
  for pos, orig, weight in zip(batch["masked_lm_positions"][row], batch["masked_lm_ids"][row],
                               batch["masked_lm_weights"][row]):
    if weight:
      now, (was,) = int(batch["input_ids"][row, pos]), tokenizer.convert_ids_to_tokens([int(orig)])
      if now == int(orig):
        tokens[pos] = f"[={was}]"
      elif now == tokenizer.mask_id:
        tokens[pos] = f"[MASK→{was}]"
      else:
        tokens[pos] = f"[~{tokens[pos]}→{was}]"
  label = ("IsNext", "NotNext")[int(batch["next_sentence_labels"][row])]
  return f"{label}: {' '.join(tokens)}"


def measure(batches: list[dict[str, np.ndarray]], tokenizer) -> dict[str, float]:
  """Fractions over `batches`: selected/candidate tokens, the replacement shares, IsNext share."""
  counts = dict(candidates=0, selected=0, mask=0, random=0, kept=0, is_next=0, sequences=0, tokens=0)
  for batch in batches:
    original = unmask(batch)
    weights = batch["masked_lm_weights"].astype(bool)
    now = np.take_along_axis(batch["input_ids"], batch["masked_lm_positions"], axis=1)[weights]
    was = batch["masked_lm_ids"][weights]
    counts["candidates"] += int((~tokenizer.special_mask[original]).sum())
    counts["selected"] += int(weights.sum())
    counts["mask"] += int((now == tokenizer.mask_id).sum())
    counts["kept"] += int((now == was).sum())
    counts["random"] += int(((now != tokenizer.mask_id) & (now != was)).sum())
    counts["is_next"] += int((batch["next_sentence_labels"] == 0).sum())
    counts["sequences"] += len(batch["input_ids"])
    counts["tokens"] += int(batch["attention_mask"].sum())
  selected = max(counts["selected"], 1)
  sequences = counts["sequences"]
  return dict(masked_fraction=counts["selected"] / max(counts["candidates"], 1),
              mask_token_fraction=counts["mask"] / selected,
              random_token_fraction=counts["random"] / selected,
              kept_fraction=counts["kept"] / selected, nsp_positive_fraction=counts["is_next"] / sequences,
              mean_sequence_tokens=counts["tokens"] / sequences, sequences=sequences)


def main(argv):
  with errors.reported("jbert.data"):
    _main(argv)


def _main(argv):
  if len(argv) > 1:
    raise errors.UserError(f"Unexpected arguments: {argv[1:]}")
  if _CONFIG.value is None:
    raise errors.UserError("--config=configs/NAME.py is required.")
  if not (_SHOW.value or _STATS.value):
    raise errors.UserError("Nothing to do: pass --show=N and/or --stats.")
  config = _CONFIG.value
  tokenizer = loader.build_tokenizer(config.data)
  it = loader.make_pretrain_iterator(config.data, tokenizer, global_batch_size=config.batch_size,
                                     seed=config.seed, split=_SPLIT.value)
  first = next(it)
  if _SHOW.value:
    shown, batch = 0, first
    while shown < _SHOW.value:
      for row in range(min(len(batch["input_ids"]), _SHOW.value - shown)):
        print(render(batch, row, tokenizer), end="\n\n")
        shown += 1
      batch = next(it) if shown < _SHOW.value else batch
  if _STATS.value:
    start = time.perf_counter()
    batches = [next(it) for _ in range(_BATCHES.value)]
    elapsed = time.perf_counter() - start
    stats = measure([first, *batches], tokenizer)
    stats["sequences_per_sec"] = sum(len(b["input_ids"]) for b in batches) / elapsed
    for key, value in stats.items():
      print(f"{key:>24}: {value:.4f}")
    print(json.dumps(stats))


if __name__ == "__main__":
  app.run(main)
