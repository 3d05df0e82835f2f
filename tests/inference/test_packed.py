"""Packed inference (`jbert.inference.packed`): placement, per-input outputs equal to each input run alone, a few
compiled shapes, isolation of a row's sequences, errors naming the input; `jbert.embed` packed by default."""
import jax.numpy as jnp
import numpy as np
import pytest

import jbert
from jbert.inference import packed
from jbert.inference import runner as runner_lib
from inference.test_runner import MODEL, _features, _mesh, _params  # the runner tests' tiny BERT
from inference.tiny_models import TEXTS


def hidden_fn(params, batch):
  """Token vectors [B, T, H] and the pooler's [B, H]; packed, the pooler's per slot [R, S, H]."""
  extra = {k: batch[k] for k in ("segment_ids", "position_ids", "cls_positions") if k in batch}
  out = MODEL.apply({"params": params}, batch["input_ids"], batch["token_type_ids"], batch["attention_mask"],
                    **extra)
  return {"hidden": out.last_hidden_state, "pooled": out.pooled_output}


def test_plan_is_best_fit_decreasing_and_cuts_rows_into_batches():
  # 30 opens row 0; 20 opens row 1; 10 fits row 1 only; 5 opens row 2; 3 fits row 2 only.
  batches = packed.plan([5, 30, 10, 20, 3], batch_sizes=(2, 1), buckets=(32,), slots=4)
  assert [(b.features.tolist(), b.placement.row.tolist(), b.placement.slot.tolist(), b.placement.offset.tolist(),
           b.size) for b in batches] == [([1, 2, 3], [0, 1, 1], [0, 1, 0], [0, 20, 0], 2), ([0, 4], [0, 0], [0, 1],
                                                                                          [0, 5], 1)]
  # Many inputs: each placed once, rows within the token and slot budgets, full batches but the last.
  lengths = np.random.default_rng(0).integers(2, 33, 500)
  batches = packed.plan(lengths, batch_sizes=(8, 4, 2, 1), buckets=(16, 32), slots=4)
  assert sorted(np.concatenate([b.features for b in batches]).tolist()) == list(range(500))
  for b in batches:
    tokens = np.bincount(b.placement.row, weights=lengths[b.features], minlength=b.size)
    assert tokens.max() <= 32 and np.bincount(b.placement.row).max() <= 4 and b.placement.slot.max() < 4
  assert [b.size for b in batches[:-1]] == [8] * (len(batches) - 1) and batches[-1].size in (8, 4, 2, 1)
  assert {b.row_length for b in batches} == {32}
  with pytest.raises(ValueError, match="more than the packed rows' 32"):
    packed.plan([33], batch_sizes=(1,), buckets=(16, 32), slots=4)


def test_rows_follow_the_lengths_of_the_call():
  buckets = (4, 8, 12, 16, 24, 32, 128)

  def rows(lengths):
    return [length for length, _ in packed.tiers(np.array(lengths), buckets=buckets, batch_rows=8)]

  assert rows([6]) == [8]  # a query: its own bucket, not 128 tokens
  assert rows([10] * 20) == [24]  # twice the 90th percentile (20 -> 24): a couple of inputs a row
  assert rows([10] * 200) == [24]  # many inputs: the same rows, more of them
  assert rows([3, 3, 100]) == [128]  # the longest input decides when it is longer
  # A long tail: rows of twice the 90th percentile (10 -> 24) for the many, rows of their own for the long tenth.
  (short, many), (long, few) = packed.tiers(np.array([10] * 95 + [100] * 5), buckets=buckets, batch_rows=8)
  assert (short, many.tolist(), long, few.tolist()) == (24, list(range(95)), 128, list(range(95, 100)))
  (batch,) = packed.plan([6], batch_sizes=(8, 4, 2, 1), buckets=buckets)
  assert (batch.row_length, batch.slots, batch.size) == (8, 1, 1)


def test_packed_outputs_equal_each_input_run_alone_in_input_order():
  params = _params()
  features = _features(45, seed=1)
  runner = runner_lib.Runner(hidden_fn, params, key="test-packed", max_length=40, batch_size=4, mesh=_mesh(1),
                             token_outputs=("hidden",), packing=True)
  got = runner.run(features)
  unpacked = runner_lib.Runner(hidden_fn, params, key="test-packed", max_length=40, batch_size=4, mesh=_mesh(1),
                               token_outputs=("hidden",)).run(features)
  for f, a, b in zip(features, got, unpacked):
    assert a["hidden"].shape == (len(f["input_ids"]), 32) and a["pooled"].shape == (32,)
    np.testing.assert_allclose(a["hidden"], b["hidden"], atol=1e-5, rtol=0)
    np.testing.assert_allclose(a["pooled"], b["pooled"], atol=1e-5, rtol=0)


def test_a_packed_call_compiles_a_few_shapes_whatever_the_lengths():
  params = _params()
  features = _features(200, seed=2)

  def fn(params, batch):
    return {"pooled": hidden_fn(params, batch)["pooled"]}

  before = runner_lib.compiled_count()
  runner_lib.Runner(fn, params, key="test-packed-shapes", max_length=40, batch_size=8, mesh=_mesh(1),
                    packing=True).run(features)
  assert runner_lib.compiled_count() - before <= 2  # one tier here (rows of 40): a full and a partial batch
  lengths = [len(f["input_ids"]) for f in features]
  bucketed = runner_lib.plan_batches(lengths, 8, runner_lib.bucket_lengths(40))
  assert len({(p.length, p.size) for p in bucketed}) > 8  # what the same call compiles length-bucketed


def test_a_sequence_never_moves_its_row_neighbours():
  params = _params()
  features = _features(12, seed=3, max_len=12)
  runner = runner_lib.Runner(hidden_fn, params, key="test-packed", max_length=40, batch_size=4, mesh=_mesh(1),
                             token_outputs=("hidden",), packing=True, packed_slots=5)
  before = runner.run(features)
  changed = [dict(f) for f in features]
  changed[0] = {"input_ids": [7] * len(features[0]["input_ids"]), "token_type_ids": features[0]["token_type_ids"]}
  after = runner.run(changed)  # the same lengths: the same rows, the same neighbours
  assert not np.allclose(before[0]["pooled"], after[0]["pooled"])
  for a, b in zip(before[1:], after[1:]):
    np.testing.assert_array_equal(a["hidden"], b["hidden"])
    np.testing.assert_array_equal(a["pooled"], b["pooled"])


def test_bad_ids_name_the_input_and_its_own_position():
  features = _features(9, seed=4, max_len=10)
  features[6]["input_ids"][3] = 77
  runner = runner_lib.Runner(hidden_fn, _params(), key="test-packed", max_length=40, batch_size=4, mesh=_mesh(1),
                             vocab_size=50, packing=True)
  with pytest.raises(ValueError, match=r"^input_ids of input 6 holds 77 at position 3, outside \[0, 50\)"):
    runner.run(features)
  with pytest.raises(ValueError, match="packed rows take input_ids and token_type_ids only; input 0 also has "
                                       "positions"):
    runner.run([{**features[0], "positions": [1]}])


def _nan_when_id_is_9(params, batch):
  del params
  bad = jnp.any((batch["input_ids"] == 9) & (batch["attention_mask"] > 0), axis=-1)       # [R]
  value = jnp.where(bad, jnp.nan, 1.0)[:, None] * batch["sequence_weights"]              # [R, S]: the row's slots
  return {"value": value}


def test_a_non_finite_row_names_only_the_inputs_that_overflow_alone():
  """Packed, a NaN reaches the sequences beside it (attention weight 0 times inf); the suspects run again one a
  row, whose outputs (here: the packed row's, so NaN for all) decide."""
  features = [{"input_ids": [1, i, 1], "token_type_ids": [0, 0, 0]} for i in (4, 9, 5, 6, 9, 7)]

  def fn(params, batch):
    if "segment_ids" in batch:
      return _nan_when_id_is_9(params, batch)
    return {"value": jnp.where(jnp.any(batch["input_ids"] == 9, -1), jnp.nan, 1.0)}       # [B]: each alone

  runner = runner_lib.Runner(fn, {}, key="nan-when-9", max_length=8, batch_size=2, mesh=_mesh(1), packing=True,
                             packed_slots=4)
  with pytest.raises(runner_lib.NonFiniteOutput) as error:
    runner.run(features)
  assert error.value.rows == (1, 4)


# ----------------------------------------------------------------------------------------------------------
# jbert.embed packs by default and gives each text's own embedding.
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pooling, layers", [("cls", None), ("mean", None), ("max", None),
                                             ("mean_sqrt_len_tokens", None), ("weightedmean", None),
                                             ("lasttoken", None), ("mean,max", "-2,-1")])
def test_packed_embeddings_equal_unpacked(hf_model_dir, pooling, layers):
  texts = TEXTS + [("a pair of texts", "the second one"), "x"] * 3
  args = dict(pooling=pooling, layers=layers, max_length=24, batch_size=2)
  got = jbert.embed(texts, str(hf_model_dir), **args)
  want = jbert.embed(texts, str(hf_model_dir), packing=False, **args)
  assert got.shape == want.shape and got.shape[0] == len(texts)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)

