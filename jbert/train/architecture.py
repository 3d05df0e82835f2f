"""The `model` section of a training config, and the model and tokenizer a run uses.

Without `init_from`, the architecture is the preset named by `model.preset` with every non-None key overriding
it, and the tokenizer is `data.vocab` (or the demo corpus's generated vocabulary). With `init_from`, both come
from the checkpoint: its config.json / bert_config.json / recorded config and the tokenizer files beside it (a
jbert workdir's copy in `WORKDIR/tokenizer/`); `model` keys that are set still override the runtime and dropout
fields, and an architecture key that disagrees with the checkpoint is refused, since its weights could not load.
"""
from __future__ import annotations

import dataclasses
import glob
import logging
import os

import ml_collections

from jbert import tokenizer as tokenizer_lib
from jbert.model import BertConfig

log = logging.getLogger("jbert")

# Fields that set a weight's shape: a checkpoint fixes them.
SHAPE_FIELDS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
                "max_position_embeddings", "type_vocab_size")
TOKENIZER_DIR = "tokenizer"  # A run's copy of its tokenizer, inside the workdir.


def _optional(field_type):
  return ml_collections.FieldReference(None, field_type=field_type)


def default_config(preset: str | None = "base") -> ml_collections.ConfigDict:
  """A BertConfig preset; every other key, when not None, overrides the preset's (or init_from's) value."""
  return ml_collections.ConfigDict({
      "preset": ml_collections.FieldReference(preset, field_type=str),  # tiny | mini | small | medium | base |
                                              # large; None with init_from: the checkpoint's architecture
      "vocab_size": _optional(int),           # None: the tokenizer's size
      "hidden_size": _optional(int),          # width H
      "num_hidden_layers": _optional(int),    # depth L
      "num_attention_heads": _optional(int),  # heads N; H % N == 0
      "intermediate_size": _optional(int),    # MLP width, 4H in presets
      "max_position_embeddings": _optional(int),  # longest sequence
      "hidden_dropout_prob": _optional(float),  # 0.1 in presets
      "attention_probs_dropout_prob": _optional(float),  # 0.1 in presets
      "classifier_dropout": _optional(float),  # task heads' dropout; None: hidden_dropout_prob
      "hidden_act": _optional(str),           # gelu (erf) | gelu_new (tanh)
      "dtype": "bfloat16",                    # compute dtype; softmax, LayerNorm statistics and losses stay fp32
      "param_dtype": "float32",               # master weights and optimiser state
      "scan_layers": True,                    # nn.scan over layers: compile time independent of depth
      "remat_policy": "none",                 # none | full | dots | dots_no_batch: activation recomputation
      "attention_impl": "auto",               # auto (the platform's fastest exact kernel: splash on TPU, cudnn on
                                              # GPU, xla on CPU) | xla | cudnn | splash | einsum; attention
                                              # dropout in training always takes einsum (no kernel has it)
  })


def bert_config(model_cfg: ml_collections.ConfigDict, vocab_size: int, init_from: str | None = None,
                shape: dict | None = None, *, pad_token_id: int | None = None) -> BertConfig:
  """The run's BertConfig (module docstring); `vocab_size` and `pad_token_id` are the tokenizer's; `shape`: fields
  the task changes in init_from's architecture (`Task.architecture_source`: a distillation student's depth).

  A fresh model takes the preset's sizes and, for every other field, `model.model_type`'s family's values as a
  config.json of that family implies them (RoBERTa: one token type, LayerNorm eps 1e-5, positions from
  pad_token_id + 1); set keys override them, and a family field that contradicts the family is refused."""
  if init_from:
    from jbert import weights  # pylint: disable=g-import-not-at-top  (TF/torch readers only when needed)
    return checkpoint_bert_config(model_cfg, vocab_size, init_from, weights.describe(init_from).config, shape)
  fields = {k: v for k, v in model_cfg.items() if k != "preset" and v is not None}
  if fields.get("vocab_size", vocab_size) < vocab_size:
    raise ValueError(f"config.model.vocab_size={fields['vocab_size']} is smaller than the tokenizer's vocabulary "
                     f"({vocab_size}); set it to None to use the tokenizer's size.")
  fields.setdefault("vocab_size", vocab_size)
  preset = BertConfig.from_preset(model_cfg.preset or "base")
  stated = {"model_type": fields.pop("model_type", preset.model_type),
            **{k: getattr(preset, k) for k in _PRESET_SIZES}}
  if pad_token_id is not None:  # padding is the tokenizer's (RoBERTa's positions skip it)
    stated["pad_token_id"] = pad_token_id
  config_json = {k: fields.pop(k) for k in list(fields) if k in _CONFIG_JSON_FIELDS}
  return BertConfig.from_dict({**stated, **config_json}, **fields)


# What a preset sets; the rest of a fresh model's fields are its family's.
_PRESET_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
# The model keys a family reads as a config.json's (the others are BertConfig fields as they are).
_CONFIG_JSON_FIELDS = (*SHAPE_FIELDS, "hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout",
                       "hidden_act", "layer_norm_eps", "embedding_size")


def checkpoint_bert_config(model_cfg: ml_collections.ConfigDict, vocab_size: int, init_from: str,
                           stored: BertConfig, shape: dict | None = None) -> BertConfig:
  """`bert_config` for a run from `init_from`, whose config `stored` the caller has read (`weights.describe`):
  its architecture (with `shape`'s changes), the config's other model fields on top."""
  fields = {k: v for k, v in model_cfg.items() if k != "preset" and v is not None}
  stored = dataclasses.replace(stored, **(shape or {}))
  clashes = [f for f in SHAPE_FIELDS if f in fields and fields[f] != getattr(stored, f)]
  if clashes:
    what = ", ".join(f"{f}: checkpoint {getattr(stored, f)} vs config {fields[f]}" for f in clashes)
    raise ValueError(f"init_from={init_from} has another architecture ({what}); its weights cannot load into "
                     f"that model. Drop the override(s) ({', '.join('config.model.' + f for f in clashes)}) to "
                     "use the checkpoint's architecture, or use a fresh run without init_from.")
  if vocab_size > stored.vocab_size:
    raise ValueError(f"the tokenizer has {vocab_size} ids but init_from={init_from} has vocab_size="
                     f"{stored.vocab_size}: it was trained with another vocabulary. Leave data.vocab unset to use "
                     "the checkpoint's own tokenizer.")
  return dataclasses.replace(stored, **{k: v for k, v in fields.items() if k not in SHAPE_FIELDS})


def build_tokenizer(data_cfg: ml_collections.ConfigDict, init_from: str | None = None, *,
                    key: str = "init_from") -> tokenizer_lib.Tokenizer:
  """`data.vocab` if set, else init_from's tokenizer, else the generated demo vocabulary (source=synthetic); a
  vocabulary that repeats a token is refused (the ids of its earlier lines would never be trained). `key`: the
  config key that named `init_from` (a distillation's `task.teacher`), as the log line and messages say it."""
  tokenizer = _find_tokenizer(data_cfg, init_from, key)
  tokenizer.check_unique()
  return tokenizer


def _find_tokenizer(data_cfg: ml_collections.ConfigDict, init_from: str | None, key: str) -> tokenizer_lib.Tokenizer:
  if data_cfg.get("vocab"):
    return tokenizer_lib.load_tokenizer(data_cfg.vocab)
  if init_from:
    # A TF1 checkpoint is a prefix: bert_model.ckpt names bert_model.ckpt.index and its data files.
    if "://" not in init_from and not os.path.exists(init_from) and not glob.glob(glob.escape(init_from) + ".*"):
      raise FileNotFoundError(f"init_from={init_from} does not exist; set --config.init_from to a checkpoint (a "
                              "Hugging Face or jbert model dir, a TF1 checkpoint or a training workdir).")
    found = tokenizer_lib.find_tokenizer(init_from)
    if found:
      log.info("tokenizer: %s (from %s)", found, key)
      return tokenizer_lib.load_tokenizer(found)
    if data_cfg.get("source") not in ("synthetic", "prepared"):
      raise ValueError(f"{key}={init_from} has no tokenizer beside it (vocab.txt or *.model); set "
                       "--config.data.vocab to the vocabulary it was trained with.")
  if data_cfg.get("source") in ("synthetic", "prepared"):  # the generated or the prepared corpus's vocabulary
    from jbert.data import loader  # pylint: disable=g-import-not-at-top
    return loader.build_tokenizer(data_cfg)
  raise ValueError("no tokenizer: set --config.data.vocab to a vocab.txt or SentencePiece .model, or "
                   "--config.init_from to a checkpoint that has one beside it.")
