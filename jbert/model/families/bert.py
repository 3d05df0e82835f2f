"""BERT (`model_type` bert): the family jbert's layers and parameter names follow."""
from jbert.model.families.family import (BERT_EMBEDDINGS, BERT_LAYER, BERT_LAYER_PARTS, BERT_WRITTEN, Family,
                                         HeadNames, register)

_MLM = ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm", "cls.predictions.bias",
        "cls.predictions.decoder")
_POOLER = {"pooler": "pooler.dense", "pooler_in_backbone": True}

BERT = register(Family(
    model_types=("bert",),
    class_prefixes={"bert": "Bert"},
    prefix="bert",
    written=BERT_WRITTEN,
    embeddings=BERT_EMBEDDINGS,
    layer=BERT_LAYER,
    layer_parts=BERT_LAYER_PARTS,
    heads={
        "BertModel": HeadNames("{}Model", **_POOLER),
        "BertForPreTraining": HeadNames("{}ForPreTraining", mlm=_MLM, **_POOLER),
        "BertForMaskedLM": HeadNames("{}ForMaskedLM", mlm=_MLM),
        "BertForSequenceClassification": HeadNames("{}ForSequenceClassification", **_POOLER),
        "BertForTokenClassification": HeadNames("{}ForTokenClassification"),
        "BertForQuestionAnswering": HeadNames("{}ForQuestionAnswering"),
        "BertForMultipleChoice": HeadNames("{}ForMultipleChoice", **_POOLER),
    },
))
