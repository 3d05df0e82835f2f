"""bench/attention_cpu.py at a toy size: every pair it times computes the same thing."""
import script_module

bench = script_module.load("bench/attention_cpu.py")


def test_kernels_and_encoders_it_times_agree():
  parts = bench.attention_parts(batch=2, length=16, heads=2, head_dim=8)
  assert parts["forward_max_abs_diff"] < 1e-5
  assert parts["train_grad_max_rel_diff"] < 1e-5
  assert set(parts["forward_ms_per_row"]) == {"jax.nn.dot_product_attention", "jbert_xla"}
  encoder = bench.encoder(batch=2, length=16, hidden=32, layers=1, heads=2, intermediate=64)
  assert encoder["max_abs_diff"] < 1e-5
  assert all(ms > 0 for ms in encoder["ms_per_row"].values())
