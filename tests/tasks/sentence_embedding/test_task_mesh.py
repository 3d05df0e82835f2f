"""mnrl on a mesh: the in-batch negatives are the whole global batch, so 8 devices give the 1-device loss."""
import flax.linen as nn
import jax
import numpy as np
import pytest

from jbert.model import BertConfig, init_params
from jbert.runtime import sharding
from jbert.tasks.sentence_embedding import task as se
from jbert.tasks.base import training_loss
from tasks.sentence_data import random_batch


@pytest.mark.devices(8)
def test_mnrl_loss_on_8_devices_equals_the_1_device_loss():
  config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=16)
  tasks = [se.MultipleNegativesRanking(encoder=se.Encoder(), max_seq_length=16, columns={"text_c": "negative"},
                                       symmetric=symmetric) for symmetric in (False, True)]
  model = tasks[0].model(config)
  params = nn.meta.unbox(init_params(model, jax.random.key(0)))
  batch = random_batch(0, rows=16, texts=3, length=16, vocab=64)  # (anchor, positive, hard negative) rows

  def losses(params, batch):  # [plain, symmetric] mnrl of the global batch
    outputs = tasks[0].apply(model, params, batch, jax.random.key(0), deterministic=True)
    return [training_loss(t, t.loss(outputs, batch)) for t in tasks]

  got = {}
  for n in (8, 1):
    mesh = sharding.make_mesh(devices=jax.devices()[:n])
    with jax.set_mesh(mesh), nn.logical_axis_rules(sharding.DEFAULT_RULES):
      sharded = jax.device_put(batch, sharding.batch_sharding(mesh))
      assert len(sharded["input_ids"].sharding.device_set) == n
      got[n] = np.asarray(jax.jit(losses, in_shardings=(sharding.replicated(mesh), sharding.batch_sharding(mesh)))(
          params, sharded))
  np.testing.assert_allclose(got[8], got[1], rtol=1e-6, atol=1e-6)
  # Each device ranking only its own 2 rows would give a much smaller loss: the negatives came from all 16.
  local = np.mean([jax.jit(losses)(params, {k: v[i:i + 2] for k, v in batch.items()}) for i in range(0, 16, 2)], 0)
  assert np.all(got[8] > local + 0.5), (got[8], local)
