"""Bad input raises one clear ValueError at the Python boundary."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jbert.model as jm
from jbert.weights.hf_names import hf_to_params, params_to_hf

CONFIG = jm.BertConfig.from_preset("tiny", hidden_size=32, num_attention_heads=2, intermediate_size=64,
                                   vocab_size=50, max_position_embeddings=16, type_vocab_size=2)
IDS = np.ones((2, 8), np.int32)


@pytest.fixture(scope="module")
def params():
  return jm.init_params(jm.BertModel(CONFIG), jax.random.key(0))


def _apply(params, ids, **kw):
  return jm.BertModel(CONFIG).apply({"params": params}, ids, **kw)


def test_unknown_activation():
  with pytest.raises(ValueError, match=r"hidden_act='swish' is not supported; use one of gelu, gelu_new"):
    CONFIG.replace(hidden_act="swish")


def test_sequence_longer_than_positions(params):
  with pytest.raises(ValueError, match=r"Sequence length 17 exceeds max_position_embeddings=16; truncate"):
    _apply(params, np.ones((1, 17), np.int32))


def test_ids_outside_vocabulary(params):
  ids = IDS.copy()
  ids[1, 3] = 50
  with pytest.raises(ValueError, match=r"input_ids contains 50 at position \(1, 3\), outside \[0, 50\); "
                                       r"vocab_size=50"):
    _apply(params, ids)
  with pytest.raises(ValueError, match=r"input_ids contains -1 at position \(0, 0\)"):
    _apply(params, jnp.full((1, 4), -1, jnp.int32))  # Concrete JAX arrays are checked too.


def test_type_ids_outside_range(params):
  types = np.zeros_like(IDS)
  types[0, 5] = 2
  with pytest.raises(ValueError, match=r"token_type_ids contains 2 at position \(0, 5\), outside \[0, 2\); "
                                       r"type_vocab_size=2"):
    _apply(params, IDS, token_type_ids=types)


def test_values_are_not_checked_under_jit(params):
  # Under jit only shapes are checked; the range check needs concrete values.
  out = jax.jit(lambda p, ids: _apply(p, ids).last_hidden_state)(params, IDS)
  assert out.shape == (2, 8, 32)
  with pytest.raises(ValueError, match=r"exceeds max_position_embeddings=16"):
    jax.jit(lambda p, ids: _apply(p, ids).last_hidden_state)(params, np.ones((1, 20), np.int32))


def test_shape_mismatch_and_rank(params):
  with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 7\) but input_ids has \(2, 8\)"):
    _apply(params, IDS, attention_mask=np.ones((2, 7), np.int32))
  with pytest.raises(ValueError, match=r"input_ids must have rank 2 \[batch, length\], got shape \(8,\)"):
    _apply(params, IDS[0])


def test_multiple_choice_needs_rank_3():
  model = jm.BertForMultipleChoice(CONFIG)
  params = jm.init_params(model, jax.random.key(0))
  with pytest.raises(ValueError, match=r"rank 3 \[batch, choices, length\], got shape \(2, 8\); add the "
                                       r"choices axis"):
    model.apply({"params": params}, IDS)


def test_masked_lm_positions_outside_sequence():
  model = jm.BertForMaskedLM(CONFIG)
  params = jm.init_params(model, jax.random.key(0))
  with pytest.raises(ValueError, match=r"masked_lm_positions contains 8 at position \(1, 0\), outside "
                                       r"\[0, 8\)"):
    model.apply({"params": params}, IDS, masked_lm_positions=np.array([[0, 1], [8, 2]], np.int32))


def test_hf_shape_mismatch_names_weight_and_field(params):
  state = params_to_hf(params, CONFIG, jm.BertModel)
  with pytest.raises(ValueError, match=r"embeddings.word_embeddings.weight has shape \(50, 32\) but the "
                                       r"config expects \(60, 32\); set vocab_size"):
    hf_to_params(state, CONFIG.replace(vocab_size=60), jm.BertModel)
  with pytest.raises(ValueError, match=r"encoder.layer.0.intermediate.dense.weight has shape \(64, 32\) "
                                       r"but the config expects \(128, 32\); set intermediate_size"):
    hf_to_params(state, CONFIG.replace(intermediate_size=128), jm.BertModel)
  with pytest.raises(ValueError, match=r"layers 0..1 but num_hidden_layers=1; set num_hidden_layers=2"):
    hf_to_params(state, CONFIG.replace(num_hidden_layers=1), jm.BertModel)


def test_hf_num_labels_mismatch():
  model = jm.BertForSequenceClassification(CONFIG, num_labels=3)
  state = params_to_hf(jm.init_params(model, jax.random.key(0)), CONFIG, jm.BertForSequenceClassification)
  params, _, _ = hf_to_params(state, CONFIG, jm.BertForSequenceClassification)
  assert params["classifier"]["kernel"].shape == (32, 3)  # Inferred from the state dict.
  with pytest.raises(ValueError, match=r"classifier.weight has shape \(3, 32\) but the config expects "
                                       r"\(5, 32\); set num_labels"):
    hf_to_params(state, CONFIG, jm.BertForSequenceClassification, num_labels=5)


@pytest.mark.parametrize("jit", [False, True])
def test_float_ids_and_empty_sequences_name_input_ids_also_under_jit(params, jit):
  call = jax.jit(_apply) if jit else _apply
  with pytest.raises(ValueError, match=r"input_ids must hold integer ids \(int32\), got dtype float32"):
    call(params, IDS.astype(np.float32))
  with pytest.raises(ValueError, match=r"token_type_ids must hold integer ids \(int32\), got dtype float32"):
    call(params, IDS, token_type_ids=np.zeros((2, 8), np.float32))
  with pytest.raises(ValueError, match=r"input_ids has shape \(2, 0\): every sequence needs at least one token"):
    call(params, np.zeros((2, 0), np.int32))


def test_check_ids_names_the_array_value_and_position():
  batch = {"input_ids": IDS.copy(), "token_type_ids": np.zeros((2, 8), np.int32),
           "masked_lm_positions": np.array([[1, 2], [3, 7]], np.int32), "masked_lm_ids": np.ones((2, 2), np.int32)}
  jm.validation.check_ids(batch, vocab_size=50, type_vocab_size=2)  # in range: returns
  cases = [("input_ids", (0, 4), -1, r"input_ids contains -1 at position \(0, 4\), outside \[0, 50\); vocab_size=50"),
           ("masked_lm_ids", (1, 1), 50, r"masked_lm_ids contains 50 at position \(1, 1\), outside \[0, 50\)"),
           ("token_type_ids", (1, 0), 2, r"token_type_ids contains 2 at position \(1, 0\), outside \[0, 2\)"),
           ("masked_lm_positions", (0, 0), 8, r"masked_lm_positions contains 8 at position \(0, 0\), outside "
                                              r"\[0, 8\); sequence length 8")]
  for name, pos, value, message in cases:
    bad = {k: v.copy() for k, v in batch.items()}
    bad[name][pos] = value
    with pytest.raises(ValueError, match=message):
      jm.validation.check_ids(bad, vocab_size=50, type_vocab_size=2)
  with pytest.raises(ValueError, match=r"input_ids must hold integer ids"):
    jm.validation.check_ids({"input_ids": IDS.astype(np.float64)}, vocab_size=50)


def test_what_out_of_range_ids_do_under_a_users_own_jit(params):
  """The behaviour the module docstring states, which is why `check_ids` exists."""
  apply = jax.jit(lambda p, ids, types: _apply(p, ids, token_type_ids=types).last_hidden_state)
  ids, types = np.full((2, 8), 7, np.int32), np.zeros((2, 8), np.int32)

  def with_id(array, value):
    array = array.copy()
    array[0, 3] = value
    return array

  np.testing.assert_array_equal(apply(params, with_id(ids, -1), types), apply(params, with_id(ids, 49), types))
  np.testing.assert_array_equal(apply(params, ids, with_id(types, -1)), apply(params, ids, with_id(types, 1)))
  for bad_ids, bad_types in ((with_id(ids, 50), types), (with_id(ids, -51), types), (ids, with_id(types, 2))):
    out = np.asarray(apply(params, bad_ids, bad_types))
    assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()  # the whole sequence, and only it
