"""DistilBERT (`model_type` distilbert): BERT's post-LN layers under other names (`distilbert.transformer.layer.i`),
no token types, no pooler in the backbone; `pre_classifier` + ReLU on [CLS] before the classifier (jbert's
pooler with a ReLU), its MLM head `vocab_transform` / `vocab_layer_norm` / `vocab_projector`. Its config.json
says `dim`, `n_layers`, `n_heads`, `hidden_dim`, `activation`, `dropout`, `attention_dropout`,
`seq_classif_dropout` (on [CLS]; its token classifier drops out at `dropout`), `qa_dropout` (before
`qa_outputs`); every LayerNorm's epsilon is 1e-12 in transformers' code, whatever the config says.
"""
from jbert.model.families.family import Family, HeadNames, register

_MLM = ("vocab_transform", "vocab_layer_norm", "vocab_projector.bias", "vocab_projector")
_PRE_CLASSIFIER = {"pooler": "pre_classifier"}

DISTILBERT = register(Family(
    model_types=("distilbert",),
    class_prefixes={"distilbert": "DistilBert"},
    prefix="distilbert",
    written=("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
             "hidden_act", "hidden_dropout_prob", "attention_probs_dropout_prob", "max_position_embeddings",
             "initializer_range", "pad_token_id", "classifier_dropout", "qa_dropout"),
    renames={"dim": "hidden_size", "n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
             "hidden_dim": "intermediate_size", "activation": "hidden_act", "dropout": "hidden_dropout_prob",
             "attention_dropout": "attention_probs_dropout_prob", "seq_classif_dropout": "classifier_dropout"},
    # DistilBertConfig's defaults (distilbert-base-uncased).
    defaults={"vocab_size": 30522, "hidden_size": 768, "num_hidden_layers": 6, "num_attention_heads": 12,
              "intermediate_size": 3072, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
              "classifier_dropout": 0.2, "qa_dropout": 0.1},
    # Its token classifier's dropout is `dropout` (hidden_dropout_prob), not seq_classif_dropout.
    fixed={"layer_norm_eps": 1e-12, "use_token_types": False, "use_pooler": False, "pooler_act": "relu",
           "token_dropout": "hidden"},
    # Position embeddings are stored weights whether sinusoidal or learnt; jbert's are always learnt.
    extra={"sinusoidal_pos_embds": False},
    embeddings={"word_embeddings": "embeddings.word_embeddings",
                "position_embeddings": "embeddings.position_embeddings", "norm": "embeddings.LayerNorm"},
    layer="transformer.layer.{i}",
    layer_parts={"query": "attention.q_lin", "key": "attention.k_lin", "value": "attention.v_lin",
                 "out": "attention.out_lin", "attention_norm": "sa_layer_norm", "wi": "ffn.lin1", "wo": "ffn.lin2",
                 "output_norm": "output_layer_norm"},
    heads={
        "BertModel": HeadNames("{}Model"),
        "BertForMaskedLM": HeadNames("{}ForMaskedLM", mlm=_MLM),
        "BertForSequenceClassification": HeadNames("{}ForSequenceClassification", **_PRE_CLASSIFIER),
        "BertForTokenClassification": HeadNames("{}ForTokenClassification"),
        "BertForQuestionAnswering": HeadNames("{}ForQuestionAnswering"),
        "BertForMultipleChoice": HeadNames("{}ForMultipleChoice", **_PRE_CLASSIFIER),
    },
))
