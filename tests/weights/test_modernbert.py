"""ModernBERT: every transformers head read from a folder transformers wrote, equal to transformers (fp32, <= 1e-5;
eager and sdpa attention) at lengths below, at and above the sliding window, padded and in packed rows, and
written back as a folder transformers loads with no missing or unexpected weight and the same outputs."""
import json

import numpy as np
import pytest
import torch
import transformers

import jbert
import jbert.model as jm

TOL = 1e-5
WINDOW = 16  # local_attention: 8 tokens each side
LENGTHS = {"below": 6, "at": 17, "above": 40}  # 17 tokens: the first and the last are 16 apart
VARIANTS = {
    # ModernBERT's own settings (no biases, [CLS] pooling, a global layer every third).
    "default": dict(),
    # Every bias on, mean pooling, a global layer every second: each switch is read.
    "biased": dict(attention_bias=True, mlp_bias=True, norm_bias=True, classifier_bias=True,
                   classifier_pooling="mean", global_attn_every_n_layers=2, global_rope_theta=1000.0,
                   local_rope_theta=50.0),
}
HEADS = {  # transformers suffix -> (jbert class, num_labels, output fields: jbert -> transformers, per token)
    "Model": (jm.BertModel, None, {"last_hidden_state": "last_hidden_state"}, True),
    "ForMaskedLM": (jm.BertForMaskedLM, None, {"mlm_logits": "logits"}, True),
    "ForSequenceClassification": (jm.BertForSequenceClassification, 3, {"logits": "logits"}, False),
    "ForTokenClassification": (jm.BertForTokenClassification, 5, {"logits": "logits"}, True),
    "ForQuestionAnswering": (jm.BertForQuestionAnswering, None, {"start_logits": "start_logits",
                                                                   "end_logits": "end_logits"}, True),
    "ForMultipleChoice": (jm.BertForMultipleChoice, None, {"logits": "logits"}, False),
}
CASES = [(v, h) for v in VARIANTS for h in HEADS] + [("default", "regression")]


def hf_config(variant="default", **overrides):
  return transformers.ModernBertConfig(
      vocab_size=99, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=24,
      local_attention=WINDOW, pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2,
      **{**VARIANTS[variant], **overrides})


def hf_model(variant, head, attn="eager", seed=0):
  suffix = "ForSequenceClassification" if head == "regression" else head
  config = hf_config(variant)
  config.num_labels = 1 if head == "regression" else (HEADS[suffix][1] or 2)
  config._attn_implementation = attn
  torch.manual_seed(seed)
  model = getattr(transformers, "ModernBert" + suffix)(config).eval()
  with torch.no_grad():  # LayerNorms and biases start at ones/zeros: perturb them so they are tested.
    for name, p in model.named_parameters():
      if "norm" in name.lower() or name.endswith("bias"):
        p.add_(0.3 * torch.randn_like(p))
  return model


def batch(shape, seed=0):
  """Row 1 ends in padding after 3/4 of its tokens, row 2 after 2 tokens (0 is the pad id)."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, 99, shape).astype(np.int32)
  ids[..., 0] = 1  # [CLS]
  mask = np.ones(shape, np.int32)
  mask[..., 1, max(1, 3 * shape[-1] // 4):] = 0
  mask[..., 2, 2:] = 0
  return np.where(mask > 0, ids, 0).astype(np.int32), mask


def hf_outputs(model, ids, mask, fields):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long))
  return {name: out[hf].numpy() for name, hf in fields.items()}


def jbert_outputs(cls, config, params, ids, mask, fields, **packed):
  labels = np.shape(params["classifier"]["kernel"])[-1] if "classifier" in params else None
  out = cls(config, **jm.head(cls).model_kwargs(labels)).apply({"params": params}, ids, attention_mask=mask,
                                                               **packed)
  return {name: np.asarray(getattr(out, name)) for name in fields}


def close(got, want, mask, per_token, where):
  """Per-token outputs on the real tokens only: transformers gives a padded query far from every real token no key
  in a sliding-window layer (NaN under sdpa); its output is never read."""
  for name in want:
    g, w = got[name], want[name]
    assert g.shape == w.shape, (where, name, g.shape, w.shape)
    if per_token:
      g, w = g[mask > 0], w[mask > 0]
    err = float(np.max(np.abs(g - w)))
    assert err <= TOL, f"{where} {name}: max abs diff {err}"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  out = {}
  for variant, head in CASES:
    path = tmp_path_factory.mktemp(f"modernbert-{variant}-{head}")
    hf_model(variant, head).save_pretrained(path)
    out[variant, head] = str(path)
  return out


@pytest.mark.parametrize("variant,head", CASES, ids=[f"{v}-{h}" for v, h in CASES])
def test_every_head_equals_transformers_at_every_length_packed_and_exported(variant, head, folders, tmp_path):
  suffix = "ForSequenceClassification" if head == "regression" else head
  cls, _, fields, per_token = HEADS[suffix]
  info = jbert.describe(folders[variant, head])
  assert info.head.cls is cls and info.config.model_type == "modernbert" and info.config.pre_norm
  config, params = jbert.load_pretrained(folders[variant, head], cls)
  hf = hf_model(variant, head)
  choices = cls is jm.BertForMultipleChoice
  # The windows' edges once, on ModernBERT's own settings; the other variant's switches at the longest length.
  lengths = LENGTHS if variant == "default" else {"above": LENGTHS["above"]}
  for where, length in lengths.items():
    ids, mask = batch((2, 3, length) if choices else (3, length))
    want = hf_outputs(hf, ids, mask, fields)
    close(jbert_outputs(cls, config, params, ids, mask, fields), want, mask, per_token, f"{where}: {length}")
    if where == "above" and variant == "default":  # transformers' sdpa kernel, the same numbers
      sdpa = hf_model(variant, head, attn="sdpa")
      close(hf_outputs(sdpa, ids, mask, fields), want, mask, per_token, "sdpa")

  # Packed: rows 0 and 1 of the longest batch end to end (40 + 30 tokens: every window would cross the boundary).
  ids, mask = batch((3, LENGTHS["above"]))
  if not choices:
    want = hf_outputs(hf, ids, mask, fields)
    n0, n1 = mask[0].sum(), mask[1].sum()
    row = np.zeros((1, n0 + n1 + 6), np.int32)
    row[0, :n0 + n1] = np.concatenate([ids[0, :n0], ids[1, :n1]])
    seg = np.zeros_like(row)
    seg[0, :n0], seg[0, n0:n0 + n1] = 1, 2
    extra = {"cls_positions": np.array([[0, n0]], np.int32)} if cls is jm.BertForSequenceClassification else {}
    got = jbert_outputs(cls, config, params, row, np.ones_like(row), fields, segment_ids=seg, **extra)
    for name, value in got.items():
      if per_token:
        np.testing.assert_allclose(value[0, :n0], want[name][0, :n0], atol=TOL, rtol=0)
        np.testing.assert_allclose(value[0, n0:n0 + n1], want[name][1, :n1], atol=TOL, rtol=0)
      else:
        np.testing.assert_allclose(value[0], want[name][:2], atol=TOL, rtol=0)
  else:  # example 0's three endings (40, 30 and 2 tokens) end to end, one score per [CLS]
    ids, mask = batch((2, 3, LENGTHS["above"]))
    want = hf_outputs(hf, ids, mask, fields)
    lengths = mask[0].sum(-1)
    row = np.concatenate([ids[0, c, :n] for c, n in enumerate(lengths)])[None]
    seg = np.concatenate([np.full(n, c + 1) for c, n in enumerate(lengths)])[None].astype(np.int32)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])[None].astype(np.int32)
    got = jbert_outputs(cls, config, params, row, np.ones_like(row), fields, segment_ids=seg, cls_positions=starts)
    np.testing.assert_allclose(got["logits"], want["logits"][:1], atol=TOL, rtol=0)

  # Exported: transformers loads it as the same class, every weight found, the same outputs.
  out = jbert.save_pretrained(config, params, tmp_path / "export", cls)
  loaded, report = getattr(transformers, type(hf).__name__).from_pretrained(out, output_loading_info=True)
  assert not report["missing_keys"] and not report["unexpected_keys"] and not report["mismatched_keys"], report
  assert loaded.config.layer_types == hf.config.layer_types
  assert loaded.config.rope_parameters == hf.config.rope_parameters
  loaded.config._attn_implementation = "eager"
  ids, mask = batch((2, 3, 17) if choices else (3, 17))
  close(hf_outputs(loaded.eval(), ids, mask, fields), hf_outputs(hf, ids, mask, fields), mask, per_token, "export")


def test_a_transformers_4_config_reads_its_theta_and_layer_keys(tmp_path):
  """answerdotai/ModernBERT-base's config.json predates rope_parameters and layer_types."""
  old = {"model_type": "modernbert", "architectures": ["ModernBertForMaskedLM"], "vocab_size": 99, "hidden_size": 32,
         "num_hidden_layers": 5, "num_attention_heads": 4, "intermediate_size": 24, "global_attn_every_n_layers": 2,
         "global_rope_theta": 80000.0, "local_rope_theta": 5000.0, "local_attention": 32, "norm_eps": 1e-6,
         "layer_norm_eps": 1e-5, "position_embedding_type": "absolute", "classifier_pooling": "mean"}
  config = jm.BertConfig.from_dict(old)
  assert config.layer_types == ("full_attention", "sliding_attention") * 2 + ("full_attention",)
  assert (config.rope_theta, config.local_rope_theta, config.layer_norm_eps) == (80000.0, 5000.0, 1e-6)
  assert [config.layer_window(i) for i in range(5)] == [None, 16, None, 16, None]
  assert [config.layer_rope_theta(i) for i in range(2)] == [80000.0, 5000.0]
  assert config.pooling == "mean" and not config.attention_bias and config.decoder_bias
  written = config.to_dict()
  assert written["global_attn_every_n_layers"] == 2 and written["classifier_pooling"] == "mean"
  assert jm.BertConfig.from_dict(written) == config
  assert jm.BertConfig.from_dict(config.to_dict(full=True)) == config


@pytest.mark.parametrize("change,message", [
    ({"rope_parameters": {"full_attention": {"rope_type": "yarn", "rope_theta": 1.0, "factor": 2.0}}},
     "rope_type='yarn'"),
    ({"layer_types": ["full_attention", "chunked_attention"]}, "must name each of the num_hidden_layers=2 layers"),
    ({"local_attention": 1}, "local_attention=1 must be an int >= 2"),
    ({"classifier_pooling": "max"}, "BertConfig.pooling='max' is not supported"),
])
def test_a_config_jbert_cannot_compute_is_refused_in_one_line(change, message):
  config = {"model_type": "modernbert", "num_hidden_layers": 2, "layer_types": ["full_attention", "sliding_attention"],
            **change}
  with pytest.raises(ValueError, match=message) as e:
    jm.BertConfig.from_dict(config)
  assert "\n" not in str(e.value)


def test_scanned_layers_are_refused_naming_the_fix(folders):
  with pytest.raises(ValueError, match="scan_layers=True is not supported for modernbert .* set scan_layers=False"):
    jbert.load_pretrained(folders["default", "Model"], jm.BertModel, scan_layers=True)


def test_the_config_json_written_is_transformers_own(folders, tmp_path):
  config, params = jbert.load_pretrained(folders["biased", "ForSequenceClassification"],
                                         jm.BertForSequenceClassification)
  out = jbert.save_pretrained(config, params, tmp_path / "export", jm.BertForSequenceClassification)
  written = json.loads((tmp_path / "export" / "config.json").read_text())
  original = json.loads(open(f"{folders['biased', 'ForSequenceClassification']}/config.json").read())
  for key in ("hidden_activation", "norm_eps", "local_attention", "attention_bias", "mlp_bias", "norm_bias",
              "classifier_bias", "classifier_pooling", "classifier_activation", "decoder_bias", "layer_types",
              "rope_parameters", "intermediate_size", "num_hidden_layers"):
    assert written[key] == original[key], key
  assert written["architectures"] == ["ModernBertForSequenceClassification"] and out


def test_a_jbert_directory_round_trips_and_converts_back_to_transformers(folders, tmp_path):
  """save_pretrained(format="jbert") keeps the full config (rotary bases, layer types, biases); reading it back and
  exporting gives transformers' folder again, weight for weight."""
  import safetensors.numpy  # pylint: disable=g-import-not-at-top
  config, params = jbert.load_pretrained(folders["biased", "ForMaskedLM"], jm.BertForMaskedLM)
  jbert.save_pretrained(config, params, tmp_path / "jbert", jm.BertForMaskedLM, format="jbert")
  again, params_again = jbert.load_pretrained(str(tmp_path / "jbert"), jm.BertForMaskedLM)
  assert again == config
  np.testing.assert_array_equal(np.asarray(params_again["bert"]["encoder"]["layer_1"]["mlp"]["wi"]["kernel"]),
                                np.asarray(params["bert"]["encoder"]["layer_1"]["mlp"]["wi"]["kernel"]))
  out = jbert.save_pretrained(again, params_again, tmp_path / "hf", jm.BertForMaskedLM)
  want = safetensors.numpy.load_file(f"{folders['biased', 'ForMaskedLM']}/model.safetensors")
  got = safetensors.numpy.load_file(f"{out}/model.safetensors")
  assert set(got) - {"decoder.weight"} == set(want) - {"decoder.weight"}
  for name in want:
    if name in got:
      np.testing.assert_array_equal(got[name], want[name], err_msg=name)
