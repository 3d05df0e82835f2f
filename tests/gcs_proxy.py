"""An HTTP proxy in front of the test GCS emulator (tests/gcs_emulator.py) that breaks it the ways real storage
breaks, for the fault-injection tests of tests/test_storage_failures.py.

* `down()` / `up()`: an outage. While down, every request's connection is closed before any answer (what a
  client sees when the network or the storage front end drops it); `up()` serves again, with every object the
  emulator held, so a rerun of the same command can resume. `down_at(pattern)` starts the outage at the first
  request whose decoded path matches: at a chosen point of a run, whatever its speed.
* `generations=False`: a storage that answers without object generations (no `x-goog-generation` header, no
  `generation` field in the JSON), as gcp-storage-emulator does. Orbax's arrays (tensorstore) cannot be written
  there: tensorstore's conditional writes need the generation.

Point a command at `proxy.url` (STORAGE_EMULATOR_HOST) instead of the emulator's.
"""
from __future__ import annotations

import http.client
import http.server
import json
import re
import socket
import threading
import urllib.parse

HOST = "127.0.0.1"
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "proxy-connection", "te", "trailer",
        "upgrade"}


class Proxy:
  """Forwards every request to `upstream` (host, port); `requests` counts those it answered."""

  def __init__(self, upstream: tuple[str, int], *, generations: bool = True):
    self.upstream = upstream
    self.generations = generations
    self.requests = 0
    self._down = threading.Event()
    self._trigger: re.Pattern[str] | None = None
    self._lock = threading.Lock()
    proxy = self

    class Handler(http.server.BaseHTTPRequestHandler):
      protocol_version = "HTTP/1.1"

      def log_message(self, *args):  # the tests' output is the commands', not the proxy's
        pass

      def _any(self):
        proxy._forward(self)  # pylint: disable=protected-access

      do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _any  # noqa: N815

    self._server = http.server.ThreadingHTTPServer((HOST, 0), Handler)
    self._server.daemon_threads = True
    self._server.handle_error = lambda request, address: None  # a client gone mid-answer is the outage itself
    self.port = self._server.server_address[1]
    self.url = f"http://{HOST}:{self.port}"
    self._thread = threading.Thread(target=self._server.serve_forever, name="gcs_proxy", daemon=True)
    self._thread.start()

  def down(self) -> None:
    self._down.set()

  def down_at(self, pattern: str) -> None:
    self._trigger = re.compile(pattern)

  def up(self) -> None:
    self._trigger = None
    self._down.clear()

  @property
  def is_down(self) -> bool:
    return self._down.is_set()

  def close(self) -> None:
    self._server.shutdown()
    self._server.server_close()

  def _forward(self, handler: http.server.BaseHTTPRequestHandler) -> None:
    trigger = self._trigger
    if trigger is not None and trigger.search(urllib.parse.unquote(handler.path)):
      self._down.set()
    if self._down.is_set():
      _drop(handler)
      return
    body = _read_body(handler)
    headers = {k: v for k, v in handler.headers.items() if k.lower() not in _HOP}
    connection = http.client.HTTPConnection(*self.upstream, timeout=60)
    try:
      connection.request(handler.command, handler.path, body=body, headers=headers)
      response = connection.getresponse()
      data = response.read()
    except OSError:
      _drop(handler)
      return
    finally:
      connection.close()
    if self._down.is_set():  # the outage began while the emulator answered: the answer is lost with it
      _drop(handler)
      return
    if not self.generations and "json" in (response.getheader("Content-Type") or ""):
      data = json.dumps(_without_generations(json.loads(data))).encode()
    handler.send_response_only(response.status, response.reason)
    for key, value in response.getheaders():
      if key.lower() in _HOP or (not self.generations and key.lower().startswith("x-goog-") and
                                 "generation" in key.lower()):
        continue
      handler.send_header(key, value)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    if handler.command != "HEAD":
      handler.wfile.write(data)
    with self._lock:
      self.requests += 1


def _read_body(handler: http.server.BaseHTTPRequestHandler) -> bytes | None:
  if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
    chunks = []
    while True:
      size = int(handler.rfile.readline().split(b";")[0].strip(), 16)
      if size == 0:
        handler.rfile.readline()
        return b"".join(chunks)
      chunks.append(handler.rfile.read(size))
      handler.rfile.readline()
  length = int(handler.headers.get("Content-Length") or 0)
  return handler.rfile.read(length) if length else None


def _drop(handler: http.server.BaseHTTPRequestHandler) -> None:
  """Closes the client's connection with no answer (a reset, as when a front end goes away)."""
  handler.close_connection = True
  try:
    handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    handler.connection.shutdown(socket.SHUT_RDWR)
  except OSError:
    pass


def _without_generations(value):
  if isinstance(value, dict):
    return {k: _without_generations(v) for k, v in value.items() if k not in ("generation", "metageneration")}
  if isinstance(value, list):
    return [_without_generations(v) for v in value]
  return value
