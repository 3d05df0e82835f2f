"""BERT's relatives (RoBERTa, XLM-R, CamemBERT, DistilBERT, ELECTRA): every head of each family read from a folder
transformers wrote, equal to transformers (fp32, <= 1e-5) unpacked and in packed rows, and written back as a
folder transformers loads with no missing or unexpected weight and the same outputs."""
import json

import numpy as np
import pytest
import torch
import transformers

import jbert
import jbert.model as jm

TOL = 1e-5
SIZES = dict(vocab_size=99, num_hidden_layers=2, num_attention_heads=4)
BERTLIKE = dict(SIZES, hidden_size=32, intermediate_size=37)
# model_type -> (transformers config, class prefix, pad id)
FAMILIES = {
    "roberta": (lambda: transformers.RobertaConfig(**BERTLIKE, max_position_embeddings=42, type_vocab_size=1,
                                                   pad_token_id=1, layer_norm_eps=1e-5), "Roberta", 1),
    "xlm-roberta": (lambda: transformers.XLMRobertaConfig(**BERTLIKE, max_position_embeddings=42, type_vocab_size=1,
                                                          pad_token_id=1, layer_norm_eps=1e-5), "XLMRoberta", 1),
    "camembert": (lambda: transformers.CamembertConfig(**BERTLIKE, max_position_embeddings=42, type_vocab_size=1,
                                                       pad_token_id=1, layer_norm_eps=1e-5), "Camembert", 1),
    "distilbert": (lambda: transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                                         max_position_embeddings=40, pad_token_id=0),
                   "DistilBert", 0),
    "electra": (lambda: transformers.ElectraConfig(**BERTLIKE, embedding_size=16, max_position_embeddings=40),
                "Electra", 0),
}
HEADS = {  # transformers suffix -> (jbert class, num_labels, output fields: jbert -> transformers)
    "Model": (jm.BertModel, None, {"last_hidden_state": "last_hidden_state"}),
    "ForMaskedLM": (jm.BertForMaskedLM, None, {"mlm_logits": "logits"}),
    "ForSequenceClassification": (jm.BertForSequenceClassification, 3, {"logits": "logits"}),
    "ForTokenClassification": (jm.BertForTokenClassification, 5, {"logits": "logits"}),
    "ForQuestionAnswering": (jm.BertForQuestionAnswering, None, {"start_logits": "start_logits",
                                                                   "end_logits": "end_logits"}),
    "ForMultipleChoice": (jm.BertForMultipleChoice, None, {"logits": "logits"}),
    "ForPreTraining": (jm.BertForReplacedTokenDetection, None, {"logits": "logits"}),
}
CASES = [(t, h) for t in ("roberta", "distilbert", "electra") for h in HEADS
         if h != "ForPreTraining" or t == "electra"]
# The aliases share RoBERTa's code: its MLM and classification heads, and a regressor (num_labels=1).
CASES += [("xlm-roberta", "ForMaskedLM"), ("xlm-roberta", "ForSequenceClassification"),
          ("camembert", "ForSequenceClassification"), ("roberta", "regression")]


def _hf_model(model_type, head, seed=0):
  make, prefix, _ = FAMILIES[model_type]
  config = make()
  suffix = "ForSequenceClassification" if head == "regression" else head
  config.num_labels = 1 if head == "regression" else (HEADS[suffix][1] or 2)
  config._attn_implementation = "eager"
  torch.manual_seed(seed)
  model = getattr(transformers, prefix + suffix)(config).eval()
  with torch.no_grad():  # LayerNorms and biases start at ones/zeros: perturb them so they are tested.
    for name, p in model.named_parameters():
      if "norm" in name.lower() or name.endswith("bias"):
        p.add_(0.3 * torch.randn_like(p))
  return model


def _batch(model_type, shape=(3, 12), seed=0):
  """Rows 1 and 2 end in padding (the family's pad id, as its tokenizer pads)."""
  pad = FAMILIES[model_type][2]
  rng = np.random.default_rng(seed)
  ids = rng.integers(3, 99, shape).astype(np.int32)
  mask = np.ones(shape, np.int32)
  mask[..., 1, 8:] = 0
  mask[..., 2, 5:] = 0
  return np.where(mask > 0, ids, pad).astype(np.int32), mask


def _hf_outputs(model, ids, mask, fields):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long), attention_mask=torch.tensor(mask, dtype=torch.long))
  return {name: out[hf].numpy() for name, hf in fields.items()}


def _jbert_outputs(cls, config, params, ids, mask, fields, **packed):
  num_labels = jm.head(cls).model_kwargs(_num_labels(params))
  out = cls(config, **num_labels).apply({"params": params}, ids, attention_mask=mask, **packed)
  return {name: np.asarray(getattr(out, name)) for name in fields}


def _num_labels(params):
  return np.shape(params["classifier"]["kernel"])[-1] if "classifier" in params else None


def _close(got, want, where):
  for name in want:
    g, w = got[name], want[name]
    assert g.shape == w.shape, (where, name, g.shape, w.shape)
    err = float(np.max(np.abs(g - w)))
    assert err <= TOL, f"{where} {name}: max abs diff {err}"


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """Each case's transformers folder, written once."""
  out = {}
  for model_type, head in CASES:
    path = tmp_path_factory.mktemp(f"{model_type}-{head}")
    _hf_model(model_type, head).save_pretrained(path)
    out[model_type, head] = str(path)
  return out


@pytest.mark.parametrize("model_type,head", CASES, ids=[f"{t}-{h}" for t, h in CASES])
def test_family_head_equals_transformers_unpacked_packed_and_exported(model_type, head, folders, tmp_path):
  suffix = "ForSequenceClassification" if head == "regression" else head
  cls, _, fields = HEADS[suffix]
  hf = _hf_model(model_type, head)
  info = jbert.describe(folders[model_type, head])
  assert info.head.cls is cls and info.config.model_type == model_type
  config, params = jbert.load_pretrained(folders[model_type, head], cls)
  shape = (2, 3, 10) if cls is jm.BertForMultipleChoice else (3, 12)
  ids, mask = _batch(model_type, shape)
  want = _hf_outputs(hf, ids, mask, fields)
  _close(_jbert_outputs(cls, config, params, ids, mask, fields), want, "unpacked")

  # Packed: two sequences (rows 1 and 2's real tokens) end to end in one row, padding after.
  if cls is not jm.BertForMultipleChoice:
    a, b = ids[1, :8], ids[2, :5]
    pad = FAMILIES[model_type][2]
    row = np.full((1, 16), pad, np.int32)
    row[0, :13] = np.concatenate([a, b])
    seg = np.zeros((1, 16), np.int32)
    seg[0, :8], seg[0, 8:13] = 1, 2
    extra = {"cls_positions": np.array([[0, 8]], np.int32)} if cls is jm.BertForSequenceClassification else {}
    got = _jbert_outputs(cls, config, params, row, np.ones_like(row), fields, segment_ids=seg, **extra)
    for name, value in got.items():
      if cls is jm.BertForSequenceClassification:
        np.testing.assert_allclose(value[0], want[name][1:3], atol=TOL, rtol=0)
      else:  # per-token outputs: each sequence's tokens as it computes alone
        np.testing.assert_allclose(value[0, :8], want[name][1, :8], atol=TOL, rtol=0)
        np.testing.assert_allclose(value[0, 8:13], want[name][2, :5], atol=TOL, rtol=0)

  else:  # Packed choices: example 0's three endings (10, 8 and 5 tokens) end to end, one score per <s>.
    lengths = mask[0].sum(-1)
    row = np.concatenate([ids[0, c, :n] for c, n in enumerate(lengths)])[None]
    seg = np.concatenate([np.full(n, c + 1) for c, n in enumerate(lengths)])[None].astype(np.int32)
    cls_positions = np.concatenate([[0], np.cumsum(lengths)[:-1]])[None].astype(np.int32)
    got = _jbert_outputs(cls, config, params, row, np.ones_like(row), fields, segment_ids=seg,
                         cls_positions=cls_positions)
    np.testing.assert_allclose(got["logits"], want["logits"][:1], atol=TOL, rtol=0)

  # Exported: transformers loads it as the same class, every weight found, the same outputs.
  out = jbert.save_pretrained(config, params, tmp_path / "export", cls)
  loaded, report = getattr(transformers, type(hf).__name__).from_pretrained(out, output_loading_info=True)
  assert not report["missing_keys"] and not report["unexpected_keys"] and not report["mismatched_keys"], report
  auto = transformers.AutoConfig.from_pretrained(out)
  assert auto.model_type == model_type and auto.architectures == [type(hf).__name__]
  _close(_hf_outputs(loaded.eval(), ids, mask, fields), want, "export")


@pytest.mark.parametrize("model_type,architecture", [("deberta-v2", "DebertaV2ForMaskedLM"),
                                                     ("mpnet", "MPNetForMaskedLM"),
                                                     ("funnel", "FunnelForMaskedLM")])
def test_a_folder_of_a_family_jbert_does_not_compute_is_refused_in_one_line(model_type, architecture, folders,
                                                                            tmp_path):
  """Nothing is read beyond config.json: the weights of a real model of that family are never mapped."""
  import shutil  # pylint: disable=g-import-not-at-top
  folder = tmp_path / model_type
  shutil.copytree(folders["roberta", "ForMaskedLM"], folder)
  config = json.loads((folder / "config.json").read_text())
  (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type,
                                                  "architectures": [architecture]}))
  for read in (jbert.describe, lambda p: jbert.load_pretrained(p, jm.BertForMaskedLM)):
    with pytest.raises(ValueError) as e:
      read(str(folder))
    message = str(e.value)
    assert "\n" not in message and f"model_type {model_type!r} is not supported" in message
    assert "roberta, xlm-roberta, camembert, distilbert, electra, modernbert" in message


def test_a_head_the_family_lacks_is_named(folders):
  with pytest.raises(ValueError, match=r"roberta models have no BertForPreTraining head in transformers; this "
                                       r"family's heads: BertModel, BertForMaskedLM, "):
    jbert.load_pretrained(folders["roberta", "ForMaskedLM"], jm.BertForPreTraining)


@pytest.mark.parametrize("model_type,runtime", [
    ("roberta", dict(attention_impl="einsum")), ("distilbert", dict(attention_impl="xla", scan_layers=True)),
    ("electra", dict(attention_impl="einsum", remat_policy="full", scan_layers=True)),
    ("xlm-roberta", dict(attention_impl="xla")), ("roberta", dict(attention_impl="splash"))],
    ids=["roberta-einsum", "distilbert-xla-scan", "electra-einsum-remat-scan", "xlm-roberta-xla",
         "roberta-splash"])
def test_every_attention_kernel_and_layer_layout_computes_the_family(model_type, runtime, folders):
  cls, _, fields = HEADS["ForMaskedLM"]
  config, params = jbert.load_pretrained(folders[model_type, "ForMaskedLM"], cls, **runtime)
  ids, mask = _batch(model_type)
  want = _hf_outputs(_hf_model(model_type, "ForMaskedLM"), ids, mask, fields)
  got = _jbert_outputs(cls, config, params, ids, mask, fields)
  if runtime["attention_impl"] == "splash":  # a padded query attends to padding there: rows without padding
    got, want = ({k: v[:1] for k, v in d.items()} for d in (got, want))
  _close(got, want, str(runtime))
