"""RoBERTa and the models built on its code (`model_type` roberta, xlm-roberta, camembert).

BERT's layers and weight names under `roberta.`, with fairseq's positions (counted from pad_token_id + 1 over the
non-padding tokens, so the table has pad_token_id + 1 more rows than the longest input), one token type, its LM
head (dense, gelu, LayerNorm, tied decoder + bias under `lm_head`) and its classification head (dropout, dense +
tanh on `<s>`, dropout, `out_proj`): jbert's pooler and classifier, read from `classifier.dense` and
`classifier.out_proj`. Multiple choice keeps BERT's pooler under `roberta.pooler`.
"""
from jbert.model.families.family import (BERT_EMBEDDINGS, BERT_LAYER, BERT_LAYER_PARTS, BERT_WRITTEN, Family,
                                         HeadNames, register)

_MLM = ("lm_head.dense", "lm_head.layer_norm", "lm_head.bias", "lm_head.decoder")

ROBERTA = register(Family(
    model_types=("roberta", "xlm-roberta", "camembert"),
    class_prefixes={"roberta": "Roberta", "xlm-roberta": "XLMRoberta", "camembert": "Camembert"},
    prefix="roberta",
    written=BERT_WRITTEN,
    embeddings=BERT_EMBEDDINGS,
    layer=BERT_LAYER,
    layer_parts=BERT_LAYER_PARTS,
    # roberta-base's values, for a config.json that leaves them out.
    defaults={"vocab_size": 50265, "max_position_embeddings": 514, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
              "pad_token_id": 1},
    fixed={"pooler_act": "tanh", "pooler_dropout": True, "lm_head_act": "gelu"},
    derived=lambda fields: {"position_offset": fields.get("pad_token_id", 1) + 1},
    heads={
        "BertModel": HeadNames("{}Model", pooler="pooler.dense", pooler_in_backbone=True),
        "BertForMaskedLM": HeadNames("{}ForMaskedLM", mlm=_MLM),
        "BertForSequenceClassification": HeadNames("{}ForSequenceClassification", pooler="classifier.dense",
                                             linear={"classifier": "classifier.out_proj"}),
        "BertForTokenClassification": HeadNames("{}ForTokenClassification"),
        "BertForQuestionAnswering": HeadNames("{}ForQuestionAnswering"),
        "BertForMultipleChoice": HeadNames("{}ForMultipleChoice", pooler="pooler.dense", pooler_in_backbone=True),
    },
))
