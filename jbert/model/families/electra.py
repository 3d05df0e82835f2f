"""ELECTRA (`model_type` electra): BERT's layers under `electra.`, embeddings of `embedding_size` projected to
the hidden size by `embeddings_project` when they differ, no pooler in the backbone. Heads: the discriminator
(`ElectraForPreTraining`: dense, hidden_act, one logit per token), the generator (`ElectraForMaskedLM`: dense to
the embedding size, gelu, LayerNorm, tied decoder + bias), and classification (dropout, dense + gelu on [CLS],
dropout, `out_proj`) and multiple choice (`sequence_summary`: the same pooler) as jbert's pooler + classifier.
"""
from jbert.model.families.family import (BERT_EMBEDDINGS, BERT_LAYER, BERT_LAYER_PARTS, BERT_WRITTEN, Family,
                                         HeadNames, register)

ELECTRA = register(Family(
    model_types=("electra",),
    class_prefixes={"electra": "Electra"},
    prefix="electra",
    written=BERT_WRITTEN + ("embedding_size",),
    embeddings=BERT_EMBEDDINGS,
    layer=BERT_LAYER,
    layer_parts=BERT_LAYER_PARTS,
    # ElectraConfig's defaults (electra-small), for a config.json that leaves them out.
    defaults={"embedding_size": 128, "hidden_size": 256, "num_attention_heads": 4, "intermediate_size": 1024},
    fixed={"use_pooler": False, "pooler_act": "gelu", "pooler_dropout": True, "lm_head_act": "gelu"},
    # How transformers' ElectraForMultipleChoice summarises [CLS]: jbert's pooler.
    extra={"summary_type": "first", "summary_use_proj": True, "summary_activation": "gelu",
           "summary_last_dropout": 0.1},
    heads={
        "BertModel": HeadNames("{}Model"),
        "BertForReplacedTokenDetection": HeadNames("{}ForPreTraining"),
        "BertForMaskedLM": HeadNames("{}ForMaskedLM", mlm=("generator_predictions.dense", "generator_predictions.LayerNorm",
                                                     "generator_lm_head.bias", "generator_lm_head")),
        "BertForSequenceClassification": HeadNames("{}ForSequenceClassification", pooler="classifier.dense",
                                             linear={"classifier": "classifier.out_proj"}),
        "BertForTokenClassification": HeadNames("{}ForTokenClassification"),
        "BertForQuestionAnswering": HeadNames("{}ForQuestionAnswering"),
        "BertForMultipleChoice": HeadNames("{}ForMultipleChoice", pooler="sequence_summary.summary"),
    },
))
