"""Tiny fine-tuning runs: a generated vocabulary and `configs/finetune.py` shrunk to a CPU-second model."""
import itertools
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from configs import finetune  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
# The families' featurisation tests' tokenizers (fixtures).
from tests.tasks.tokenizers import family_folder, tiny_tokenizer, tokenizer  # noqa: E402,F401  pylint: disable=unused-import

# Two-letter words ("ba", "be", ...) are whole WordPiece tokens; "##s" makes "bas" two pieces.
WORDS = tuple(c + v for c, v in itertools.product("bdfgklmnprst", "aeiou"))
MARKERS = ("per", "loc", "org")
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


def write_vocab(path: pathlib.Path) -> str:
  path.write_text("\n".join((*SPECIALS, *MARKERS, *WORDS, "##s", ".")) + "\n", encoding="utf-8")
  return str(path)


@pytest.fixture(scope="session")
def vocab_file(tmp_path_factory):
  return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")


def tiny_settings(vocab: str, **overrides) -> dict:
  """Dotted config keys that shrink `configs/finetune.py` to a 2-layer, 64-wide model, sequence 32 and fast
  optimiser settings, then `overrides`; the same dict gives `--config.KEY=VALUE` flags for run.py."""
  return {
      "model.preset": "tiny", "model.hidden_size": 64, "model.num_hidden_layers": 2,
      "model.num_attention_heads": 2, "model.intermediate_size": 128, "model.max_position_embeddings": 64,
      "model.scan_layers": False, "data.vocab": vocab, "data.max_seq_length": 32, "batch_size": 16,
      "total_steps": 20, "log_every_steps": 5, "checkpoint_every_steps": 0, "async_checkpointing": False,
      "optim.learning_rate": 1e-3, "optim.warmup_steps": 0, **overrides}


def tiny_config(task: str, vocab: str, **overrides):
  """`configs/finetune.py:TASK` with `tiny_settings`."""
  config = finetune.get_config(task)
  config.update_from_flattened_dict(tiny_settings(vocab, **overrides))
  return config


@pytest.fixture
def make_config(vocab_file):
  """tiny_config with the generated vocabulary."""
  return lambda task, **overrides: tiny_config(task, vocab_file, **overrides)


@pytest.fixture
def hf_twin(tmp_path):
  """(jbert params, transformers model) with the same random weights: jbert's init with every LayerNorm and bias
  perturbed (so no term is trivially 0 or 1), written by `jbert.save_pretrained`, read by `from_pretrained`."""
  import flax.linen as nn
  import jax
  import numpy as np

  import jbert
  from jbert.model import init_params

  def build(model, hf_cls):
    params = jax.device_get(nn.meta.unbox(init_params(model, jax.random.key(0))))
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: x + 0.3 * rng.standard_normal(x.shape).astype(x.dtype)
        if path[-1].key in ("bias", "scale") else x, params)
    jbert.save_pretrained(model.config, params, tmp_path / "twin", type(model))
    return params, hf_cls.from_pretrained(tmp_path / "twin", attn_implementation="eager").eval()
  return build
