"""A student from a teacher's layers (DistilBERT's init) in both parameter layouts, and one layer's parameters."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from jbert.model import (BertConfig, BertForSequenceClassification, BertForTokenClassification, init_params,
                         stack_layers, unstack_layers)
from jbert.model.student import check_teacher_layers, layer_params, student_from_teacher

TEACHER = BertConfig(vocab_size=40, hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32,
                     max_position_embeddings=16)
rng = np.random.default_rng(0)
IDS = rng.integers(1, 40, size=(2, 6)).astype(np.int32)
MASK = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], np.int32)


def _teacher(cls, scan):
  """Random (not init) values in the head's tree, in the scanned or unrolled layout: every layer differs."""
  model = cls(TEACHER, num_labels=3)
  shapes = nn.meta.unbox(jax.eval_shape(lambda: init_params(model, jax.random.key(0), (1, 8))))
  params = jax.tree.map(lambda x: rng.normal(0, 0.2, x.shape).astype(np.float32), shapes)
  return (stack_layers(params) if scan else params), TEACHER.replace(scan_layers=scan)


def _apply(cls, config, params):
  return jax.jit(lambda p: cls(config, num_labels=3).apply({"params": p}, IDS, attention_mask=MASK))(params).logits


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_all_layers_give_the_teachers_outputs_exactly(scan):
  params, config = _teacher(BertForSequenceClassification, scan)
  student_config, student = student_from_teacher(params, config, range(4))
  assert student_config == config
  np.testing.assert_array_equal(_apply(BertForSequenceClassification, student_config, student),
                                _apply(BertForSequenceClassification, config, params))


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_every_other_layer_with_embeddings_and_head_copied(scan):
  params, config = _teacher(BertForTokenClassification, scan)
  student_config, student = student_from_teacher(params, config, [0, 2])
  assert student_config == config.replace(num_hidden_layers=2)
  unrolled = unstack_layers if scan else (lambda p: p)
  teacher_layers, student_layers = unrolled(params)["bert"]["encoder"], unrolled(student)["bert"]["encoder"]
  assert sorted(student_layers) == ["layer_0", "layer_1"]
  for k, i in ((0, 0), (1, 2)):
    jax.tree.map(np.testing.assert_array_equal, student_layers[f"layer_{k}"], teacher_layers[f"layer_{i}"])
    jax.tree.map(np.testing.assert_array_equal, layer_params(student, k), layer_params(params, i))
  jax.tree.map(np.testing.assert_array_equal, student["bert"]["embeddings"], params["bert"]["embeddings"])
  jax.tree.map(np.testing.assert_array_equal, student["classifier"], params["classifier"])
  # The student is a model of its config: the tree of a fresh init of it, and it runs.
  fresh = jax.eval_shape(lambda: init_params(BertForTokenClassification(student_config, num_labels=3),
                                             jax.random.key(0), (1, 8)))
  assert jax.tree.map(lambda x: x.shape, nn.meta.unbox(fresh)) == jax.tree.map(np.shape, student)
  assert _apply(BertForTokenClassification, student_config, student).shape == (2, 6, 3)


def test_the_two_layouts_give_the_same_student_and_boxed_trees_keep_their_names():
  params, config = _teacher(BertForSequenceClassification, False)
  _, unrolled = student_from_teacher(params, config, [1, 3])
  _, scanned = student_from_teacher(stack_layers(params), config.replace(scan_layers=True), [1, 3])
  jax.tree.map(np.testing.assert_array_equal, stack_layers(unrolled), scanned)
  shapes = jax.eval_shape(lambda: init_params(BertForSequenceClassification(config.replace(scan_layers=True)),
                                              jax.random.key(0), (1, 8)))
  boxed = jax.tree.map(lambda box: box.replace_boxed(np.zeros(box.value.shape, np.float32)), shapes,
                       is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  _, student = student_from_teacher(boxed, config.replace(scan_layers=True), [1, 3])
  kernel = student["bert"]["encoder"]["layers"]["attention"]["query"]["kernel"]
  assert isinstance(kernel, nn.LogicallyPartitioned) and kernel.names == ("layers", "embed", "heads", "kv")
  assert kernel.value.shape == (2, 16, 2, 8)


@pytest.mark.parametrize("layers,message", [
    ([], r"student layers \[\]: give strictly increasing teacher layer indices in 0\.\.3, e\.g\. 0,2 for every"),
    ([0, 4], r"the teacher has 4 layers, so 4 is out of range"),
    ([-1, 2], r"so -1 is out of range"),
    ([2, 0], r"\[2, 0\] are not strictly increasing"),
    ([1, 1], r"\[1, 1\] are not strictly increasing"),
    ([0, 1.5], r"student layers \[0, 1\.5\]: give strictly increasing"),
    ([True], r"student layers \[True\]: give"),
    ("0,2", r"student layers '0,2': give"),
    (3, r"student layers 3: give"),
])
def test_bad_teacher_layers_are_one_clear_error(layers, message):
  params, config = _teacher(BertForSequenceClassification, False)
  with pytest.raises(ValueError, match=message):
    student_from_teacher(params, config, layers)
  assert check_teacher_layers(np.array([0, 3]), 4) == (0, 3)


def test_a_config_that_does_not_describe_the_params_is_an_error():
  params, config = _teacher(BertForSequenceClassification, False)
  with pytest.raises(ValueError, match="hold 4 unrolled layers but its config says 4 scanned"):
    student_from_teacher(params, config.replace(scan_layers=True), [0])
  with pytest.raises(ValueError, match="hold 4 unrolled layers but its config says 6 unrolled"):
    student_from_teacher(params, config.replace(num_hidden_layers=6), [0])
  with pytest.raises(ValueError, match="one `encoder` subtree\\); found 0"):
    student_from_teacher({"classifier": params["classifier"]}, config, [0])
  with pytest.raises(ValueError, match="No encoder layer 7"):
    layer_params(params, 7)
