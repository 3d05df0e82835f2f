"""ModernBERT (`model_type` modernbert; Warner et al. 2024): pre-norm layers without biases, rotary positions,
GeGLU feed-forward, global attention every few layers and a sliding window on the others.

As BertConfig data (`jbert.model.config`'s architecture fields): `pre_norm` (layer 0 takes the embeddings' norm
in place of its attention norm, as transformers builds it; `final_norm` after the last layer), `rope_theta` and
`local_rope_theta` (from `rope_parameters`, or the older `global_rope_theta` / `local_rope_theta`),
`layer_types` (or the older `global_attn_every_n_layers`), `local_attention` (a window of local_attention // 2
tokens each side), `gated_mlp`, the `*_bias` switches, and the prediction head (`head`: dense + activation +
norm) as jbert's pooler with `pooler_norm`, which classification reads from [CLS] or the mean of the tokens
(`classifier_pooling`) and token classification and QA from every token (`token_head`); new weights as
transformers initialises them (`initializer_cutoff_factor`, `scaled_init`). Weights: `model.` is the backbone,
Wqkv is query, key and value end to end, Wi the GeGLU's input and gate end to end.
"""
from __future__ import annotations

from typing import Any, Mapping

from jbert.model.families.family import Family, HeadNames, register

# ModernBertConfig's default rotary bases: global layers, sliding-window layers.
GLOBAL_THETA, LOCAL_THETA = 160_000.0, 10_000.0
_HEAD = {"pooler": "head.dense", "pooler_norm": "head.norm"}


def _rope_theta(config_json: Mapping[str, Any], layer_type: str, old_key: str, default: float) -> float:
  params = (config_json.get("rope_parameters") or {}).get(layer_type) or {}
  kind = params.get("rope_type", "default")
  if kind != "default" or config_json.get("rope_scaling"):
    raise ValueError(f"ModernBERT's rope_parameters[{layer_type!r}] asks for rope_type={kind!r} (or "
                     "rope_scaling is set); jbert computes the default rotary embedding only.")
  return float(params.get("rope_theta", config_json.get(old_key, default)))


def _read(config_json: Mapping[str, Any]) -> dict[str, Any]:
  layers = config_json.get("num_hidden_layers", 22)
  layer_types = config_json.get("layer_types")
  if layer_types is None:  # transformers 4's key: a global layer every n, starting with the first
    every = config_json.get("global_attn_every_n_layers", 3)
    layer_types = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
  return {"layer_types": tuple(layer_types),
          "rope_theta": _rope_theta(config_json, "full_attention", "global_rope_theta", GLOBAL_THETA),
          "local_rope_theta": _rope_theta(config_json, "sliding_attention", "local_rope_theta", LOCAL_THETA)}


def _write(fields: Mapping[str, Any]) -> dict[str, Any]:
  out = {"layer_types": list(fields["layer_types"]),
         "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": fields["rope_theta"]},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": fields["local_rope_theta"]}},
         # What transformers 4 (and sentence-transformers on it) reads instead of rope_parameters.
         "global_rope_theta": fields["rope_theta"], "local_rope_theta": fields["local_rope_theta"]}
  types = fields["layer_types"]
  every = next((n for n in range(1, len(types) + 1) if all(
      (t == "full_attention") == (i % n == 0) for i, t in enumerate(types))), None)
  if every is not None:
    out["global_attn_every_n_layers"] = every
  return out


MODERNBERT = register(Family(
    model_types=("modernbert",),
    class_prefixes={"modernbert": "ModernBert"},
    prefix="model",
    written=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
             "layer_norm_eps", "initializer_range", "pad_token_id", "classifier_dropout", "local_attention",
             "attention_bias", "mlp_bias", "norm_bias", "head_bias", "decoder_bias", "pooler_act", "pooling",
             "initializer_cutoff_factor"),
    renames={"hidden_activation": "hidden_act", "norm_eps": "layer_norm_eps", "mlp_dropout": "hidden_dropout_prob",
             "attention_dropout": "attention_probs_dropout_prob", "classifier_bias": "head_bias",
             "classifier_activation": "pooler_act", "classifier_pooling": "pooling"},
    # ModernBertConfig's defaults (ModernBERT-base), for a config.json that leaves them out.
    defaults={"vocab_size": 50368, "hidden_size": 768, "num_hidden_layers": 22, "num_attention_heads": 12,
              "intermediate_size": 1152, "hidden_act": "gelu", "max_position_embeddings": 8192,
              "layer_norm_eps": 1e-5, "initializer_range": 0.02, "pad_token_id": 50283, "hidden_dropout_prob": 0.0,
              "attention_probs_dropout_prob": 0.0, "classifier_dropout": 0.0, "local_attention": 128,
              "attention_bias": False, "mlp_bias": False, "norm_bias": False, "head_bias": False,
              "decoder_bias": True, "pooler_act": "gelu", "pooling": "cls", "initializer_cutoff_factor": 2.0},
    fixed={"pre_norm": True, "gated_mlp": True, "use_token_types": False, "use_pooler": False,
           "pooler_norm": True, "token_head": True, "pooler_dropout": False, "scaled_init": True},
    # The MLM head is the same prediction head as classification's: its activation is classifier_activation.
    derived=lambda fields: {"lm_head_act": fields.get("pooler_act", "gelu"),
                            "rope_theta": fields.get("rope_theta") or GLOBAL_THETA,
                            "local_rope_theta": fields.get("local_rope_theta") or LOCAL_THETA},
    read=_read,
    write=_write,
    extra={"embedding_dropout": 0.0, "tie_word_embeddings": True},
    embeddings={"word_embeddings": "embeddings.tok_embeddings", "norm": "embeddings.norm"},
    layer="layers.{i}",
    layer_parts={"qkv": "attn.Wqkv", "out": "attn.Wo", "attention_norm": "attn_norm", "wi": "mlp.Wi",
                 "wo": "mlp.Wo", "mlp_norm": "mlp_norm"},
    final_norm="final_norm",
    heads={
        "BertModel": HeadNames("{}Model"),
        "BertForMaskedLM": HeadNames("{}ForMaskedLM", mlm=("head.dense", "head.norm", "decoder.bias", "decoder")),
        "BertForSequenceClassification": HeadNames("{}ForSequenceClassification", **_HEAD),
        "BertForTokenClassification": HeadNames("{}ForTokenClassification", **_HEAD),
        "BertForQuestionAnswering": HeadNames("{}ForQuestionAnswering", linear={"qa_outputs": "classifier"},
                                              **_HEAD),
        "BertForMultipleChoice": HeadNames("{}ForMultipleChoice", **_HEAD),
    },
))
