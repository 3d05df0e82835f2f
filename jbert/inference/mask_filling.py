"""Masked-word prediction: the top-k tokens and probabilities for every `[MASK]` of every text.

`fill_mask(texts, model)` returns, for text i, one list per `[MASK]` (in text order) of `top_k` dicts
`{"score", "token", "token_str", "sequence"}`, best first: what transformers' fill-mask pipeline gives for that
mask (its output for a text with several masks has this shape; for one mask it drops the outer list, which is
kept here so every text reads alike). `sequence` is the text with that one mask filled, written as the pipeline
writes it (special tokens dropped when the text has a single mask, kept otherwise). Only the masked positions
go through the MLM head; softmax and top-k run on the device.
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jbert.inference import loading, runner as runner_lib
from jbert.inference.loading import LoadedModel
from jbert.model import validation
from jbert.tokenizer import Tokenizer, WordPieceTokenizer

MASK = "[MASK]"


def fill_mask(texts: str | Sequence[str], model: LoadedModel | str, top_k: int = 5, *,
              batch_size: int = runner_lib.DEFAULT_BATCH_SIZE, max_length: int | None = None,
              dtype: str | None = None, progress: bool | None = None,
              tokenizer: str | None = None) -> list[list[list[dict[str, Any]]]]:
  """Predictions for every `[MASK]` of every text; see the module docstring for the format.

  Args:
    texts: one text or several, each with at least one literal `[MASK]`.
    model: a checkpoint with masked-LM weights (BertForMaskedLM or BertForPreTraining; any format
      `jbert.load_pretrained` reads) or a `LoadedModel` of one.
    top_k: predictions per mask (at most the vocabulary size).
    max_length: tokens per text including [CLS]/[SEP] (default the model's `max_length`: its positions);
      longer texts are truncated, and a mask cut off by it is an error.
  """
  from jbert.model import BertForMaskedLM, BertForPreTraining  # pylint: disable=g-import-not-at-top
  if isinstance(texts, str):
    texts = [texts]
  texts = list(texts)
  if isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1:
    raise ValueError(f"top_k must be a positive int, got {top_k!r}.")
  if not isinstance(model, LoadedModel):
    model = loading.load_model(model, BertForMaskedLM, tokenizer=tokenizer)
  if model.model_cls not in (BertForMaskedLM, BertForPreTraining):
    raise ValueError(f"fill_mask needs a masked-LM model; {model.path} was loaded as {model.model_cls.__name__}. "
                     "Load it with jbert.inference.load_model(path, jbert.BertForMaskedLM).")
  untrained = [n for n in model.initialised if n.startswith("mlm/")]
  if untrained:
    raise ValueError(f"{model.path} has no masked-LM head (cls.predictions.*), so its predictions would be "
                     "random; fill-mask needs a checkpoint trained with MLM (BertForMaskedLM/BertForPreTraining).")
  config = model.config if dtype is None else model.config.replace(dtype=dtype)
  limit = config.max_length  # RoBERTa's first position_offset rows of the table serve padding
  max_length = limit if max_length is None else max_length
  if not 3 <= max_length <= limit:
    raise ValueError(f"max_length={max_length} must lie in [3, {limit}] ({validation.position_limit(config)}).")
  top_k = min(int(top_k), config.vocab_size)
  tok = model.tokenizer
  features = [_features(tok, text, i, max_length) for i, text in enumerate(texts)]
  if not features:
    return []
  mesh = runner_lib.default_mesh()
  params = model.placed_params(jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  params = {"bert": {k: v for k, v in params["bert"].items() if k != "pooler"}, "mlm": params["mlm"]}
  runner = runner_lib.Runner(_top_k_fn(config, top_k), params, key=("fill_mask", config, top_k),
                             max_length=max_length, vocab_size=config.vocab_size,
                             type_vocab_size=config.type_vocab_size, batch_size=batch_size, mesh=mesh)
  try:
    rows = runner.run(features, progress=progress, desc="fill_mask")
  except runner_lib.NonFiniteOutput as e:
    raise ValueError(f"The predictions for texts {runner_lib.describe_rows(e.rows)} (0-based, in input order) are "
                     f"not finite (NaN or inf): {runner_lib.NON_FINITE_FIX}.") from None
  return [_predictions(tok, f, row) for f, row in zip(features, rows)]


def _features(tok: Tokenizer, text: str, index: int, max_length: int) -> dict[str, list[int]]:
  if not isinstance(text, str):
    raise TypeError(f"Text {index} is a {type(text).__name__}; fill_mask takes strings.")
  own = tok.mask_token  # RoBERTa's and XLM-R's "<mask>"; BERT's [MASK] is taken for it too
  parts = text.replace(own, MASK).split(MASK) if own != MASK else text.split(MASK)
  if len(parts) == 1:
    shown = MASK if own == MASK else f"{MASK} (or {own})"
    raise ValueError(f"Text {index} ({_preview(text)}) has no {shown}; put {MASK} where a word should be "
                     "predicted.")
  ids: list[int] = []
  if tok.parses_special_tokens:  # the tokenizer places the mask as in training (e.g. <mask> taking the space)
    ids = tok.ids(own.join(parts))
  else:  # split at the literal token, which the tokenizer would read as characters
    for i, part in enumerate(parts):
      if i:
        ids.append(tok.mask_id)
      ids.extend(tok.ids(part) if part.strip() else [])
  encoded = tok.build_inputs(ids, None, max_length=max_length)
  positions = [j for j, t in enumerate(encoded["input_ids"]) if t == tok.mask_id]
  if len(positions) != len(parts) - 1:
    raise ValueError(f"Text {index} ({_preview(text)}) is longer than max_length={max_length} tokens and a "
                     f"{MASK} lies beyond it; shorten the text or raise max_length.")
  return {"input_ids": encoded["input_ids"], "token_type_ids": encoded["token_type_ids"], "positions": positions}


def _preview(text: str) -> str:
  return repr(text if len(text) <= 60 else text[:57] + "...")


@functools.lru_cache(maxsize=16)
def _top_k_fn(config, top_k: int):
  from jbert.model import BertForMaskedLM  # pylint: disable=g-import-not-at-top
  model = BertForMaskedLM(config)

  def fn(params, batch):
    out = model.apply({"params": params}, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                      masked_lm_positions=batch["positions"])
    probs = jax.nn.softmax(out.mlm_logits.astype(jnp.float32), axis=-1)  # [B, P, V]
    scores, ids = jax.lax.top_k(probs, top_k)  # [B, P, k]
    return {"scores": scores, "ids": ids}

  return fn


def _predictions(tok: Tokenizer, feature: dict[str, list[int]], row: dict[str, np.ndarray]):
  positions = feature["positions"]
  single = len(positions) == 1
  out = []
  for m, position in enumerate(positions):
    ranked = []
    for score, token in zip(row["scores"][m].tolist(), row["ids"][m].tolist()):
      filled = list(feature["input_ids"])
      filled[position] = token
      ranked.append({"score": float(score), "token": int(token), "token_str": _decode(tok, [token], False),
                     "sequence": _decode(tok, filled, skip_special=single)})
    out.append(ranked)
  return out


# The per-token clean-up of the `tokenizers` WordPiece decoder (`cleanup=True`), which transformers' BERT uses.
_CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _decode(tok: Tokenizer, ids: Sequence[int], skip_special: bool) -> str:
  """Text of ids as transformers' BERT tokenizer decodes it; other tokenizers decode as they do."""
  if not isinstance(tok, WordPieceTokenizer):
    return tok.decode(ids, skip_special_tokens=skip_special)
  if skip_special:
    ids = [i for i in ids if not tok.special_mask[i]]
  pieces = []
  for i, piece in enumerate(tok.convert_ids_to_tokens(ids)):
    if i:
      piece = piece[2:] if piece.startswith("##") else " " + piece
    for dirty, clean in _CLEANUP:
      piece = piece.replace(dirty, clean)
    pieces.append(piece)
  return "".join(pieces)
