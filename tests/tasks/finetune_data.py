"""Tiny checkpoints, vocabularies and generated tasks for fine-tuning tests (no downloads, seconds to build)."""
from __future__ import annotations

import csv
import pathlib
import sys

import jax
import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
  sys.path.insert(0, str(REPO))

SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
WORDS = tuple(f"w{i}" for i in range(40))


def write_vocab(directory: pathlib.Path, words=WORDS) -> pathlib.Path:
  directory.mkdir(parents=True, exist_ok=True)
  path = directory / "vocab.txt"
  path.write_text("\n".join((*SPECIALS, ".", *words)) + "\n", encoding="utf-8")
  return path


def tiny_checkpoint(directory: pathlib.Path, words=WORDS, seed: int = 0) -> pathlib.Path:
  """A randomly initialised tiny BERT saved as a Hugging Face directory with its vocab.txt, as users have."""
  import jbert  # pylint: disable=import-outside-toplevel
  from jbert.model import init_params  # pylint: disable=import-outside-toplevel
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  vocab = write_vocab(directory, words)
  config = jbert.BertConfig(vocab_size=len(vocab.read_text().split()), hidden_size=64, num_hidden_layers=2,
                            num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)
  params = nn.meta.unbox(init_params(jbert.BertForPreTraining(config), jax.random.key(seed)))
  jbert.save_pretrained(config, params, directory, jbert.BertForPreTraining)
  return directory


def tiny_head(head_cls, *, layers: int, length: int, **kwargs):
  """(model, params): `head_cls` on a dropout-free BERT of vocabulary 64, width 32 and `layers` layers, initialised
  with seed 1; for known-value and packed-against-unpacked checks of the heads."""
  import jbert  # pylint: disable=import-outside-toplevel
  from jbert.model import init_params  # pylint: disable=import-outside-toplevel
  import flax.linen as nn  # pylint: disable=import-outside-toplevel
  config = jbert.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=layers, num_attention_heads=4,
                            intermediate_size=64, max_position_embeddings=length, hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)
  model = head_cls(config, **kwargs)
  return model, nn.meta.unbox(init_params(model, jax.random.key(1)))


def context_examples(n: int, seed: int) -> list[dict]:
  """Pairs whose label needs both segments: it is 1 when segment a holds w0 AND segment b holds w31 (a holds w0
  or w1, b holds w30 or w31, among filler words). Half the pairs are positive."""
  rng = np.random.default_rng(seed)
  rows = []
  for i in range(n):
    positive = i % 2 == 0
    a_key, b_key = (0, 31) if positive else [(0, 30), (1, 31), (1, 30)][int(rng.integers(3))]
    a = [f"w{a_key}", *(f"w{j}" for j in rng.choice(np.arange(10, 30), 2, replace=False))]
    b = [f"w{b_key}", *(f"w{j}" for j in rng.choice(np.arange(10, 30), 2, replace=False))]
    rng.shuffle(a)
    rng.shuffle(b)
    rows.append({"a": " ".join(a), "b": " ".join(b), "label": ("no", "yes")[int(positive)]})
  return rows


def write_rows(path: pathlib.Path, rows: list[dict], fields=("a", "b", "label")) -> pathlib.Path:
  path.parent.mkdir(parents=True, exist_ok=True)
  delimiter = "\t" if path.suffix == ".tsv" else ","
  with path.open("w", encoding="utf-8", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(fields), delimiter=delimiter, extrasaction="ignore",
                            quoting=csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL)
    writer.writeheader()
    writer.writerows(rows)
  return path


def finetune_config(task: str = "local", **overrides):
  """configs/finetune.py:TASK at a size that compiles and trains in seconds on 8 simulated CPU devices."""
  from configs import finetune  # pylint: disable=import-outside-toplevel
  config = finetune.get_config(task)
  config.batch_size = 32
  config.log_every_steps = 10
  config.checkpoint_every_steps = 100
  config.model.scan_layers = False
  config.data.max_seq_length = 16
  config.update_from_flattened_dict(overrides)  # dotted keys; an unknown one raises
  return config


def local_overrides(directory: pathlib.Path, n_train: int = 2000, n_eval: int = 200, **more) -> dict:
  train = write_rows(directory / "train.csv", context_examples(n_train, seed=1))
  dev = write_rows(directory / "dev.csv", context_examples(n_eval, seed=2))
  return {"task.train_file": str(train), "task.eval_file": str(dev), "task.text_a": "a", "task.text_b": "b",
          "task.label": "label", "task.label_names": "no,yes", **more}


def varied_length_features(n, seed=0, choices=None, T=32):
  """Rows of 3..T tokens (ids are the row index, so batches can be traced back), labels 0..n-1; [N, C, T] with
  `choices`."""
  rng = np.random.default_rng(seed)
  shape = (n, T) if choices is None else (n, choices, T)
  lengths = rng.integers(3, T + 1, shape[:-1])
  mask = (np.arange(T) < lengths[..., None]).astype(np.int32)
  ids = mask * (np.arange(n) % 60 + 5).reshape((n,) + (1,) * (len(shape) - 1))
  return {"input_ids": ids.astype(np.int32), "token_type_ids": np.zeros(shape, np.int32), "attention_mask": mask,
          "label": np.arange(n, dtype=np.int32)}
