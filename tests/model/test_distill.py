"""Distillation losses against the reference implementations written in torch: DistilBERT's KL and cosine losses,
TinyBERT's projected MSE, sentence-transformers' MSELoss and MiniLM's attention and value relations."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from jbert.model import BertConfig, BertModel, distill, init_params, student

rng = np.random.default_rng(0)
B, T, C, H = 4, 6, 5, 8
MASK = np.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0], [1, 1, 0, 0, 0, 0]], bool)


def _ratio(sums):
  total, weight = sums
  return float(total / weight)


@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_soft_targets_equal_distilberts_kl_times_t_squared(temperature):
  s, t = rng.normal(size=(B, C)).astype(np.float32) * 3, rng.normal(size=(B, C)).astype(np.float32) * 3
  s_t = torch.tensor(s, requires_grad=True)
  # DistilBERT's distiller.py: ce_loss_fct = nn.KLDivLoss(reduction="batchmean").
  ref = torch.nn.KLDivLoss(reduction="batchmean")(F.log_softmax(s_t / temperature, dim=-1),
                                                 F.softmax(torch.tensor(t) / temperature, dim=-1)) * temperature ** 2
  ref.backward()
  loss = lambda s, t: _ratio(distill.soft_target_sums(s, t, temperature=temperature))
  assert loss(s, t) == pytest.approx(ref.item(), rel=1e-5)
  fn = lambda s, t: (lambda a, b: a / b)(*distill.soft_target_sums(s, t, temperature=temperature))
  g_s, g_t = jax.jit(jax.grad(fn, argnums=(0, 1)))(s, t)
  np.testing.assert_allclose(g_s, s_t.grad.numpy(), rtol=1e-4, atol=1e-6)
  np.testing.assert_array_equal(g_t, 0.0)  # the teacher is frozen
  assert _ratio(distill.soft_target_sums(t, t, temperature=temperature)) == pytest.approx(0.0, abs=1e-6)


def test_soft_targets_per_token_and_weighted():
  s, t = rng.normal(size=(B, T, C)).astype(np.float32), rng.normal(size=(B, T, C)).astype(np.float32)
  # DistilBERT's MLM distillation: the attended tokens' logits selected, then batchmean over them.
  sel = torch.tensor(MASK)
  ref = torch.nn.KLDivLoss(reduction="batchmean")(F.log_softmax(torch.tensor(s)[sel] / 2, -1),
                                                 F.softmax(torch.tensor(t)[sel] / 2, -1)) * 4
  total, weight = distill.soft_target_sums(s, t, MASK, temperature=2.0)
  assert weight == MASK.sum() and float(total / weight) == pytest.approx(ref.item(), rel=1e-5)
  # Fractional weights: the weighted sum of per-example KLs, and two halves of a batch add up to the whole.
  w = np.array([0.5, 1.0, 0.0, 2.0], np.float32)
  per_example = torch.nn.KLDivLoss(reduction="none")(F.log_softmax(torch.tensor(s[:, 0]), -1),
                                                    F.softmax(torch.tensor(t[:, 0]), -1)).sum(-1).numpy()
  total, weight = distill.soft_target_sums(s[:, 0], t[:, 0], w)
  assert float(total) == pytest.approx(float((w * per_example).sum()), rel=1e-5) and float(weight) == 3.5
  halves = [distill.soft_target_sums(s[i:i + 2, 0], t[i:i + 2, 0], w[i:i + 2]) for i in (0, 2)]
  assert float(halves[0][0] + halves[1][0]) == pytest.approx(float(total), rel=1e-6)


def test_cosine_equals_distilberts_cosine_embedding_loss():
  s, t = rng.normal(size=(B, T, H)).astype(np.float32), rng.normal(size=(B, T, H)).astype(np.float32)
  s_t = torch.tensor(s, requires_grad=True)
  # DistilBERT's distiller.py: the attended tokens' last hidden states, CosineEmbeddingLoss with target 1.
  sel = torch.tensor(MASK).unsqueeze(-1).expand_as(s_t)
  s_slct, t_slct = torch.masked_select(s_t, sel).view(-1, H), torch.masked_select(torch.tensor(t), sel).view(-1, H)
  ref = torch.nn.CosineEmbeddingLoss(reduction="mean")(s_slct, t_slct, s_slct.new(s_slct.size(0)).fill_(1))
  ref.backward()
  assert _ratio(distill.cosine_sums(s, t, MASK)) == pytest.approx(ref.item(), rel=1e-5)
  g = jax.jit(jax.grad(lambda s: (lambda a, b: a / b)(*distill.cosine_sums(s, t, MASK))))(s)
  np.testing.assert_allclose(g, s_t.grad.numpy(), rtol=1e-4, atol=1e-7)
  zero = distill.cosine_sums(np.zeros((1, H), np.float32), t[0, :1])  # torch's epsilon: 1 - 0, not NaN
  assert float(zero[0]) == 1.0
  assert np.isfinite(jax.grad(lambda s: distill.cosine_sums(s, t[0, :1])[0])(np.zeros((1, H), np.float32))).all()


def test_mse_equals_sentence_transformers_and_tinybert():
  s, t = rng.normal(size=(B, H)).astype(np.float32), rng.normal(size=(B, H)).astype(np.float32)
  # sentence-transformers' MSELoss: torch.nn.MSELoss()(student embeddings, teacher embeddings).
  assert _ratio(distill.mse_sums(s, t)) == pytest.approx(torch.nn.MSELoss()(torch.tensor(s), torch.tensor(t)).item(),
                                                         rel=1e-6)
  # TinyBERT: MSELoss(fit_dense(student hidden), teacher hidden), a student 6 wide and a teacher 8 wide; here over
  # the attended tokens.
  hs, ht = rng.normal(size=(B, T, 6)).astype(np.float32), rng.normal(size=(B, T, H)).astype(np.float32)
  projection = distill.HiddenProjection(H)
  boxed = projection.init(jax.random.key(0), hs)["params"]
  assert {k: (v.value.shape, v.names) for k, v in boxed["dense"].items()} == {
      "kernel": ((6, H), ("embed", None)), "bias": ((H,), (None,))}
  params = nn.meta.unbox(boxed)
  assert float(np.std(params["dense"]["kernel"])) == pytest.approx(0.02, rel=0.3)
  params = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
  fit_dense = torch.nn.Linear(6, H)
  with torch.no_grad():
    fit_dense.weight.copy_(torch.tensor(np.asarray(params["dense"]["kernel"]).T))
    fit_dense.bias.copy_(torch.tensor(np.asarray(params["dense"]["bias"])))
  sel = torch.tensor(MASK)
  ref = torch.nn.MSELoss()(fit_dense(torch.tensor(hs)[sel]), torch.tensor(ht)[sel])
  ours = distill.mse_sums(projection.apply({"params": params}, hs), ht, MASK)
  assert _ratio(ours) == pytest.approx(ref.item(), rel=1e-5)


def test_uniform_layer_map_and_bad_arguments():
  assert distill.uniform_layer_map(6, 12) == (0, 2, 4, 6, 8, 10, 12)
  assert distill.uniform_layer_map(4, 12) == (0, 3, 6, 9, 12)
  assert distill.uniform_layer_map(3, 3) == (0, 1, 2, 3)
  with pytest.raises(ValueError, match="cannot map onto a teacher of 6"):
    distill.uniform_layer_map(7, 6)
  with pytest.raises(ValueError, match="must have the same shape; map the teacher's layers"):
    distill.mse_sums(np.zeros((2, 6)), np.zeros((2, 8)))
  with pytest.raises(ValueError, match=r"weights \(3,\) must have the leading shape \(2,\)"):
    distill.cosine_sums(np.zeros((2, 8)), np.zeros((2, 8)), np.ones(3))
  with pytest.raises(ValueError, match="temperature must be positive, got 0"):
    distill.soft_target_sums(np.zeros((2, 3)), np.zeros((2, 3)), temperature=0)
  with pytest.raises(ValueError, match="regression head\) are always 0; distil a regression head with mse_sums"):
    distill.soft_target_sums(np.zeros((2, 1)), np.zeros((2, 1)))


# ------------------------------------------------------------------------------------------------------ MiniLM
def _minilm_reference(t_att, s_att, t_val, s_val, mask):
  """MiniLM (v1) in torch, as its paper writes it: KL of the last layer's attention distributions and of its value
  relations softmax(V V^T / sqrt(d)), per head and query token, averaged over heads and the batch's tokens."""
  m = torch.tensor(mask, dtype=torch.float32)
  tiny = torch.finfo(torch.float32).tiny

  def kl(teacher_p, student_log_p):  # [B, N, T, T] -> [B, T], mean over heads
    return F.kl_div(student_log_p, teacher_p, reduction="none").sum(-1).mean(1)

  def value_relation(v):  # [B, T, N, D] -> [B, N, T, T] logits, masked keys -10000 (BERT's additive mask)
    v = v.permute(0, 2, 1, 3)
    return v @ v.transpose(-1, -2) / v.shape[-1] ** 0.5 + (1 - m)[:, None, None, :] * -10000.0

  at = kl(t_att, torch.log(s_att.clamp_min(tiny)))
  vr = kl(F.softmax(value_relation(t_val), -1), F.log_softmax(value_relation(s_val), -1))
  return ((at * m).sum() / m.sum()).item(), ((vr * m).sum() / m.sum()).item()


def test_minilm_relations_on_real_models_against_torch():
  teacher_config = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
                              intermediate_size=64, max_position_embeddings=16)
  student_config = teacher_config.replace(hidden_size=16, num_hidden_layers=2, intermediate_size=32)
  ids = rng.integers(1, 50, size=(B, T)).astype(np.int32) * MASK
  outputs = {}
  for name, config, seed in (("teacher", teacher_config, 0), ("student", student_config, 1)):
    model = BertModel(config, add_pooling_layer=False)
    # Random weights with query and key kernels far larger than BERT's 0.02 init, so that attention is far from
    # uniform and the losses far from 0 (and no init program to compile: only the shapes are traced).
    shapes = nn.meta.unbox(jax.eval_shape(lambda: init_params(model, jax.random.key(seed), ids.shape)))
    std = lambda path: 0.4 if {"query", "key"} & {k.key for k in path} else 0.1
    params = jax.tree_util.tree_map_with_path(
        lambda path, x: (path[-1].key == "scale") + rng.normal(0, std(path), x.shape).astype(np.float32), shapes)
    apply = jax.jit(lambda p: model.apply({"params": p}, ids, attention_mask=MASK.astype(np.int32),
                                          output_attentions=True, output_hidden_states=True, mutable=["intermediates"],
                                          capture_intermediates=lambda m, _: m.name == "value"))
    out, state = apply(params)
    last = config.num_hidden_layers - 1
    values = distill.attention_projection(student.layer_params(params, last)["attention"], out.hidden_states[last])
    captured = state["intermediates"]["encoder"][f"layer_{last}"]["attention"]["value"]["__call__"][0]
    np.testing.assert_allclose(values, captured, atol=1e-5)  # the recomputed values are the model's
    outputs[name] = (out.attentions[-1], values)

  (t_att, t_val), (s_att, s_val) = outputs["teacher"], outputs["student"]
  at = distill.relation_kl_sums(distill.attention_log_probs(t_att), distill.attention_log_probs(s_att), MASK)
  vr = distill.relation_kl_sums(distill.relation_log_probs(t_val, MASK), distill.relation_log_probs(s_val, MASK), MASK)
  ref_at, ref_vr = _minilm_reference(*(torch.tensor(np.asarray(x)) for x in (t_att, s_att, t_val, s_val)), MASK)
  assert _ratio(at) == pytest.approx(ref_at, rel=1e-4) and ref_at > 0.05
  assert _ratio(vr) == pytest.approx(ref_vr, rel=1e-4) and ref_vr > 0.02
  assert _ratio(distill.relation_kl_sums(distill.attention_log_probs(t_att), distill.attention_log_probs(t_att),
                                         MASK)) == pytest.approx(0.0, abs=1e-6)

  # MiniLM v2: relations over 8 relation heads of the concatenated values, whatever each model's head size
  # (teacher 32 wide, student 16 wide): the same as v1's relation of the values re-split into 8 heads.
  split = lambda v, r: np.asarray(v).reshape(B, T, r, -1)
  v2 = distill.relation_log_probs(np.asarray(s_val).reshape(B, T, -1), MASK, num_heads=8)
  np.testing.assert_allclose(v2, distill.relation_log_probs(split(s_val, 8), MASK), atol=1e-5)
  both = distill.relation_kl_sums(distill.relation_log_probs(t_val, MASK, num_heads=8),
                                  distill.relation_log_probs(s_val, MASK, num_heads=8), MASK)
  ref = _minilm_reference(*(torch.tensor(np.asarray(x)) for x in (t_att, s_att, split(t_val, 8), split(s_val, 8))),
                          MASK)[1]
  assert _ratio(both) == pytest.approx(ref, rel=1e-4)
  # Gradients reach the student's values only, and stay finite with padded keys.
  loss = lambda s, t: distill.relation_kl_sums(distill.relation_log_probs(t, MASK), distill.relation_log_probs(s, MASK),
                                               MASK)[0]
  grad = jax.jit(jax.grad(loss, argnums=(0, 1)))(jnp.asarray(s_val), jnp.asarray(s_val) * 2)
  assert np.isfinite(grad[0]).all() and np.abs(grad[0]).max() > 0 and np.all(grad[1] == 0)
  with pytest.raises(ValueError, match="give both the same number of relation heads"):
    distill.relation_kl_sums(distill.relation_log_probs(t_val, MASK), distill.relation_log_probs(s_val, MASK,
                                                                                                num_heads=2), MASK)
