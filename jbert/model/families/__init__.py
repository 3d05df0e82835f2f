"""The families of BERT's relatives jbert computes (transformers' `model_type`s), each one module that registers
itself: bert, roberta (with xlm-roberta and camembert), distilbert, electra, modernbert.

A family is data (`family.Family`): how its config.json reads into BertConfig fields, the fields it implies, its
heads' transformers classes and weight names. The layers read the BertConfig fields; nothing else switches on a
model_type. Adding a family is one module here and its import below.
"""
from __future__ import annotations

# Each module registers its family; the import order is the order errors list them.
from jbert.model.families import bert, roberta, distilbert, electra, modernbert  # noqa: F401
from jbert.model.families.family import Family, HeadNames, architectures, model_types, of, register

__all__ = ["Family", "HeadNames", "register", "of", "model_types", "architectures"]
