"""BertConfig: presets, validation, dict / JSON round trips."""
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jbert.model import PRESETS, BertConfig
from jbert.model.layers import activation

_SIZES = {"tiny": (2, 128, 2), "mini": (4, 256, 4), "small": (4, 512, 8), "medium": (8, 512, 8),
          "base": (12, 768, 12), "large": (24, 1024, 16)}


@pytest.mark.parametrize("name", sorted(_SIZES))
def test_presets(name):
  c = BertConfig.from_preset(name)
  assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == _SIZES[name]
  assert c.intermediate_size == 4 * c.hidden_size
  assert (c.vocab_size, c.max_position_embeddings, c.type_vocab_size) == (30522, 512, 2)
  assert PRESETS[name] == c


def test_preset_overrides_and_unknown_preset():
  c = BertConfig.from_preset("tiny", vocab_size=99, scan_layers=True)
  assert (c.vocab_size, c.scan_layers, c.hidden_size) == (99, True, 128)
  with pytest.raises(ValueError, match=r"Unknown BERT preset 'huge'.*tiny, mini, small, medium, base, large"):
    BertConfig.from_preset("huge")


@pytest.mark.parametrize("field,value,match", [
    ("hidden_act", "silu", r"hidden_act='silu' is not supported; use one of gelu, gelu_new, "
                           r"gelu_pytorch_tanh, relu"),
    ("num_attention_heads", 5, r"hidden_size=128 is not a multiple of num_attention_heads=5"),
    ("remat_policy", "some", r"remat_policy='some'.*none, full, dots, dots_no_batch"),
    ("attention_impl", "flash", r"attention_impl='flash'.*auto, xla, cudnn, splash, einsum"),
    ("dtype", "int8", r"dtype='int8'"),
    ("vocab_size", 0, r"vocab_size must be a positive int, got 0"),
    ("hidden_dropout_prob", 1.5, r"hidden_dropout_prob must lie in \[0, 1\), got 1.5"),
])
def test_invalid_fields(field, value, match):
  with pytest.raises(ValueError, match=match):
    BertConfig.from_preset("tiny", **{field: value})


def test_from_dict_ignores_hf_extras_and_hf_dtype():
  hf = {"architectures": ["BertForMaskedLM"], "model_type": "bert", "transformers_version": "5.0",
        "dtype": "bfloat16", "use_cache": True, "position_embedding_type": "absolute",
        "vocab_size": 1000, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
        "intermediate_size": 100, "hidden_act": "gelu_new", "layer_norm_eps": 1e-6}
  c = BertConfig.from_dict(hf)
  assert (c.vocab_size, c.hidden_size, c.num_hidden_layers, c.intermediate_size) == (1000, 64, 3, 100)
  assert (c.hidden_act, c.layer_norm_eps) == ("gelu_new", 1e-6)
  # HF's `dtype` is the stored torch dtype, not jbert's compute dtype.
  assert c.dtype == "float32"


def test_from_dict_rejects_relative_positions():
  with pytest.raises(ValueError, match="position_embedding_type='relative_key' is not supported"):
    BertConfig.from_dict({"position_embedding_type": "relative_key"})


def test_to_dict_full_round_trip():
  c = BertConfig.from_preset("mini", dtype="bfloat16", scan_layers=True, remat_policy="dots",
                             attention_impl="einsum", classifier_dropout=0.2)
  hf = c.to_dict()
  assert hf["model_type"] == "bert" and hf["hidden_size"] == 256 and hf["classifier_dropout"] == 0.2
  assert not {"dtype", "param_dtype", "scan_layers", "remat_policy", "attention_impl"} & set(hf)
  assert BertConfig.from_dict(hf) == c.replace(dtype="float32", scan_layers=False, remat_policy="none",
                                               attention_impl="auto")
  assert BertConfig.from_dict(c.to_dict(full=True)) == c


def test_save_and_from_json_file(tmp_path):
  c = BertConfig.from_preset("tiny", vocab_size=321, scan_layers=True)
  c.save(tmp_path / "config.json", full=True)
  assert BertConfig.from_json_file(tmp_path / "config.json") == c
  assert BertConfig.from_json_file(tmp_path) == c
  tf_dir = tmp_path / "tf"
  tf_dir.mkdir()
  (tf_dir / "bert_config.json").write_text(json.dumps({**c.to_dict(), "directionality": "bidi"}))
  assert BertConfig.from_json_file(tf_dir) == c.replace(scan_layers=False)
  empty = tmp_path / "empty"
  empty.mkdir()
  with pytest.raises(FileNotFoundError, match="No config.json or bert_config.json"):
    BertConfig.from_json_file(empty)


@pytest.mark.parametrize("name,expected", [("gelu", 0.8413447), ("gelu_new", 0.8411920),
                                           ("gelu_pytorch_tanh", 0.8411920)])
def test_activation_values(name, expected):
  assert float(activation(name)(1.0)) == pytest.approx(expected, abs=1e-6)


def test_exact_gelu_and_its_gradient_over_a_range():
  xs = np.linspace(-8.0, 8.0, 161, dtype=np.float32)
  cdf = np.array([0.5 * (1 + math.erf(x / math.sqrt(2))) for x in xs.astype(np.float64)])
  pdf = np.exp(-xs.astype(np.float64) ** 2 / 2) / math.sqrt(2 * math.pi)
  gelu = activation("gelu")
  np.testing.assert_allclose(gelu(jnp.asarray(xs)), xs * cdf, rtol=1e-6, atol=1e-6)
  grad = jax.vmap(jax.grad(gelu))(jnp.asarray(xs))
  np.testing.assert_allclose(grad, cdf + xs * pdf, rtol=1e-5, atol=1e-6)
