"""What a served model computes, over loopback HTTP: a request whose own input overflows (finite weights, a
non-finite output) is a 500 naming that input, never a number, and a request that shared its batch is answered as
if it had been alone."""
import asyncio

import httpx
import numpy as np

from inference.tiny_models import VOCAB, random_torch_model, write_vocab


def test_a_non_finite_output_is_a_500_naming_the_input_and_its_batch_mates_are_answered(serve, tmp_path):
  from safetensors.numpy import load_file, save_file  # pylint: disable=import-outside-toplevel
  folder = tmp_path / "overflowing"
  random_torch_model("BertModel", seed=15).save_pretrained(folder)
  write_vocab(folder)
  state = load_file(folder / "model.safetensors")
  state["embeddings.word_embeddings.weight"][VOCAB.index("cat")] = 3e38  # finite; any sum with it is inf
  save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
  # The loop waits up to a second for more, so the two requests sent together share a batch.
  served = serve(f"--model=m={folder}", "--pooling=mean", "--max_batch_tokens=256", "--max_wait_ms=1000")
  served.wait_ready()
  alone = httpx.post(served.url + "/v1/embeddings", json={"input": ["the sun", "a red bird"]}, timeout=60).json()

  async def together():
    async with httpx.AsyncClient(base_url=served.url, timeout=60) as client:
      return await asyncio.gather(client.post("/v1/embeddings", json={"input": ["the dog", "a cat sat"]}),
                                  client.post("/v1/embeddings", json={"input": ["the sun", "a red bird"]}))

  bad, good = asyncio.run(together())
  assert bad.status_code == 500
  assert bad.json()["error"]["message"] == (
      "the model's outputs for inputs 1 (0-based) are not finite (NaN or inf): the weights overflow on these inputs "
      "(e.g. float16/bfloat16 range, or a damaged model); try --dtype=float32 or another model.")
  assert good.status_code == 200
  np.testing.assert_array_equal([d["embedding"] for d in good.json()["data"]],
                                [d["embedding"] for d in alone["data"]])
  assert 'jbert_serve_requests_total{endpoint="embeddings",status="500"} 1.0' in httpx.get(served.url + "/metrics").text
