"""The ASGI app (Starlette): the routes, each request read and checked, queued on the batcher, answered.

  POST /v1/embeddings   OpenAI's embeddings (also /embeddings)
  POST /rerank          infinity's / text-embeddings-inference's rerank (also /v1/rerank): a cross-encoder's
                        scores, or a bi-encoder's cosine of the query and each document
  POST /predict         jbert.predict's records, one per input (also /v1/predict)
  GET  /health          200 once warm-up compiled every shape, 503 before
  GET  /v1/models       the served models (also /models)
  GET  /metrics         Prometheus

Errors are JSON `{"error": {"message", "type", "code"}}`; 503s carry Retry-After. A client that disconnects
while its request waits is dropped from the queue (`Batcher.cancel`).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from typing import Any, Awaitable, Callable

import numpy as np
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from jbert.serve import schema
from jbert.serve.batcher import Batcher
from jbert.serve.metrics import Metrics
from jbert.serve.models import ApiError

log = logging.getLogger("jbert")
CLIENT_GONE = 499  # nginx's status for a client that closed the connection; only the metrics see it


class Server:
  """What the routes share: the models by name, the batcher, the metrics, the input limits, readiness."""

  def __init__(self, models: dict, batcher: Batcher, metrics: Metrics, *, max_input_tokens: dict[str, int]):
    self.models, self.batcher, self.metrics = models, batcher, metrics
    self.max_input_tokens = max_input_tokens
    self.ready = False

  def model(self, body: dict, endpoint: str):
    name = body.get("model")
    if name is None and len(self.models) == 1:
      name = next(iter(self.models))
    if not isinstance(name, str) or name not in self.models:
      what = "no \"model\"" if name is None else f"model {json.dumps(name)[:80]}"
      raise ApiError(404 if isinstance(name, str) else 400,
                     f"{what}: this server serves {', '.join(sorted(self.models))} (GET /v1/models).")
    model = self.models[name]
    if endpoint not in model.describe()["endpoints"]:
      serving = [n for n, m in self.models.items() if endpoint in m.describe()["endpoints"]]
      article = "an" if model.kind[0] in "aeiou" else "a"
      raise ApiError(400, f"model {name} is {article} {model.kind} model; {endpoint} is served by "
                          f"{', '.join(serving) or 'none of them'}.")
    return model

  async def compute(self, request: Request, model, work) -> Any:
    """Queues `work` and waits for its answer, or for the client to leave (then it is dropped unanswered)."""
    job = self.batcher.submit(model, work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
      await asyncio.wait({job.future, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
      gone.cancel()
    if not job.future.done():
      self.batcher.cancel(job)
      raise ClientDisconnect()
    return job.future.result()


async def _disconnected(request: Request) -> None:
  while (await request.receive())["type"] != "http.disconnect":
    pass


async def _body(request: Request) -> dict:
  size = int(request.headers.get("content-length") or 0)
  if size > schema.MAX_BODY_BYTES:
    raise ApiError(413, f"the body has {size:,} bytes, more than {schema.MAX_BODY_BYTES:,}; send fewer inputs a "
                        "request.")
  chunks, total = [], 0
  async for chunk in request.stream():
    total += len(chunk)
    if total > schema.MAX_BODY_BYTES:
      raise ApiError(413, f"the body has more than {schema.MAX_BODY_BYTES:,} bytes; send fewer inputs a request.")
    chunks.append(chunk)
  request.state.body_bytes = total
  return schema.parse_body(b"".join(chunks), request.headers.get("content-type", ""))


# A request of about a sentence is tokenised on the event loop, a larger one on a worker thread so that the loop
# answers others meanwhile. Handing a sentence to a worker cost more than tokenising it: at 32 clients of short
# inputs, inline gave 8-13% more inputs/s in three interleaved pairs; for long inputs (~1.1 kB a request, 0.5 ms
# to tokenise) the worker thread was as fast or faster.
INLINE_BODY_BYTES = 1024


async def _prepare(request: Request, fn: Callable[..., Any], *args, **kwargs) -> Any:
  if request.state.body_bytes <= INLINE_BODY_BYTES:
    return fn(*args, **kwargs)
  return await run_in_threadpool(fn, *args, **kwargs)


async def embeddings(server: Server, request: Request) -> dict:
  body = await _body(request)
  model = server.model(body, "/v1/embeddings")
  inputs = schema.embedding_inputs(body)
  fmt, dims = schema.encoding_format(body), schema.dimensions(body, model.dim)
  truncate = schema.flag(body, "truncate")
  features = await _prepare(request, model.features, inputs, max_input_tokens=server.max_input_tokens[model.name],
                            truncate=truncate)
  work = model.work(features)
  vectors = await server.compute(request, model, work)
  return schema.embeddings_answer(vectors, fmt=fmt, dims=dims, normalize=model.normalize, model=model.name,
                                  tokens=work.tokens)


async def rerank(server: Server, request: Request) -> dict:
  body = await _body(request)
  model = server.model(body, "/rerank")
  query, docs, top_n, returned = schema.rerank_request(body)
  truncate, limit = schema.flag(body, "truncate"), server.max_input_tokens[model.name]
  if model.kind == "embedding":  # a bi-encoder: cosine of the query's embedding and each document's
    features = await _prepare(request, model.features, [query] + docs, max_input_tokens=limit, truncate=truncate)
    work = model.work(features)
    vectors = (await server.compute(request, model, work)).astype(np.float64)
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    scores = vectors[1:] @ vectors[0]
  else:  # a cross-encoder: jbert.search --rerank's scores of (query, document)
    examples, tokens = await _prepare(request, model.examples, [(query, d) for d in docs], max_input_tokens=limit,
                                               truncate=truncate)
    work = model.work(examples, tokens)
    records = await server.compute(request, model, work)
    scores = np.array([r["score"] if "score" in r else r["value"] for r in records], np.float64)
  return schema.rerank_answer(scores, docs, top_n=top_n, returned=returned, model=model.name, tokens=work.tokens)


async def predict(server: Server, request: Request) -> dict:
  body = await _body(request)
  model = server.model(body, "/predict")
  inputs = schema.predict_inputs(body)
  examples, tokens = await _prepare(request, model.examples, inputs, max_input_tokens=server.max_input_tokens[
      model.name], truncate=schema.flag(body, "truncate"))
  work = model.work(examples, tokens)
  records = await server.compute(request, model, work)
  return {"object": "list", "model": model.name, "predictions": records,
          "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def _endpoint(server: Server, name: str, handler: Callable[[Server, Request], Awaitable[dict]]):
  async def route(request: Request) -> Response:
    start = time.monotonic()
    try:
      if not server.ready:
        raise ApiError(503, "the server is warming up (compiling its shapes); retry when GET /health answers 200.",
                       retry_after=2)
      answer = await handler(server, request)
      _check_finite(answer)
      status, response = 200, JSONResponse(answer)
    except ClientDisconnect:
      status, response = CLIENT_GONE, Response(status_code=CLIENT_GONE)
    except ApiError as e:
      server.metrics.rejected.labels(str(e.status)).inc()
      status = e.status
      headers = {"Retry-After": str(e.retry_after)} if e.retry_after else {}
      if status == 503 and server.batcher.closing:
        headers["Connection"] = "close"
      response = JSONResponse(schema.error_body(status, e.message), status_code=status, headers=headers)
    except Exception as e:  # pylint: disable=broad-except  (a bug: logged, and still a JSON answer)
      log.exception("jbert.serve: %s failed", name)
      status = 500
      response = JSONResponse(schema.error_body(500, f"internal error: {type(e).__name__}: {e}"), status_code=500)
    server.metrics.requests.labels(name, str(status)).inc()
    server.metrics.latency.labels(name).observe(time.monotonic() - start)
    return response
  return route


def _check_finite(answer: dict) -> None:
  # The Runner refuses non-finite outputs; a Matryoshka cut or a cosine can still not make one, but an answer is
  # never allowed to carry NaN as a number (JSONResponse would write it as an invalid `NaN`).
  for item in answer.get("data", ()):
    if isinstance(item["embedding"], list) and not all(math.isfinite(x) for x in item["embedding"]):
      raise ApiError(500, f"the embedding of input {item['index']} is not finite.")


def build(server: Server) -> Starlette:
  async def health(request: Request) -> Response:
    del request
    if not server.ready:
      return JSONResponse({"status": "warming up"}, status_code=503, headers={"Retry-After": "2"})
    if server.batcher.closing:
      return JSONResponse({"status": "shutting down"}, status_code=503)
    return JSONResponse({"status": "ok", "queued_inputs": server.batcher.pending})

  async def models(request: Request) -> Response:
    del request
    return JSONResponse({"object": "list", "data": [
        {"id": name, "object": "model", "owned_by": "jbert", "path": m.path,
         "max_input_tokens": server.max_input_tokens[name], **m.describe()} for name, m in server.models.items()]})

  async def metrics(request: Request) -> Response:
    del request
    content, media = server.metrics.render()
    return Response(content, media_type=media)

  post = [("/v1/embeddings", "embeddings", embeddings), ("/embeddings", "embeddings", embeddings),
          ("/rerank", "rerank", rerank), ("/v1/rerank", "rerank", rerank),
          ("/predict", "predict", predict), ("/v1/predict", "predict", predict)]
  routes = [Route(path, _endpoint(server, name, handler), methods=["POST"]) for path, name, handler in post]
  routes += [Route("/health", health, methods=["GET"]), Route("/v1/models", models, methods=["GET"]),
             Route("/models", models, methods=["GET"]), Route("/metrics", metrics, methods=["GET"])]
  app = Starlette(routes=routes, exception_handlers={404: _not_found, 405: _not_allowed})
  return app


async def _not_found(request: Request, exc) -> Response:
  del exc
  return JSONResponse(schema.error_body(404, f"no route {request.url.path}; POST /v1/embeddings, /rerank or "
                                             "/predict, GET /health, /v1/models or /metrics."), status_code=404)


async def _not_allowed(request: Request, exc) -> Response:
  del exc
  return JSONResponse(schema.error_body(405, f"{request.method} is not allowed on {request.url.path}; see GET "
                                             "/v1/models for the endpoints."), status_code=405)
