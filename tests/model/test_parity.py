"""Parity with transformers' PyTorch BERT on random weights, and the state-dict name mapping."""
import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
import transformers

import jbert.model as jm
from jbert.weights.hf_names import hf_to_params, params_to_hf

HF_SIZES = dict(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                intermediate_size=128, max_position_embeddings=64)
TOL = 1e-5

# jbert class -> transformers class, and the num_labels each case uses.
PAIRS = {
    jm.BertModel: transformers.BertModel,
    jm.BertForPreTraining: transformers.BertForPreTraining,
    jm.BertForMaskedLM: transformers.BertForMaskedLM,
    jm.BertForSequenceClassification: transformers.BertForSequenceClassification,
    jm.BertForTokenClassification: transformers.BertForTokenClassification,
    jm.BertForQuestionAnswering: transformers.BertForQuestionAnswering,
    jm.BertForMultipleChoice: transformers.BertForMultipleChoice,
}


def _torch_model(cls, act="gelu", num_labels=2, seed=0):
  """A transformers model whose LayerNorms and biases are random too, so no term is trivially 0 or 1."""
  torch.manual_seed(seed)
  hf_config = transformers.BertConfig(**HF_SIZES, hidden_act=act, num_labels=num_labels,
                                      attn_implementation="eager")
  model = PAIRS[cls](hf_config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        p.add_(0.3 * torch.randn_like(p))
  state = {k: v.numpy() for k, v in model.state_dict().items()}
  return model, state, jm.BertConfig.from_dict(hf_config.to_dict())


def _inputs(shape=(3, 16), seed=0):
  """Two segments per row; rows 0 and 1 end in padding."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(1, HF_SIZES["vocab_size"], shape).astype(np.int32)
  types = np.zeros(shape, np.int32)
  types[..., shape[-1] // 2:] = 1
  mask = np.ones(shape, np.int32)
  mask[..., 0, 11:] = 0
  mask[..., 1, 5:] = 0
  return ids, types, mask


def _torch_run(model, ids, types, mask):
  with torch.no_grad():
    ids, types, mask = (torch.tensor(x, dtype=torch.long) for x in (ids, types, mask))
    return model(input_ids=ids, token_type_ids=types, attention_mask=mask)


def _close(got, want):
  got, want = np.asarray(got), np.asarray(want.numpy() if isinstance(want, torch.Tensor) else want)
  assert got.shape == want.shape
  assert np.abs(got - want).max() <= TOL


def _load(cls, state, config, **kw):
  params, unused, missing = hf_to_params(state, config, cls)
  assert unused == [] and missing == []
  model = cls(config, **kw)
  # The mapped tree has exactly init's structure and shapes.
  boxed = jax.eval_shape(lambda: jm.init_params(model, jax.random.key(0)))
  want = jax.tree.map(lambda x: x.shape, nn.meta.unbox(boxed))
  assert jax.tree.map(np.shape, params) == want
  return model, params


ACTS = ["gelu", "gelu_new"]


@pytest.mark.parametrize("act", ACTS)
def test_bert_model(act):
  torch_model, state, config = _torch_model(jm.BertModel, act)
  model, params = _load(jm.BertModel, state, config)
  ids, types, mask = _inputs()
  want = _torch_run(torch_model, ids, types, mask)
  got = model.apply({"params": params}, ids, types, mask)
  _close(got.last_hidden_state, want.last_hidden_state)
  _close(got.pooled_output, want.pooler_output)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("cls", [jm.BertForPreTraining, jm.BertForMaskedLM])
def test_masked_lm_heads(cls, act):
  torch_model, state, config = _torch_model(cls, act)
  model, params = _load(cls, state, config)
  ids, types, mask = _inputs()
  want = _torch_run(torch_model, ids, types, mask)
  want_mlm = want.prediction_logits if cls is jm.BertForPreTraining else want.logits
  got = model.apply({"params": params}, ids, types, mask)
  _close(got.mlm_logits, want_mlm)
  positions = np.array([[0, 3, 9], [1, 2, 4], [15, 14, 0]], np.int32)
  gathered = model.apply({"params": params}, ids, types, mask, masked_lm_positions=positions)
  _close(gathered.mlm_logits, np.take_along_axis(want_mlm.numpy(), positions[..., None], axis=1))
  if cls is jm.BertForPreTraining:
    _close(got.nsp_logits, want.seq_relationship_logits)
    _close(gathered.nsp_logits, want.seq_relationship_logits)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("num_labels", [1, 3])
def test_sequence_classification(num_labels, act):
  torch_model, state, config = _torch_model(jm.BertForSequenceClassification, act, num_labels)
  model, params = _load(jm.BertForSequenceClassification, state, config, num_labels=num_labels)
  ids, types, mask = _inputs()
  got = model.apply({"params": params}, ids, types, mask)
  assert got.logits.shape == (3, num_labels)
  _close(got.logits, _torch_run(torch_model, ids, types, mask).logits)


@pytest.mark.parametrize("act", ACTS)
def test_token_classification(act):
  torch_model, state, config = _torch_model(jm.BertForTokenClassification, act, num_labels=5)
  model, params = _load(jm.BertForTokenClassification, state, config, num_labels=5)
  ids, types, mask = _inputs()
  got = model.apply({"params": params}, ids, types, mask)
  assert got.logits.shape == (3, 16, 5)
  _close(got.logits, _torch_run(torch_model, ids, types, mask).logits)


@pytest.mark.parametrize("act", ACTS)
def test_question_answering(act):
  torch_model, state, config = _torch_model(jm.BertForQuestionAnswering, act)
  model, params = _load(jm.BertForQuestionAnswering, state, config)
  ids, types, mask = _inputs()
  got, want = model.apply({"params": params}, ids, types, mask), _torch_run(torch_model, ids, types, mask)
  _close(got.start_logits, want.start_logits)
  _close(got.end_logits, want.end_logits)


@pytest.mark.parametrize("act", ACTS)
def test_multiple_choice(act):
  torch_model, state, config = _torch_model(jm.BertForMultipleChoice, act)
  model, params = _load(jm.BertForMultipleChoice, state, config)
  ids, types, mask = _inputs(shape=(2, 3, 16))
  got = model.apply({"params": params}, ids, types, mask)
  assert got.logits.shape == (2, 3)
  _close(got.logits, _torch_run(torch_model, ids, types, mask).logits)


@pytest.mark.parametrize("cls", list(PAIRS), ids=lambda c: c.__name__)
def test_round_trip_is_exact(cls):
  num_labels = 3 if cls in (jm.BertForSequenceClassification, jm.BertForTokenClassification) else 2
  _, state, config = _torch_model(cls, num_labels=num_labels)
  params, _, _ = hf_to_params(state, config, cls)
  back = params_to_hf(params, config, cls)
  assert sorted(back) == sorted(state)
  for name, value in state.items():
    assert back[name].dtype == value.dtype and np.array_equal(back[name], value), name
  # Scanned params map back to the same state dict.
  stacked = params_to_hf(jm.stack_layers(params), config.replace(scan_layers=True), cls)
  assert all(np.array_equal(stacked[k], v) for k, v in state.items())


def test_name_variants_map_to_the_same_params():
  _, state, config = _torch_model(jm.BertForPreTraining)
  params, _, _ = hf_to_params(state, config, jm.BertForPreTraining)
  # Old checkpoints: LayerNorm gamma/beta, decoder bias only under `cls.predictions.decoder.bias`.
  old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
         for k, v in state.items() if k != "cls.predictions.bias"}
  old["bert.embeddings.position_ids"] = np.arange(64)[None]
  params_old, unused, missing = hf_to_params(old, config, jm.BertForPreTraining)
  assert unused == [] and missing == []
  assert jax.tree.all(jax.tree.map(np.array_equal, params_old, params))
  # Sentence-transformers style: the backbone without the `bert.` prefix.
  bare = {k.removeprefix("bert."): v for k, v in state.items() if k.startswith("bert.")}
  backbone, unused, missing = hf_to_params(bare, config, jm.BertModel)
  assert unused == [] and missing == []
  assert jax.tree.all(jax.tree.map(np.array_equal, backbone, params["bert"]))


def test_unused_and_missing_are_reported():
  _, state, config = _torch_model(jm.BertForPreTraining)
  # A backbone from a pretraining checkpoint: the heads are unused.
  _, unused, missing = hf_to_params(state, config, jm.BertModel)
  assert missing == [] and unused == sorted(k for k in state if k.startswith("cls."))
  # A classifier from the same checkpoint: its classifier is missing.
  params, unused, missing = hf_to_params(state, config, jm.BertForSequenceClassification)
  assert missing == ["classifier/kernel", "classifier/bias"] and "classifier" not in params
  assert "cls.seq_relationship.weight" in unused
  # An untied decoder cannot be represented: reported unused.
  untied = {**state, "cls.predictions.decoder.weight": state["cls.predictions.decoder.weight"] + 1}
  _, unused, _ = hf_to_params(untied, config, jm.BertForPreTraining)
  assert unused == ["cls.predictions.decoder.weight"]
