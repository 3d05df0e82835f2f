"""Request bodies read and checked, and the answers' JSON: OpenAI's embeddings, infinity's and
text-embeddings-inference's rerank, jbert.predict's records. Every refusal is an ApiError whose message names the
field and what it takes."""
from __future__ import annotations

import base64
import json
from typing import Any

import numpy as np

from jbert.serve.models import ApiError

# The largest body read: a full queue of long inputs fits many times over; anything larger is refused unread.
MAX_BODY_BYTES = 32 << 20


def parse_body(raw: bytes, content_type: str) -> dict[str, Any]:
  media = content_type.split(";")[0].strip().lower()
  if media != "application/json":
    raise ApiError(415, f"Content-Type is {media or 'missing'}; send the body as JSON with Content-Type: "
                        "application/json.")
  try:
    body = json.loads(raw)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ApiError(400, f"the body is not valid JSON ({e}); send a JSON object.") from None
  if not isinstance(body, dict):
    raise ApiError(400, f"the body is a JSON {type(body).__name__}, not an object; send {{\"input\": ...}}.")
  return body


def flag(body: dict, name: str, default: bool = False) -> bool:
  value = body.get(name, default)
  if value is None:
    return default
  if not isinstance(value, bool):
    raise ApiError(400, f"\"{name}\" is {json.dumps(value)[:40]}; give true or false.")
  return value


def embedding_inputs(body: dict) -> list[str | list[int]]:
  """OpenAI's `input`: a string, a list of strings, a list of token ids, or a list of such lists."""
  if "input" not in body:
    raise ApiError(400, "the body has no \"input\"; give a string, a list of strings or of token-id lists.")
  value = body["input"]
  if isinstance(value, str):
    return [value]
  if not isinstance(value, list) or not value:
    what = "an empty list" if value == [] else f"a JSON {type(value).__name__}"
    raise ApiError(400, f"\"input\" is {what}; give a string, a non-empty list of strings, or token-id lists.")
  if all(_is_id(x) for x in value):
    return [value]
  for i, x in enumerate(value):
    if isinstance(x, str):
      continue
    if isinstance(x, list) and x and all(_is_id(t) for t in x):
      continue
    raise ApiError(400, f"\"input\"[{i}] is {json.dumps(x)[:40]}; every input must be a string or a non-empty list "
                        "of token ids (integers).")
  return value


def _is_id(x: Any) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def dimensions(body: dict, full: int) -> int:
  value = body.get("dimensions")
  if value is None:
    return full
  if not _is_id(value) or not 1 <= value <= full:
    raise ApiError(400, f"\"dimensions\" is {json.dumps(value)[:40]}; give an integer in [1, {full}] (the model's "
                        "width).")
  return value


def encoding_format(body: dict) -> str:
  value = body.get("encoding_format") or "float"
  if value not in ("float", "base64"):
    raise ApiError(400, f"\"encoding_format\" is {json.dumps(value)[:40]}; give \"float\" or \"base64\".")
  return value


def embeddings_answer(vectors: np.ndarray, *, fmt: str, dims: int, normalize: bool, model: str,
                      tokens: int) -> dict:
  """OpenAI's list of embeddings; `dims` < the width cuts each vector (Matryoshka) and, where the model
  normalises, makes it unit length again."""
  if dims < vectors.shape[1]:
    vectors = vectors[:, :dims]
    if normalize:
      norms = np.linalg.norm(vectors, axis=1, keepdims=True)
      vectors = (vectors / np.where(norms > 0, norms, 1)).astype(np.float32)
  data = []
  for i, v in enumerate(vectors):
    value = base64.b64encode(np.ascontiguousarray(v, "<f4").tobytes()).decode() if fmt == "base64" else v.tolist()
    data.append({"object": "embedding", "index": i, "embedding": value})
  return {"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def rerank_request(body: dict) -> tuple[str, list[str], int | None, bool]:
  """(query, documents, top_n, return_documents): infinity's `documents` or text-embeddings-inference's
  `texts`, `return_documents` or `return_text`."""
  query = body.get("query")
  if not isinstance(query, str):
    raise ApiError(400, "\"query\" must be a string (the text the documents are ranked for).")
  key = "documents" if "documents" in body else "texts"
  docs = body.get(key)
  if not isinstance(docs, list) or not docs:
    raise ApiError(400, f"\"{key}\" must be a non-empty list of strings (the texts to rank).")
  for i, d in enumerate(docs):
    if not isinstance(d, str):
      raise ApiError(400, f"\"{key}\"[{i}] is {json.dumps(d)[:40]}; every document must be a string.")
  top_n = body.get("top_n")
  if top_n is not None and (not _is_id(top_n) or top_n < 1):
    raise ApiError(400, f"\"top_n\" is {json.dumps(top_n)[:40]}; give a positive integer.")
  returned = flag(body, "return_documents", flag(body, "return_text"))
  return query, docs, top_n, returned


def rerank_answer(scores: np.ndarray, docs: list[str], *, top_n: int | None, returned: bool, model: str,
                  tokens: int) -> dict:
  order = sorted(range(len(scores)), key=lambda i: -scores[i])[:top_n]  # stable: ties keep the given order
  results = [{"index": i, "relevance_score": float(scores[i]), **({"document": docs[i]} if returned else {})}
             for i in order]
  return {"object": "rerank", "results": results, "model": model,
          "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}


def predict_inputs(body: dict) -> list[Any]:
  """`inputs` (or `input`): what `jbert.predict(inputs, model)` takes, one input or a list."""
  key = "inputs" if "inputs" in body else "input"
  if key not in body:
    raise ApiError(400, "the body has no \"inputs\"; give a list of texts, [text, pair] lists or objects with the "
                        "task's fields (as jbert.predict reads them).")
  value = body[key]
  if isinstance(value, (str, dict)):
    return [value]
  if not isinstance(value, list) or not value:
    raise ApiError(400, f"\"{key}\" is {'an empty list' if value == [] else json.dumps(value)[:40]}; give a "
                        "non-empty list of inputs.")
  # JSON has no tuples: a [text, pair] list is the (text, pair) tuple jbert.predict takes.
  return [tuple(x) if isinstance(x, list) else x for x in value]


def error_body(status: int, message: str) -> dict:
  kind = "invalid_request_error" if status < 500 else ("overloaded_error" if status == 503 else "server_error")
  return {"error": {"message": message, "type": kind, "code": status}}
