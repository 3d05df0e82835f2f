"""output_hidden_states / output_attentions: parity with transformers, scan on and off, and no cost when off."""
import flax.linen as nn
import jax
from jax.interpreters import partial_eval as pe
import numpy as np
import pytest
import torch
import transformers

import jbert.model as jm
from jbert.weights.hf_names import hf_to_params

HF_SIZES = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                max_position_embeddings=32)
LAYERS, HEADS = HF_SIZES["num_hidden_layers"], HF_SIZES["num_attention_heads"]
TOL = 1e-5

PAIRS = {
    jm.BertModel: transformers.BertModel,
    jm.BertForPreTraining: transformers.BertForPreTraining,
    jm.BertForMaskedLM: transformers.BertForMaskedLM,
    jm.BertForSequenceClassification: transformers.BertForSequenceClassification,
    jm.BertForTokenClassification: transformers.BertForTokenClassification,
    jm.BertForQuestionAnswering: transformers.BertForQuestionAnswering,
    jm.BertForMultipleChoice: transformers.BertForMultipleChoice,
}


def _models(cls, scan: bool):
  """A random transformers model (LayerNorms and biases random too) and the same weights in jbert."""
  torch.manual_seed(0)
  labelled = cls in (jm.BertForSequenceClassification, jm.BertForTokenClassification)
  hf_config = transformers.BertConfig(**HF_SIZES, num_labels=3 if labelled else 2, attn_implementation="eager")
  torch_model = PAIRS[cls](hf_config).eval()
  with torch.no_grad():
    for name, p in torch_model.named_parameters():
      if "LayerNorm" in name or name.endswith("bias"):
        p.add_(0.3 * torch.randn_like(p))
  state = {k: v.numpy() for k, v in torch_model.state_dict().items()}
  config = jm.BertConfig.from_dict(hf_config.to_dict())
  kwargs = {"num_labels": 3} if labelled else {}
  params, unused, missing = hf_to_params(state, config, cls, **kwargs)
  assert unused == [] and missing == []
  if scan:
    config, params = config.replace(scan_layers=True), jm.stack_layers(params)
  return torch_model, cls(config, **kwargs), params


def _inputs(shape):
  """Two segments per row and padding in the first two rows, so masked keys and padded queries both occur."""
  rng = np.random.default_rng(0)
  ids = rng.integers(1, HF_SIZES["vocab_size"], shape).astype(np.int32)
  types = np.zeros(shape, np.int32)
  types[..., shape[-1] // 2:] = 1
  mask = np.ones(shape, np.int32)
  mask[..., 0, 7:] = 0
  mask[..., 1, 3:] = 0
  return ids, types, mask


def _assert_close(got, want):
  got, want = np.asarray(got), want.detach().numpy()
  assert got.shape == want.shape
  assert np.abs(got - want).max() <= TOL


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scan"])
@pytest.mark.parametrize("cls", list(PAIRS), ids=lambda c: c.__name__)
def test_hidden_states_and_attentions_match_transformers(cls, scan):
  torch_model, model, params = _models(cls, scan)
  multiple_choice = cls is jm.BertForMultipleChoice
  shape = (2, 3, 10) if multiple_choice else (3, 10)
  ids, types, mask = _inputs(shape)
  with torch.no_grad():
    ids_t, types_t, mask_t = (torch.tensor(x, dtype=torch.long) for x in (ids, types, mask))
    want = torch_model(input_ids=ids_t, token_type_ids=types_t, attention_mask=mask_t, output_hidden_states=True,
                       output_attentions=True)
  apply = jax.jit(lambda p, *x: model.apply({"params": p}, *x, output_hidden_states=True, output_attentions=True))
  got = apply(params, ids, types, mask)
  assert len(got.hidden_states) == LAYERS + 1 and len(got.attentions) == LAYERS
  lead = shape[:-1]  # [B] or [B, C]: transformers flattens the choices, jbert keeps them.
  for mine, theirs in zip(got.hidden_states, want.hidden_states, strict=True):
    assert mine.shape == (*lead, shape[-1], HF_SIZES["hidden_size"])
    _assert_close(np.reshape(mine, theirs.shape), theirs)
  for mine, theirs in zip(got.attentions, want.attentions, strict=True):
    assert mine.shape == (*lead, HEADS, shape[-1], shape[-1]) and mine.dtype == np.float32
    _assert_close(np.reshape(mine, theirs.shape), theirs)
  # The last entry is the encoder's output, and asking for the extras leaves the usual outputs as they were.
  np.testing.assert_array_equal(got.hidden_states[-1], got.last_hidden_state)
  plain = jax.jit(lambda p, *x: model.apply({"params": p}, *x))(params, ids, types, mask)
  assert plain.hidden_states is None and plain.attentions is None
  for name in ("last_hidden_state", "logits", "mlm_logits", "start_logits"):
    if hasattr(plain, name):
      assert np.abs(np.asarray(getattr(plain, name)) - np.asarray(getattr(got, name))).max() <= TOL


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scan"])
def test_attentions_are_probabilities_in_training_mode(scan):
  config = jm.BertConfig(**HF_SIZES, scan_layers=scan, attention_probs_dropout_prob=0.5)
  model = jm.BertModel(config)
  _, _, params = _models(jm.BertModel, scan)  # converted weights: no initialiser to compile
  ids, types, mask = _inputs((3, 10))
  out = jax.jit(lambda p, rng: model.apply({"params": p}, ids, types, mask, deterministic=False,
                                           output_attentions=True, rngs={"dropout": rng}))(params, jax.random.key(1))
  for probs in out.attentions:
    # Rows sum to 1 over the real keys whatever dropout did; padded keys get exactly 0.
    np.testing.assert_allclose(np.asarray(probs).sum(-1), 1.0, atol=1e-5)
    assert np.all(np.asarray(probs)[mask[:, None, None, :].repeat(10, 2).repeat(HEADS, 1) == 0] == 0)


def _jaxpr(model, params, ids, **flags):
  return jax.make_jaxpr(lambda p, x: model.apply({"params": p}, x, x, x, **flags))(params, ids)


def _computation_of_first(closed, n: int) -> str:
  """The jaxpr that computes only the first `n` outputs, dead code removed."""
  used = [True] * n + [False] * (len(closed.out_avals) - n)
  return str(pe.dce_jaxpr(closed.jaxpr, used)[0])


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scan"])
def test_default_call_costs_nothing(scan):
  ids = np.ones((2, 8), np.int32)
  for impl, flags in (("xla", {"output_hidden_states": True}),
                      ("einsum", {"output_hidden_states": True, "output_attentions": True})):
    config = jm.BertConfig(**HF_SIZES, scan_layers=scan, attention_impl=impl)
    model = jm.BertModel(config)
    params = jax.eval_shape(lambda m=model: nn.meta.unbox(jm.init_params(m, jax.random.key(0))))
    default = _jaxpr(model, params, ids)
    # The default is the flags off, and leaves the model's outputs only: last_hidden_state, pooled_output.
    assert str(default) == str(_jaxpr(model, params, ids, output_hidden_states=False, output_attentions=False))
    assert len(default.out_avals) == 2
    # The per-layer outputs (and, where the attention path is the einsum one anyway, the probabilities) are
    # values the default call computes too: without them the jaxpr is exactly the default one.
    extra = _jaxpr(model, params, ids, **flags)
    assert len(extra.out_avals) == 2 + (LAYERS + 1) + (LAYERS if "output_attentions" in flags else 0)
    assert _computation_of_first(extra, 2) == _computation_of_first(default, 2)
