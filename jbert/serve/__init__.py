"""`python -m jbert.serve`: model folders served over HTTP, concurrent requests batched into packed rows.

  models    a folder -> an embedding model (Embedder) or a prediction model (Predictor), its Runner fixed to a
            few packed shapes, warm-up compiling each; checks and tokenises requests, computes many at once
  batcher   the one device loop: a bounded queue, batches of up to --max_batch_tokens, each request answered
            with its own outputs; cancellation of requests whose client left; draining
  schema    request bodies checked (one message naming the field), OpenAI / infinity / jbert.predict answers
  app       the Starlette routes, JSON errors, readiness
  metrics   Prometheus metrics
  __main__  the command: flags, the listening socket, uvicorn with jbert's SIGTERM handling
"""
