"""Programs compiled ahead in worker threads (jbert/runtime/ahead.py): a call runs the program compiled for its
key with the caller's context, computes what the jitted function computes, and a key never submitted falls back
to the jitted function."""
import contextlib
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jbert.runtime import ahead


def test_calls_run_the_programs_compiled_ahead_in_workers_with_the_callers_context():
  jitted = jax.jit(lambda x: jnp.cumsum(x) * 2)
  entered = []

  @contextlib.contextmanager
  def context():
    entered.append(threading.current_thread().name)
    yield

  pool = ahead.pool()
  fn = ahead.Ahead(jitted, lambda x: x.shape, context, pool)
  for n in (4, 8):
    fn.submit((n,), jax.ShapeDtypeStruct((n,), jnp.float32))
  # Arguments known only from another program (as the update's are from the gradient's outputs).
  fn.submit_lazy((3,), lambda: (jax.ShapeDtypeStruct((3,), fn.program((4,)).out_info.dtype),))
  for n in (4, 8, 3):
    x = np.arange(n, dtype=np.float32)
    np.testing.assert_array_equal(fn(x), np.cumsum(x) * 2)
  assert jitted._cache_size() == 0  # every call ran a program compiled ahead
  assert len(entered) == 3 and all(name.startswith("jbert-compile") for name in entered)
  np.testing.assert_array_equal(fn(np.ones(5, np.float32)), np.arange(1, 6) * 2)  # never submitted: the jit
  assert jitted._cache_size() == 1
  pool.shutdown()


def test_a_program_that_fails_to_compile_raises_in_the_caller():
  pool = ahead.pool()
  fn = ahead.Ahead(jax.jit(lambda x: x @ x), lambda x: x.shape, contextlib.nullcontext, pool)
  fn.submit((2, 3), jax.ShapeDtypeStruct((2, 3), jnp.float32))  # [2, 3] @ [2, 3]: no such product
  with pytest.raises(TypeError, match="dot_general"):
    fn(np.ones((2, 3), np.float32))
  pool.shutdown()
