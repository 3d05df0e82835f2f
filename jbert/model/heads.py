"""Pretraining and task heads on top of BertModel (the submodule `bert`).

Which heads keep the pooler follows transformers, so Hugging Face checkpoints map with no missing or
unexpected weights. Head logits are returned in float32 whatever the compute dtype, for stable losses.
"""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from jbert.model import layers, registry
from jbert.model.registry import HeadWeight
from jbert.model.config import BertConfig
from jbert.model.encoder import BertModel
from jbert.model.outputs import ClassifierOutput, MaskedLMOutput, PreTrainingOutput, QuestionAnsweringOutput
from jbert.model.validation import validate_inputs, validate_masked_positions

Array = jax.Array


def _gather(x: Array, positions: Array | None) -> Array:
  """x: [B, T, H], positions: [B, P] -> [B, P, H]; all of x when positions is None."""
  if positions is None:
    return x
  return jnp.take_along_axis(x, positions[..., None], axis=1)


def head_dropout(config: BertConfig, per_token: bool = False) -> layers.Dropout:
  """The dropout before a classifier: `classifier_dropout`, else hidden_dropout_prob; `per_token` (token
  classification) hidden_dropout_prob where the family's `token_dropout` says so (DistilBERT reads its `dropout`
  there, its `seq_classif_dropout` on [CLS])."""
  rate = config.classifier_dropout
  if rate is None or (per_token and config.token_dropout == "hidden"):
    rate = config.hidden_dropout_prob
  return layers.Dropout(rate)


class MlmHead(nn.Module):
  """dense (to the embedding width; biased unless `head_bias` is False) + `lm_head_act` (default hidden_act) +
  LayerNorm, then the decoder tied to the word embeddings, plus `output_bias` (unless `decoder_bias` is False)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x: Array, decode: Callable[[Array], Array]) -> Array:
    """x: [B, P, H]; decode: the word embedding's `attend` ([..., H] -> [..., V]). Returns [B, P, V]."""
    c = self.config
    h = layers.dense(c, c.embedding_width, ("embed", layers.TRANSFORM), "transform", use_bias=c.head_bias,
                     role="out")(x)
    h = layers.layer_norm(c, "norm")(layers.activation(c.lm_head_act or c.hidden_act)(h))
    logits = decode(h).astype(jnp.float32)  # [B, P, V]
    if c.decoder_bias:
      bias = self.param("output_bias", layers.zeros_init(("vocab",)), (c.vocab_size,), jnp.dtype(c.param_dtype))
      logits = logits + bias.astype(jnp.float32)
    return nn.with_logical_constraint(logits, (layers.BATCH, layers.LENGTH, "activation_vocab"))


_CLASSIFIER = (HeadWeight("classifier", ("classifier",), "C"),)


def classifier_layer(config: BertConfig, features: int, name: str) -> nn.DenseGeneral:
  return layers.dense(config, features, ("embed", None), name, role="final")


@registry.register("pretraining", pooler=True, linear_weights=(HeadWeight("cls.seq_relationship", ("nsp",), 2),),
                   outputs=("mlm_logits", "nsp_logits"))
class BertForPreTraining(nn.Module):
  """Masked LM + next sentence prediction."""
  config: BertConfig

  def setup(self):
    self.bert = BertModel(self.config, add_pooling_layer=True)
    self.mlm = MlmHead(self.config)
    self.nsp = classifier_layer(self.config, 2, "nsp")

  def __call__(self, input_ids, token_type_ids=None, attention_mask=None, deterministic: bool = True,
               masked_lm_positions=None, output_hidden_states: bool = False,
               output_attentions: bool = False, *, segment_ids=None, position_ids=None,
               cls_positions=None) -> PreTrainingOutput:
    """masked_lm_positions: optional int [B, P]; the MLM head then runs on those positions only. Packed rows
    (`BertModel`): segment_ids, position_ids [B, T]; cls_positions [B, K] gives NSP logits [B, K, 2], one per
    sequence."""
    out = self.bert(input_ids, token_type_ids, attention_mask, deterministic,  # Validates input_ids first.
                    output_hidden_states, output_attentions, segment_ids=segment_ids, position_ids=position_ids,
                    cls_positions=cls_positions)
    if masked_lm_positions is not None:
      validate_masked_positions(input_ids, masked_lm_positions)
    mlm_logits = self.mlm(_gather(out.last_hidden_state, masked_lm_positions),
                          self.bert.embeddings.word_embeddings.attend)
    nsp_logits = self.nsp(out.pooled_output).astype(jnp.float32)  # [B, 2] or [B, K, 2]
    return PreTrainingOutput(last_hidden_state=out.last_hidden_state, pooled_output=out.pooled_output,
                             mlm_logits=mlm_logits, nsp_logits=nsp_logits, hidden_states=out.hidden_states,
                             attentions=out.attentions)


@registry.register("masked_lm", pooler=False, outputs=("mlm_logits",))
class BertForMaskedLM(nn.Module):
  """Masked LM only (no pooler)."""
  config: BertConfig

  def setup(self):
    self.bert = BertModel(self.config, add_pooling_layer=False)
    self.mlm = MlmHead(self.config)

  def __call__(self, input_ids, token_type_ids=None, attention_mask=None, deterministic: bool = True,
               masked_lm_positions=None, output_hidden_states: bool = False,
               output_attentions: bool = False, *, segment_ids=None, position_ids=None) -> MaskedLMOutput:
    out = self.bert(input_ids, token_type_ids, attention_mask, deterministic,  # Validates input_ids first.
                    output_hidden_states, output_attentions, segment_ids=segment_ids, position_ids=position_ids)
    if masked_lm_positions is not None:
      validate_masked_positions(input_ids, masked_lm_positions)
    mlm_logits = self.mlm(_gather(out.last_hidden_state, masked_lm_positions),
                          self.bert.embeddings.word_embeddings.attend)
    return MaskedLMOutput(last_hidden_state=out.last_hidden_state, mlm_logits=mlm_logits,
                          hidden_states=out.hidden_states, attentions=out.attentions)


@registry.register("sequence_classification", pooler=True, linear_weights=_CLASSIFIER, outputs=("logits",))
class BertForSequenceClassification(nn.Module):
  """Classifier on the pooled [CLS]: logits [B, num_labels] (num_labels=1: a regression score); with packed rows
  and cls_positions [B, K] (`BertModel`), logits [B, K, num_labels], one per sequence."""
  config: BertConfig
  num_labels: int = 2

  @nn.compact
  def __call__(self, input_ids, token_type_ids=None, attention_mask=None, deterministic: bool = True,
               output_hidden_states: bool = False, output_attentions: bool = False, *, segment_ids=None,
               position_ids=None, cls_positions=None) -> ClassifierOutput:
    out = BertModel(self.config, add_pooling_layer=True, pooler_dropout=self.config.pooler_dropout, name="bert")(
        input_ids, token_type_ids, attention_mask, deterministic, output_hidden_states, output_attentions,
        segment_ids=segment_ids, position_ids=position_ids, cls_positions=cls_positions)
    pooled = head_dropout(self.config)(out.pooled_output, deterministic=deterministic)
    logits = classifier_layer(self.config, self.num_labels, "classifier")(pooled).astype(jnp.float32)
    return ClassifierOutput(last_hidden_state=out.last_hidden_state, logits=logits,
                            pooled_output=out.pooled_output, hidden_states=out.hidden_states,
                            attentions=out.attentions)


def token_states(config: BertConfig, input_ids, token_type_ids, attention_mask, deterministic, output_hidden_states,
                 output_attentions, segment_ids, position_ids):
  """(what a per-token head reads [B, T, H], BertModel's output): the last hidden state, or with `token_head`
  (ModernBERT) each token through the pooler's dense, activation and norm."""
  bert = BertModel(config, add_pooling_layer=config.token_head, name="bert")
  out = bert(input_ids, token_type_ids, attention_mask, deterministic, output_hidden_states, output_attentions,
             segment_ids=segment_ids, position_ids=position_ids)
  return (bert.transform(out.last_hidden_state) if config.token_head else out.last_hidden_state), out


@registry.register("token_classification", pooler=False, linear_weights=_CLASSIFIER, outputs=("logits",))
class BertForTokenClassification(nn.Module):
  """Per-token classifier (no pooler): logits [B, T, num_labels]."""
  config: BertConfig
  num_labels: int = 2

  @nn.compact
  def __call__(self, input_ids, token_type_ids=None, attention_mask=None, deterministic: bool = True,
               output_hidden_states: bool = False, output_attentions: bool = False, *, segment_ids=None,
               position_ids=None) -> ClassifierOutput:
    x, out = token_states(self.config, input_ids, token_type_ids, attention_mask, deterministic,
                          output_hidden_states, output_attentions, segment_ids, position_ids)
    x = head_dropout(self.config, per_token=True)(x, deterministic=deterministic)
    logits = classifier_layer(self.config, self.num_labels, "classifier")(x).astype(jnp.float32)
    return ClassifierOutput(last_hidden_state=out.last_hidden_state, logits=logits,
                            hidden_states=out.hidden_states, attentions=out.attentions)


@registry.register("question_answering", pooler=False, num_labels=2,
                   linear_weights=(HeadWeight("qa_outputs", ("qa_outputs",), 2),),
                   outputs=("start_logits", "end_logits"))
class BertForQuestionAnswering(nn.Module):
  """Span extraction (no pooler): start_logits and end_logits [B, T]."""
  config: BertConfig
  num_labels: int = 2  # Start and end; kept for a uniform constructor.

  @nn.compact
  def __call__(self, input_ids, token_type_ids=None, attention_mask=None, deterministic: bool = True,
               output_hidden_states: bool = False, output_attentions: bool = False, *, segment_ids=None,
               position_ids=None) -> QuestionAnsweringOutput:
    if self.num_labels != 2:
      raise ValueError(f"BertForQuestionAnswering needs num_labels=2 (start, end), got {self.num_labels}.")
    x, out = token_states(self.config, input_ids, token_type_ids, attention_mask, deterministic,
                          output_hidden_states, output_attentions, segment_ids, position_ids)
    # transformers' BERT applies no dropout before qa_outputs, DistilBERT its qa_dropout (ModernBERT's
    # classifier_dropout is 0 by default).
    x = layers.Dropout(self.config.qa_dropout or 0.0)(x, deterministic=deterministic)
    logits = classifier_layer(self.config, 2, "qa_outputs")(x).astype(jnp.float32)
    return QuestionAnsweringOutput(last_hidden_state=out.last_hidden_state, start_logits=logits[..., 0],
                                   end_logits=logits[..., 1], hidden_states=out.hidden_states,
                                   attentions=out.attentions)


@registry.register("multiple_choice", pooler=True, num_labels=1,
                   linear_weights=(HeadWeight("classifier", ("classifier",), 1),), dummy_shape=(1, 2, 8),
                   outputs=("logits",))
class BertForMultipleChoice(nn.Module):
  """Scores C choices: inputs [B, C, T] -> logits [B, C]."""
  config: BertConfig
  num_labels: int = 1  # One score per choice; kept for a uniform constructor.

  @nn.compact
  def __call__(self, input_ids, token_type_ids=None, attention_mask=None, deterministic: bool = True,
               output_hidden_states: bool = False, output_attentions: bool = False, *, segment_ids=None,
               position_ids=None, cls_positions=None) -> ClassifierOutput:
    """segment_ids, position_ids: [B, C, T] like input_ids (packed choice rows: the score reads the [CLS] at
    position 0 of each). With `cls_positions` [R, K] the inputs are packed rows [R, L] instead, every ending a
    segment of its own (an example's endings side by side): logits [R, K], one score per [CLS]."""
    if self.num_labels != 1:
      raise ValueError(f"BertForMultipleChoice scores each choice once: num_labels must be 1, got "
                       f"{self.num_labels}.")
    if cls_positions is not None:
      out = BertModel(self.config, add_pooling_layer=True, name="bert")(
          input_ids, token_type_ids, attention_mask, deterministic, output_hidden_states, output_attentions,
          segment_ids=segment_ids, position_ids=position_ids, cls_positions=cls_positions)
      pooled = head_dropout(self.config)(out.pooled_output, deterministic=deterministic)  # [R, K, H]
      logits = classifier_layer(self.config, 1, "classifier")(pooled).astype(jnp.float32)    # [R, K, 1]
      return ClassifierOutput(last_hidden_state=out.last_hidden_state, logits=logits[..., 0],
                              pooled_output=out.pooled_output, hidden_states=out.hidden_states,
                              attentions=out.attentions)
    validate_inputs(self.config, input_ids, token_type_ids, attention_mask, multiple_choice=True,
                    segment_ids=segment_ids, position_ids=position_ids)
    b, n_choices, t = input_ids.shape

    def flat(x):  # [B, C, T] -> [B*C, T]
      return None if x is None else x.reshape(b * n_choices, t)

    out = BertModel(self.config, add_pooling_layer=True, name="bert")(
        flat(input_ids), flat(token_type_ids), flat(attention_mask), deterministic, output_hidden_states,
        output_attentions, segment_ids=flat(segment_ids), position_ids=flat(position_ids))
    pooled = head_dropout(self.config)(out.pooled_output, deterministic=deterministic)  # [B*C, H]
    logits = classifier_layer(self.config, 1, "classifier")(pooled).astype(jnp.float32)  # [B*C, 1]
    choices = lambda x: x.reshape(b, n_choices, *x.shape[1:])  # [B*C, ...] -> [B, C, ...]
    per_choice = lambda xs: None if xs is None else tuple(map(choices, xs))
    return ClassifierOutput(
        last_hidden_state=choices(out.last_hidden_state), logits=logits.reshape(b, n_choices),
        pooled_output=choices(out.pooled_output), hidden_states=per_choice(out.hidden_states),
        attentions=per_choice(out.attentions))
