"""Tiny vocabulary, texts and random transformers models shared by the inference tests."""
import pathlib

WORDS = ("the a cat dog sat ran on under mat rug big small red blue and or is was of to in it this that paris "
         "france capital city river house tree bird sings quickly slowly happy sad day night sun moon").split()
VOCAB = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", "!", "?", "'"] + WORDS
         + [c for c in "bcdefghijklmnopqrstuvwxyz"] + [f"##{c}" for c in "abcdefghijklmnopqrstuvwxyz"] + ["##ing"])
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             max_position_embeddings=64)
TEXTS = ["the cat sat on the mat.", "", "a big red dog ran quickly under the blue tree and the bird sings!",
         "paris is the capital of france", "cats", "it was a happy day, and a sad night.",
         "zzyzx qwerty", "the " * 30 + "end"]


def write_vocab(folder: pathlib.Path) -> pathlib.Path:
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / "vocab.txt"
  path.write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")
  return path


def random_torch_model(cls_name: str, seed: int = 0, **overrides):
  """A transformers model whose LayerNorms and biases are random too, so no term is trivially 0 or 1."""
  import torch
  import transformers
  torch.manual_seed(seed)
  config = transformers.BertConfig(vocab_size=len(VOCAB), **{**SIZES, **overrides})
  model = getattr(transformers, cls_name)(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        p.add_(0.3 * torch.randn_like(p))
  return model


def hf_tokenizer(vocab_file):
  import transformers
  return transformers.BertTokenizer(vocab=str(vocab_file))
