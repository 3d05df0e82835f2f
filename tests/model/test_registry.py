"""The head registry: each head module registers its classes, and every public name of `jbert` resolves."""
import flax.linen as nn
import pytest

import jbert
from jbert.model import registry


def test_every_head_is_registered_once_by_its_own_module():
  assert [(h.architecture, h.key) for h in registry.heads()] == [
      ("BertModel", "base"), ("BertForPreTraining", "pretraining"), ("BertForMaskedLM", "masked_lm"),
      ("BertForSequenceClassification", "sequence_classification"),
      ("BertForTokenClassification", "token_classification"), ("BertForQuestionAnswering", "question_answering"),
      ("BertForMultipleChoice", "multiple_choice"), ("SentenceEncoder", "sentence_encoder"),
      ("BertForReplacedTokenDetection", "replaced_token_detection")]
  assert [h.has_mlm for h in registry.heads()] == [False, True, True, False, False, False, False, False, False]
  assert registry.by_architecture(["Unknown", "BertForMaskedLM"]).cls is jbert.BertForMaskedLM
  assert registry.by_key("multiple_choice").dummy_shape == (1, 2, 8)
  with pytest.raises(ValueError, match=r"unknown head 'tagger'; one of base, pretraining, "):
    registry.by_key("tagger")


def test_every_public_name_resolves():
  """`jbert.SentenceEncoder` was listed in `__all__` but raised AttributeError."""
  assert "SentenceEncoder" in jbert.__all__
  assert {name: getattr(jbert, name) is not None for name in jbert.__all__} == dict.fromkeys(jbert.__all__, True)
  assert jbert.SentenceEncoder is jbert.model.SentenceEncoder
  with pytest.raises(AttributeError, match="has no attribute 'SentenceEncoders'"):
    jbert.SentenceEncoders  # pylint: disable=pointless-statement


def test_a_new_head_module_registers_itself_and_a_clash_is_refused():
  @registry.register("crf_tagger", pooler=False, linear_weights=(registry.HeadWeight("classifier", ("classifier",),
                                                                                     "C"),), outputs=("logits",))
  class BertForCrfTagging(nn.Module):  # pylint: disable=unused-variable
    pass

  try:
    head = registry.by_architecture(["BertForCrfTagging"])
    assert (head.key, head.labelled, head.model_kwargs(5)) == ("crf_tagger", True, {"num_labels": 5})
    assert "crf_tagger" in registry.keys()
    with pytest.raises(ValueError, match=r"head Other \(crf_tagger\): .*BertForCrfTagging is registered with the "
                                         "same key"):
      registry.register("crf_tagger", pooler=False)(type("Other", (nn.Module,), {}))
  finally:
    registry._HEADS.pop(BertForCrfTagging)  # pylint: disable=protected-access
  assert "crf_tagger" not in registry.keys()
