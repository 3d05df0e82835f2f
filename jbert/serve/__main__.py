r"""Serve model folders over HTTP: embeddings (OpenAI's API), re-ranking (infinity's / TEI's) and predictions.

  python -m jbert.serve --model=all-MiniLM-L6-v2 --port=8080
  python -m jbert.serve --model=emb=DIR --model=rerank=CROSS_ENCODER_DIR --model=sst2=WORKDIR/export

Each --model is served under its folder's name, or NAME=PATH. Requests from every connection queue for one device
loop that packs them into a few compiled shapes (`jbert.serve.batcher`); on a CPU host of several cores each batch
is split over compute worker processes, one a core, each on one thread (`jbert.serve.compute`). Warm-up compiles
those shapes before GET /health answers 200. SIGTERM (or Ctrl-C) stops accepting, answers what was accepted, then exits 0; a second one
exits at once (status 143). Bad flags, a missing or unservable model, a busy port: one line, exit status 2.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading

from jbert import errors

PROGRAM = "jbert.serve"
FORCED_EXIT = 128 + 15  # what a shell reports for a process SIGTERM ended


class _Parser(argparse.ArgumentParser):

  def error(self, message):  # one line and status 2, as every jbert command
    print(f"{PROGRAM}: {message}; see --help.", file=sys.stderr, flush=True)
    sys.exit(errors.EXIT_STATUS)


def _positive(name: str, least: int = 1, most: int | None = None):
  def parse(text: str) -> int:
    try:
      value = int(text)
    except ValueError:
      raise argparse.ArgumentTypeError(f"--{name}={text} is not an integer") from None
    if value < least:
      raise argparse.ArgumentTypeError(f"--{name}={value} must be at least {least}")
    if most is not None and value > most:
      raise argparse.ArgumentTypeError(f"--{name}={value} must be at most {most}")
    return value
  return parse


def parse_args(argv):
  p = _Parser(prog=f"python -m {PROGRAM}", description=__doc__.split("\n\n")[0],
              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", action="append", required=True, metavar="[NAME=]PATH",
                 help="A model folder to serve (repeatable): sentence-transformers, CrossEncoder, a fine-tuned "
                      "classifier/regressor/NER/QA folder or workdir export, or a plain encoder (with --pooling).")
  p.add_argument("--host", default="127.0.0.1", help="Address to listen on (default 127.0.0.1; 0.0.0.0 for all).")
  p.add_argument("--port", type=_positive("port", 0, 65535), default=8080, help="TCP port (default 8080).")
  p.add_argument("--max_batch_tokens", type=_positive("max_batch_tokens"), default=8192,
                 help="Tokens one device batch takes from the queue at most (default 8192); also sets the rows "
                      "of a batch: max_batch_tokens / the model's max_length.")
  p.add_argument("--max_wait_ms", type=_positive("max_wait_ms", 0), default=2,
                 help="Once a request is queued, how long the device loop waits for more before it runs "
                      "(default 2 ms; while it computes, requests queue anyway).")
  p.add_argument("--max_queue", type=_positive("max_queue"), default=2048,
                 help="Inputs accepted and not yet answered, at most (default 2048); past it requests get 503 "
                      "with Retry-After.")
  p.add_argument("--max_input_tokens", type=_positive("max_input_tokens", 3), default=None,
                 help="Longest input in tokens, [CLS] and [SEP] included; longer ones get 413 unless the request "
                      "sends \"truncate\": true (default and upper bound: each model's max_length).")
  p.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                 help="Compute dtype (default: the checkpoint's).")
  p.add_argument("--pooling", default=None, help="Pooling of plain encoders (not sentence-transformers folders, "
                 "which bring their own), e.g. mean or cls, as jbert.embed --pooling.")
  p.add_argument("--normalize", action="store_true", default=None,
                 help="Unit-length embeddings from plain encoders (sentence-transformers folders: their own).")
  p.add_argument("--compute_workers", type=_positive("compute_workers", 0), default=None,
                 help="Processes that compute the batches, each on one XLA:CPU thread (default: one per core on a "
                      "CPU host of several cores; 0: the server's own process, as on accelerators).")
  p.add_argument("--compile_cache", default=None, help="XLA compile cache directory, or off (default: "
                 "$JBERT_COMPILE_CACHE, else ~/.cache/jbert/xla): a restart loads its shapes instead of "
                 "compiling them.")
  return p.parse_args(argv)


def _listen(host: str, port: int) -> socket.socket:
  """The listening socket, bound before any model loads, so a busy port is one line at once."""
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
  except OSError as e:
    sock.close()
    raise errors.UserError(f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port or stop the "
                           "process that holds it.") from None
  sock.listen(2048)
  sock.set_inheritable(True)
  return sock


def main(argv=None) -> int:
  args = parse_args(sys.argv[1:] if argv is None else argv)
  try:
    return _serve(args)
  except (errors.UserError, ValueError, TypeError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
          PermissionError) as e:
    if errors.show_traceback():
      raise
    errors.exit_with(PROGRAM, e)


def _serve(args) -> int:
  # Imported once the flags are read: a bad command line is refused before JAX and the models' code load.
  import uvicorn  # pylint: disable=g-import-not-at-top
  from jbert.runtime import compile_cache, console  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from jbert.serve import app as app_lib, compute, models as models_lib  # pylint: disable=g-import-not-at-top
  from jbert.serve.batcher import Batcher  # pylint: disable=g-import-not-at-top
  from jbert.serve.metrics import Metrics  # pylint: disable=g-import-not-at-top

  specs = [models_lib.model_name(m) for m in args.model]
  names = [n for n, _ in specs]
  if len(set(names)) != len(names):
    twice = sorted({n for n in names if names.count(n) > 1})
    raise errors.UserError(f"two --model values are served as {', '.join(twice)}; name them apart with "
                           "--model=NAME=PATH.")
  sock = _listen(args.host, args.port)
  # No runner.use_every_core(): a server's batches are a few requests, too small to split across XLA:CPU
  # devices; one device (whose matmuls use every core) answered 2-3x more inputs/s here (bench/serve.py).
  console.quiet_library_logs()
  compile_cache.enable(args.compile_cache)
  logging.basicConfig(level=logging.INFO, format="%(message)s")
  options = dict(max_batch_tokens=args.max_batch_tokens, dtype=args.dtype, pooling=args.pooling,
                 normalize=args.normalize)
  served = {name: models_lib.load(name, path, **options) for name, path in specs}
  limits = {}
  for name, model in served.items():
    if args.max_input_tokens is not None and args.max_input_tokens > model.max_length:
      raise errors.UserError(f"--max_input_tokens={args.max_input_tokens} is more than model {name} computes "
                             f"(max_length {model.max_length}); give at most {model.max_length}.")
    limits[name] = args.max_input_tokens or model.max_length
  count = compute.default_workers(jax.default_backend()) if args.compute_workers is None else args.compute_workers
  # Started from the main thread, which the workers' death signal follows.
  pool = compute.Pool(count, specs, options, args.compile_cache) if count else None
  metrics = Metrics()
  batcher = Batcher(max_batch_tokens=args.max_batch_tokens, max_wait_s=args.max_wait_ms / 1000,
                    max_queue=args.max_queue, metrics=metrics, computer=pool)
  server = app_lib.Server(served, batcher, metrics, max_input_tokens=limits)
  config = uvicorn.Config(app_lib.build(server), log_level="warning", access_log=False, lifespan="off",
                          timeout_keep_alive=30)
  http = _Uvicorn(config, batcher)
  threading.Thread(target=_warm_up, args=(server, http, models_lib, compile_cache, pool),
                   name="jbert-serve-warm-up", daemon=True).start()
  http.run(sockets=[sock])
  # uvicorn put the default handlers back; a signal while the queue drains is the second one: exit at once.
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: os._exit(FORCED_EXIT))  # pylint: disable=protected-access
  batcher.close()  # uvicorn waited for the connections; this answers anything still queued
  print(f"{PROGRAM}: stopped; every accepted request was answered.", file=sys.stderr, flush=True)
  return 0


def _warm_up(server, http, models_lib, compile_cache, pool) -> None:
  """Compiles (or loads) every shape where batches will run: in each compute worker, else in this process."""
  before = compile_cache.compiles()
  try:
    if pool is not None:
      programs, took = pool.wait_ready()
    else:
      programs = sum(models_lib.warm_up(m) for m in server.models.values())
      took = compile_cache.compiles() - before
  except Exception:  # pylint: disable=broad-except  (a bug: said once, and the server ends rather than idle unready)
    logging.getLogger("jbert").exception(f"{PROGRAM}: warm-up failed")
    os._exit(1)  # pylint: disable=protected-access
  server.metrics.warm_compiles.set(programs)
  server.metrics.compute_workers.set(pool.ready if pool else 0)
  server.ready = True
  listening = ", ".join(f"{n} ({m.kind})" for n, m in server.models.items())
  where = f"{len(pool.workers)} compute workers" if pool else "this process"
  print(f"{PROGRAM}: ready on http://{http.config.host}:{http.sockname()}: {listening}; warm-up ran {programs} "
        f"shapes in {where} ({took.describe()}).", file=sys.stderr, flush=True)


class _Uvicorn:
  """uvicorn's Server with jbert's signals: the first SIGTERM/SIGINT drains (uvicorn stops accepting and waits
  for the requests in flight, the batcher refuses new ones), a second exits at once; none is re-raised after."""

  def __init__(self, config, batcher):
    import uvicorn  # pylint: disable=g-import-not-at-top

    class Server(uvicorn.Server):
      def handle_exit(self, sig, frame):
        del sig, frame
        if self.should_exit:
          os._exit(FORCED_EXIT)  # pylint: disable=protected-access
        batcher.closing = True
        print(f"{PROGRAM}: stopping: answering the requests accepted, refusing new ones (again to exit at once).",
              file=sys.stderr, flush=True)
        self.should_exit = True

    self.config, self._server, self._sockets = config, Server(config), None

  def sockname(self) -> int:
    return self._sockets[0].getsockname()[1] if self._sockets else 0

  def run(self, sockets) -> None:
    self._sockets = sockets
    self._server.run(sockets=sockets)


if __name__ == "__main__":
  sys.exit(main())
