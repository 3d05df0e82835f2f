"""Parameter tree: counts, shapes and logical axis names as docs/ARCHITECTURE.md documents them."""
import flax.linen as nn
import jax
import numpy as np
import pytest

import jbert.model as jm

TINY = jm.BertConfig.from_preset("tiny", vocab_size=100, max_position_embeddings=32, type_vocab_size=3)
V, H, P, S, F, N, D = 100, 128, 32, 3, 512, 2, 64


def _abstract(model):
  """Boxed params as ShapeDtypeStructs: nothing is allocated."""
  return jax.eval_shape(lambda: jm.init_params(model, jax.random.key(0)))


def _flat(tree):
  is_box = lambda x: isinstance(x, nn.LogicallyPartitioned)
  leaves = jax.tree_util.tree_leaves_with_path(tree, is_leaf=is_box)
  return {"/".join(k.key for k in path): leaf for path, leaf in leaves}


def _count(model):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.meta.unbox(_abstract(model))))


@pytest.mark.parametrize("cls,preset,scan,expected", [
    (jm.BertModel, "base", False, 109_482_240),
    (jm.BertModel, "base", True, 109_482_240),
    (jm.BertForPreTraining, "base", False, 110_106_428),
    (jm.BertModel, "large", True, 335_141_888),
])
def test_parameter_counts(cls, preset, scan, expected):
  assert _count(cls(jm.BertConfig.from_preset(preset, scan_layers=scan))) == expected


_BACKBONE = {
    "embeddings/word_embeddings/embedding": ((V, H), ("vocab", "embed")),
    "embeddings/position_embeddings/embedding": ((P, H), (None, "embed")),
    "embeddings/token_type_embeddings/embedding": ((S, H), (None, "embed")),
    "embeddings/norm/scale": ((H,), ("embed",)),
    "embeddings/norm/bias": ((H,), ("embed",)),
    "pooler/kernel": ((H, H), ("embed", "transform")),
    "pooler/bias": ((H,), ("transform",)),
}
_LAYER = {
    **{f"attention/{p}/kernel": ((H, N, D), ("embed", "heads", "kv")) for p in ("query", "key", "value")},
    **{f"attention/{p}/bias": ((N, D), ("heads", "kv")) for p in ("query", "key", "value")},
    "attention/out/kernel": ((N, D, H), ("heads", "kv", "embed")),
    "attention/out/bias": ((H,), ("embed",)),
    "attention_norm/scale": ((H,), ("embed",)),
    "attention_norm/bias": ((H,), ("embed",)),
    "mlp/wi/kernel": ((H, F), ("embed", "mlp")),
    "mlp/wi/bias": ((F,), ("mlp",)),
    "mlp/wo/kernel": ((F, H), ("mlp", "embed")),
    "mlp/wo/bias": ((H,), ("embed",)),
    "output_norm/scale": ((H,), ("embed",)),
    "output_norm/bias": ((H,), ("embed",)),
}


def _expected_backbone(scan, pooler=True):
  tree = {k: v for k, v in _BACKBONE.items() if pooler or not k.startswith("pooler")}
  for name, (shape, axes) in _LAYER.items():
    if scan:
      tree[f"encoder/layers/{name}"] = ((2,) + shape, ("layers",) + axes)
    else:
      tree.update({f"encoder/layer_{i}/{name}": (shape, axes) for i in range(2)})
  return tree


def _shapes_and_names(model):
  flat = _flat(_abstract(model))
  assert all(isinstance(x, nn.LogicallyPartitioned) for x in flat.values())
  return {k: (x.value.shape, tuple(x.names)) for k, x in flat.items()}


@pytest.mark.parametrize("scan", [False, True])
def test_bert_model_tree(scan):
  got = _shapes_and_names(jm.BertModel(TINY.replace(scan_layers=scan)))
  assert got == _expected_backbone(scan)


def _bert(tree, pooler=True):
  return {f"bert/{k}": v for k, v in _expected_backbone(False, pooler).items()} | tree


@pytest.mark.parametrize("model,expected", [
    (jm.BertForPreTraining(TINY), _bert({
        "mlm/transform/kernel": ((H, H), ("embed", "transform")), "mlm/transform/bias": ((H,), ("transform",)),
        "mlm/norm/scale": ((H,), ("embed",)), "mlm/norm/bias": ((H,), ("embed",)),
        "mlm/output_bias": ((V,), ("vocab",)),
        "nsp/kernel": ((H, 2), ("embed", None)), "nsp/bias": ((2,), (None,))})),
    (jm.BertForMaskedLM(TINY), _bert({
        "mlm/transform/kernel": ((H, H), ("embed", "transform")), "mlm/transform/bias": ((H,), ("transform",)),
        "mlm/norm/scale": ((H,), ("embed",)), "mlm/norm/bias": ((H,), ("embed",)),
        "mlm/output_bias": ((V,), ("vocab",))}, pooler=False)),
    (jm.BertForSequenceClassification(TINY, num_labels=3), _bert({
        "classifier/kernel": ((H, 3), ("embed", None)), "classifier/bias": ((3,), (None,))})),
    (jm.BertForTokenClassification(TINY, num_labels=7), _bert({
        "classifier/kernel": ((H, 7), ("embed", None)), "classifier/bias": ((7,), (None,))}, pooler=False)),
    (jm.BertForQuestionAnswering(TINY), _bert({
        "qa_outputs/kernel": ((H, 2), ("embed", None)), "qa_outputs/bias": ((2,), (None,))}, pooler=False)),
    (jm.BertForMultipleChoice(TINY), _bert({
        "classifier/kernel": ((H, 1), ("embed", None)), "classifier/bias": ((1,), (None,))})),
], ids=lambda x: type(x).__name__ if isinstance(x, nn.Module) else "")
def test_head_trees(model, expected):
  assert _shapes_and_names(model) == expected


def test_partition_spec_names_match_rank():
  boxed = _abstract(jm.BertForPreTraining(TINY.replace(scan_layers=True)))
  specs = nn.get_partition_spec(boxed)
  shapes = nn.meta.unbox(boxed)
  for spec, x in zip(jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec)),
                     jax.tree.leaves(shapes)):
    assert len(spec) == len(x.shape)
  wi = specs["bert"]["encoder"]["layers"]["mlp"]["wi"]["kernel"]
  assert wi == jax.sharding.PartitionSpec("layers", "embed", "mlp")


def test_initialisation_statistics():
  config = jm.BertConfig.from_preset("mini", vocab_size=2000, initializer_range=0.05)
  params = _flat(nn.meta.unbox(jm.init_params(jm.BertForPreTraining(config), jax.random.key(0))))
  for name, x in params.items():
    x = np.asarray(x)
    if name.endswith("/scale"):
      np.testing.assert_array_equal(x, 1.0)
    elif name.endswith("bias"):
      np.testing.assert_array_equal(x, 0.0)
    elif x.size > 10_000:  # Kernels and embeddings: plain normal(initializer_range).
      assert abs(x.std() - 0.05) < 0.003 and abs(x.mean()) < 0.003, name


def test_init_params_multiple_choice_default_shape():
  params = nn.meta.unbox(jm.init_params(jm.BertForMultipleChoice(TINY), jax.random.key(0)))
  assert params["classifier"]["kernel"].shape == (H, 1)
