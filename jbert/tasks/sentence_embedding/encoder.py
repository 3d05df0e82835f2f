"""The encoder a bi-encoder run trains (`jbert.tasks.sentence_embedding`): the `task` keys of its config section and
`init_from`'s sentence-transformers modules (Pooling, Dense, Normalize, max_seq_length) that those keys keep or
override."""
from __future__ import annotations

import dataclasses

import ml_collections

from jbert.weights import st_folder
from jbert.model import pooling as pooling_lib
from jbert.model.sentence import ACTIVATIONS, Projection, pooled_width

# The default column names of each objective (the names sentence-transformers' datasets use).
_COLUMNS = {"sts_cosine": ("sentence1", "sentence2", None, "score"),
            "nli_softmax": ("premise", "hypothesis", None, "label"),
            "mnrl": ("anchor", "positive", None, None), "triplet": ("anchor", "positive", "negative", None)}


def _optional(field_type, default=None):
  return ml_collections.FieldReference(default, field_type=field_type)


def config_section(kind: str) -> dict:
  """The `task` keys of `configs/finetune.py:KIND` for a bi-encoder objective."""
  a, b, c, label = _COLUMNS[kind]
  section = {
      "train_file": _optional(str),           # training rows: CSV, TSV (unquoted) or JSONL, by suffix
      "eval_file": _optional(str),            # evaluation rows, scored as task.eval_kind says
      "text_a": _optional(str, a),            # column of the first text (the anchor)
      "text_b": _optional(str, b),            # column of the second text (the pair's other side, the positive)
      "text_c": _optional(str, c),            # column of a negative (mnrl: optional hard negatives)
      "label": _optional(str, label),         # column of the score (sts_cosine, eval_kind=scored) or the class
      "score_range": "0,1",                   # LOW,HIGH of the scores, mapped to [0, 1] (STS-B: 0,5)
      "eval_kind": "",                        # scored | classes | retrieval | triplet; "": the objective's own
      # The encoder; None keeps init_from's sentence-transformers modules (else mean pooling, no Dense/Normalize).
      "pooling": _optional(str),              # comma-separated: cls, mean, max, mean_sqrt_len_tokens, weightedmean,
                                              # lasttoken (concatenated, over the last layer)
      "normalize": _optional(bool),           # unit-length embeddings (a Normalize module)
      "dense_features": _optional(int),       # a Dense projection to this width (0: none)
      "dense_activation": _optional(str),     # its activation: tanh (default) | identity | relu | gelu | sigmoid
      # The export's max_seq_length (sentence_bert_config.json: what sentence-transformers and jbert.embed
      # truncate to); None: the longer of init_from's (a sentence-transformers folder) and data.max_seq_length.
      "export_max_seq_length": _optional(int),
  }
  if kind == "nli_softmax":
    section["label_names"] = "entailment,neutral,contradiction"  # classes in id order (integer labels: ids)
  if kind == "mnrl":
    section["scale"] = 20.0                   # cosine similarities times this before the softmax (1/temperature)
    section["symmetric"] = False              # also rank the anchors for each positive (symmetric loss)
  if kind == "triplet":
    section["margin"] = 5.0                   # euclidean margin between |a - n| and |a - p|
  return section


@dataclasses.dataclass(frozen=True)
class Encoder:
  """The SentenceEncoder a run trains, before the BertConfig fixes the pooled width; `init_dense`: init_from's
  Dense module (Projection, folder) whose weights start the projection when it is the same."""
  pooling: tuple[str, ...] = ("mean",)
  normalize: bool = False
  dense_features: int | None = None
  dense_activation: str = "tanh"
  dense_bias: bool = True
  init_dense: tuple[Projection, str] | None = None
  init_max_length: int | None = None  # init_from's sentence-transformers max_seq_length

  def projection(self, bert_config) -> Projection | None:
    if not self.dense_features:
      return None
    return Projection(pooled_width(bert_config, self.pooling, None, "concat"), self.dense_features,
                      self.dense_bias, self.dense_activation)


def encoder_from_config(cfg, init_from: str | None) -> Encoder:
  """task.pooling / normalize / dense_* over init_from's sentence-transformers modules (when it is such a folder)."""
  st = None
  if init_from and st_folder.is_sentence_transformer(init_from):
    st, _ = st_folder.read_sentence_transformer(init_from)
  pooling = tuple(p.strip() for p in cfg.pooling.split(",") if p.strip()) if cfg.pooling else (
      st.pooling if st is not None and st.pooling else ("mean",))
  unknown = [p for p in pooling if p not in pooling_lib.ST_MODES]
  if unknown or not pooling:
    raise ValueError(f"task.pooling={cfg.pooling!r}: use one or more of {', '.join(pooling_lib.ST_MODES)} "
                     "(comma-separated); a sentence-transformers folder has no other Pooling modes.")
  normalize = cfg.normalize if cfg.normalize is not None else bool(st is not None and st.normalize)
  inherited = st.dense if st is not None and cfg.dense_features is None else None
  features = inherited.out_features if inherited else (cfg.dense_features or None)
  if cfg.dense_features is not None and cfg.dense_features < 0:
    raise ValueError(f"task.dense_features={cfg.dense_features} must be a width > 0, or 0 for no projection.")
  activation = cfg.dense_activation or (inherited.activation if inherited else "tanh")
  if activation not in ACTIVATIONS:
    raise ValueError(f"task.dense_activation={activation!r}: use one of {', '.join(ACTIVATIONS)}.")
  init_dense = (st.dense, st.dense_dir) if st is not None and st.dense is not None else None
  return Encoder(pooling, bool(normalize), features, activation, inherited.bias if inherited else True, init_dense,
                 st.max_length if st is not None else None)
