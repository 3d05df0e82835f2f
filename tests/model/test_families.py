"""The families as data: config.json read and written per model_type, the fields each implies, RoBERTa's
positions in packed rows, and one line for a model_type jbert does not compute."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

import jbert
import jbert.model as jm
from jbert.model import encoder, families
from jbert.model.validation import check_ids

SIZES = dict(vocab_size=99, num_hidden_layers=2, num_attention_heads=4)


@pytest.mark.parametrize("hf_config,want", [
    (transformers.RobertaConfig(**SIZES, hidden_size=32, intermediate_size=37, max_position_embeddings=42,
                                pad_token_id=1, type_vocab_size=1, layer_norm_eps=1e-5),
     dict(model_type="roberta", hidden_size=32, position_offset=2, max_length=40, pooler_act="tanh",
          pooler_dropout=True, lm_head_act="gelu", use_pooler=True, layer_norm_eps=1e-5)),
    (transformers.XLMRobertaConfig(**SIZES, hidden_size=32, intermediate_size=37, pad_token_id=3),
     dict(model_type="xlm-roberta", position_offset=4)),
    (transformers.DistilBertConfig(vocab_size=99, dim=48, n_layers=3, n_heads=4, hidden_dim=37, activation="relu",
                                   dropout=0.05, attention_dropout=0.15, seq_classif_dropout=0.25),
     dict(model_type="distilbert", hidden_size=48, num_hidden_layers=3, intermediate_size=37, hidden_act="relu",
          hidden_dropout_prob=0.05, attention_probs_dropout_prob=0.15, classifier_dropout=0.25,
          use_token_types=False, use_pooler=False, pooler_act="relu", layer_norm_eps=1e-12)),
    (transformers.ElectraConfig(**SIZES, hidden_size=32, intermediate_size=37, embedding_size=16),
     dict(model_type="electra", embedding_size=16, embedding_width=16, use_pooler=False, pooler_act="gelu")),
], ids=["roberta", "xlm-roberta", "distilbert", "electra"])
def test_config_json_reads_into_the_fields_the_family_implies_and_writes_back(hf_config, want):
  config = jm.BertConfig.from_dict(hf_config.to_dict())
  assert {k: getattr(config, k) for k in want} == want
  written = config.to_dict()
  assert written["model_type"] == hf_config.model_type
  # transformers reads what jbert writes into the same configuration.
  back = type(hf_config)(**{k: v for k, v in written.items() if k != "model_type"})
  for key in ("vocab_size", "num_attention_heads", "pad_token_id"):
    assert getattr(back, key) == getattr(hf_config, key)
  assert back.hidden_size == hf_config.hidden_size and back.num_hidden_layers == hf_config.num_hidden_layers
  assert jm.BertConfig.from_dict(config.to_dict(full=True)) == config


def test_bert_config_json_is_unchanged():
  d = jm.BertConfig.from_preset("tiny").to_dict()
  assert list(d) == [*jm.config.HF_FIELDS, "model_type"] and d["model_type"] == "bert"
  assert not set(jm.config.FAMILY_FIELDS[1:]) & set(d)


def test_distilbert_config_json_has_its_own_names_only():
  d = jm.BertConfig.from_dict({"model_type": "distilbert", "dim": 32, "n_layers": 2, "n_heads": 4}).to_dict()
  assert {"dim", "n_layers", "n_heads", "hidden_dim", "activation", "seq_classif_dropout"} <= set(d)
  assert not {"hidden_size", "type_vocab_size", "layer_norm_eps"} & set(d)


@pytest.mark.parametrize("model_type", ["deberta-v2", "mpnet", "funnel", "gpt2"])
def test_a_model_type_jbert_does_not_compute_is_one_line_naming_the_supported(model_type):
  with pytest.raises(ValueError) as e:
    jm.BertConfig.from_dict({"model_type": model_type, "hidden_size": 32})
  message = str(e.value)
  assert "\n" not in message and repr(model_type) in message
  assert "bert, roberta, xlm-roberta, camembert, distilbert, electra, modernbert" in message


def test_every_family_names_a_transformers_class_per_head():
  names = families.architectures()
  assert names["XLMRobertaForSequenceClassification"] == "BertForSequenceClassification"
  assert names["ElectraForPreTraining"] == "BertForReplacedTokenDetection"
  assert names["DistilBertForMultipleChoice"] == "BertForMultipleChoice"
  assert jm.registry.by_architecture(["CamembertForMaskedLM"]).cls is jm.BertForMaskedLM
  for name in names:
    assert hasattr(transformers, name), name


def test_a_head_of_jberts_own_keeps_its_name_and_a_head_the_family_lacks_is_refused():
  roberta = families.of("roberta")
  assert roberta.architecture("SentenceEncoder", "roberta") == "SentenceEncoder"
  assert roberta.architecture("BertForMaskedLM", "xlm-roberta") == "XLMRobertaForMaskedLM"
  with pytest.raises(ValueError, match=r"^roberta models have no BertForPreTraining head in transformers"):
    roberta.architecture("BertForPreTraining", "roberta")


def test_roberta_positions_count_non_padding_tokens_from_the_offset_restarting_per_sequence():
  config = jm.BertConfig.from_dict({"model_type": "roberta", "vocab_size": 99, "hidden_size": 32,
                                    "num_attention_heads": 4, "max_position_embeddings": 42, "pad_token_id": 1})
  ids = jnp.array([[0, 7, 8, 2, 1, 1], [0, 9, 2, 0, 5, 2]], jnp.int32)
  unpacked = encoder.table_positions(config, ids, None, None)
  want = transformers.models.roberta.modeling_roberta.RobertaEmbeddings.create_position_ids_from_input_ids(
      torch.tensor(np.asarray(ids)), 1).numpy()
  np.testing.assert_array_equal(unpacked, want)
  seg = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 2, 2, 2]], jnp.int32)
  np.testing.assert_array_equal(encoder.table_positions(config, ids, seg, None),
                                [[2, 3, 4, 5, 1, 1], [2, 3, 4, 2, 3, 4]])
  # Explicit positions count from 0 in each sequence for every family: the table is read from the offset.
  np.testing.assert_array_equal(encoder.table_positions(config, ids, seg, jnp.array([[0, 1, 2, 3, 0, 0]] * 2)),
                                [[2, 3, 4, 5, 2, 2]] * 2)
  with pytest.raises(ValueError, match=r"exceeds max_position_embeddings=42 less position_offset=2"):
    jm.BertModel(config).init(jax.random.key(0), jnp.ones((1, 41), jnp.int32))


def test_distilbert_ignores_token_types_and_has_no_table_for_them():
  config = jm.BertConfig.from_dict({"model_type": "distilbert", "vocab_size": 99, "dim": 32, "n_layers": 1,
                                    "n_heads": 4})
  model = jm.BertModel(config)
  params = jm.init_params(model, jax.random.key(0))
  assert "token_type_embeddings" not in params["embeddings"] and "pooler" not in params
  ids = jnp.array([[5, 6, 7, 8]], jnp.int32)
  a = model.apply({"params": params}, ids, jnp.zeros_like(ids)).last_hidden_state
  b = model.apply({"params": params}, ids, jnp.array([[0, 0, 7, 9]], jnp.int32)).last_hidden_state
  np.testing.assert_array_equal(a, b)


def test_one_token_type_reads_every_token_as_type_0_as_transformers_roberta_does(tmp_path):
  """A pair's second segment from a tokenizer that numbers it 1 (WordPiece, pretraining's segment B) feeds RoBERTa
  type 0, the ids its own tokenizers give, so the output is transformers' on type 0; the batch check passes
  such ids rather than refusing type 1."""
  hf = transformers.RobertaConfig(**SIZES, hidden_size=32, intermediate_size=37, max_position_embeddings=42,
                                  pad_token_id=1, type_vocab_size=1)
  torch.manual_seed(0)
  reference = transformers.RobertaModel(hf, add_pooling_layer=False).eval()
  with torch.no_grad():  # a type row far from zero, so that reading it or not shows
    reference.embeddings.token_type_embeddings.weight.add_(0.5)
  reference.save_pretrained(tmp_path)
  config, params = jbert.load_pretrained(str(tmp_path), jm.BertModel)
  assert config.use_token_types and not config.reads_token_types
  ids = np.array([[0, 7, 8, 2, 2, 9, 10, 2]], np.int32)
  types = np.array([[0, 0, 0, 0, 1, 1, 1, 1]], np.int32)
  got = jm.BertModel(config, add_pooling_layer=False).apply({"params": params}, ids, types).last_hidden_state
  with torch.no_grad():
    want = reference(torch.tensor(ids), token_type_ids=torch.zeros(ids.shape, dtype=torch.long)).last_hidden_state
  np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=1e-5, rtol=0)
  check_ids({"input_ids": ids, "token_type_ids": types}, config.vocab_size, None)
  with pytest.raises(ValueError, match=r"token_type_ids contains 1 at position \(0, 4\), outside \[0, 1\)"):
    check_ids({"input_ids": ids, "token_type_ids": types}, config.vocab_size, config.type_vocab_size)
  assert jm.BertConfig(vocab_size=99, hidden_size=32, num_attention_heads=4).reads_token_types  # BERT's two


def test_a_family_config_built_without_its_implied_fields_is_refused():
  with pytest.raises(ValueError, match=r"BertConfig\(model_type='roberta'\) needs pooler_act='tanh', "
                                       r"pooler_dropout=True, lm_head_act='gelu', position_offset=1; build it"):
    jm.BertConfig(model_type="roberta", pooler_act="gelu")
  config = jm.BertConfig.from_dict({"model_type": "roberta", "hidden_size": 64, "num_attention_heads": 4})
  assert config.replace(num_hidden_layers=3).position_offset == 2


def test_distilbert_head_dropouts_are_the_ones_transformers_trains_with():
  """DistilBERT drops out [CLS] at seq_classif_dropout (sequence classification, multiple choice), tokens at
  `dropout` (token classification) and before qa_outputs at qa_dropout; BERT's token classifier reads
  classifier_dropout and its QA head drops nothing. With every other dropout 0, a head's training output differs
  from its deterministic one exactly when the rate it reads is not 0."""
  hf = transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=1, n_heads=4, hidden_dim=37, dropout=0.0,
                                     attention_dropout=0.0, seq_classif_dropout=0.5, qa_dropout=0.5)
  distil = jm.BertConfig.from_dict(hf.to_dict())
  assert (distil.classifier_dropout, distil.qa_dropout, distil.token_dropout) == (0.5, 0.5, "hidden")
  assert (distil.to_dict()["qa_dropout"], distil.to_dict()["seq_classif_dropout"]) == (0.5, 0.5)
  bert = jm.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                       intermediate_size=37, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
                       classifier_dropout=0.5)
  assert bert.qa_dropout is None and "qa_dropout" not in bert.to_dict()
  ids = jnp.array([[2, 5, 6, 7, 8, 3]], jnp.int32)

  def dropped(config, cls, **kw):
    model = cls(config, **kw)
    params = jm.init_params(model, jax.random.key(0))
    train = model.apply({"params": params}, ids, deterministic=False, rngs={"dropout": jax.random.key(1)})
    test = model.apply({"params": params}, ids)
    key = "start_logits" if cls is jm.BertForQuestionAnswering else "logits"
    return not np.array_equal(getattr(train, key), getattr(test, key))

  assert dropped(distil, jm.BertForSequenceClassification, num_labels=2)
  assert not dropped(distil, jm.BertForTokenClassification, num_labels=3)  # `dropout` is 0
  assert dropped(distil, jm.BertForQuestionAnswering)
  assert not dropped(distil.replace(qa_dropout=0.0), jm.BertForQuestionAnswering)
  assert dropped(distil.replace(hidden_dropout_prob=0.3, classifier_dropout=0.0), jm.BertForTokenClassification,
                 num_labels=3)
  assert dropped(bert, jm.BertForTokenClassification, num_labels=3)  # BERT's reads classifier_dropout
  assert not dropped(bert, jm.BertForQuestionAnswering)
