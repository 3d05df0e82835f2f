"""Blocked sliding-window attention (the xla kernel of ModernBERT's local layers): the window's function in
O(T w) work, equal to attention over the window's keys one query at a time."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jbert.model import attention, local_attention


def _reference(q, k, v, allowed_ids, window, same_segment):
  """Each query over the keys within `window` of it: of its own segment, or (same_segment False) real keys."""
  b, t, n, d = q.shape
  out = np.zeros_like(q)
  for r in range(b):
    for i in range(t):
      keys = [j for j in range(t) if abs(i - j) <= window and (
          allowed_ids[r, j] == allowed_ids[r, i] if same_segment else allowed_ids[r, j] > 0)]
      if not keys:  # padding far from every real key (unpacked): no output to compare
        continue
      logits = np.einsum("nd,snd->ns", q[r, i], k[r, keys]) / np.sqrt(d)
      p = np.exp(logits - logits.max(-1, keepdims=True))
      out[r, i] = np.einsum("ns,snd->nd", p / p.sum(-1, keepdims=True), v[r, keys])
  return out


@pytest.mark.parametrize("length,window", [(37, 8), (40, 8), (64, 5)])
@pytest.mark.parametrize("packed", [True, False])
def test_blocks_compute_the_window(length, window, packed):
  """Lengths that are and are not a multiple of the block; packed rows (three sequences, padding) and a padded
  row (real queries compared: a padded query far from every real key has none to attend to)."""
  rng = np.random.default_rng(length)
  q, k, v = (rng.normal(size=(2, length, 2, 16)).astype(np.float32) for _ in range(3))
  segments = np.zeros((2, length), np.int32)
  segments[0, :length - 6] = 1
  segments[1, :11], segments[1, 11:25], segments[1, 25:length - 2] = 1, 2, 3
  mask = segments > 0
  got = np.asarray(local_attention.blocked_attention(q, k, v, jnp.asarray(mask),
                                                     jnp.asarray(segments) if packed else None, window))
  want = _reference(q, k, v, segments if packed else mask.astype(np.int32), window, packed)
  if packed:
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
  else:
    np.testing.assert_allclose(got[mask], want[mask], atol=1e-5, rtol=0)
  via_kernel = attention.fused_attention("xla", q, k, v, jnp.asarray(mask), jnp.asarray(segments) if packed else None,
                                         "cpu", window=window)
  np.testing.assert_array_equal(np.asarray(via_kernel), got)


def test_short_rows_take_the_mask_and_long_rows_cost_t_times_w():
  assert not local_attention.worthwhile(192, 64) and local_attention.worthwhile(193, 64)

  def flops(length, window):
    q = jax.ShapeDtypeStruct((1, length, 4, 64), jnp.float32)
    mask = jax.ShapeDtypeStruct((1, length), jnp.bool_)
    f = jax.jit(lambda q, mask: attention.fused_attention("xla", q, q, q, mask, None, "cpu", window=window))
    return f.lower(q, mask).compile().cost_analysis()["flops"]

  # ModernBERT's window (64 each side): 3 x 64 keys a query instead of the row, at 2,048 and 4,096 tokens.
  for length in (2048, 4096):
    local, full = flops(length, 64), flops(length, None)
    assert local < full * 4 * 64 / length, (length, local, full)
  assert flops(4096, 64) < 2.2 * flops(2048, 64)  # linear in T
