"""The server's Prometheus metrics (`GET /metrics`), in a registry of its own (one per app, so tests can run
several in a process): requests by endpoint and status, latency, queue depth, batches' rows, tokens and padding,
tokens computed (tokens/s is `rate(jbert_serve_tokens_total[1m])`), programs compiled after warm-up."""
from __future__ import annotations

import prometheus_client as prom

# Latency buckets from 5 ms (a short query on an idle accelerator) to a minute (a full queue on a CPU).
_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_POWERS = tuple(float(2 ** k) for k in range(0, 18))


class Metrics:

  def __init__(self):
    self.registry = prom.CollectorRegistry()
    r = self.registry
    self.requests = prom.Counter("jbert_serve_requests", "HTTP requests answered, by endpoint and status.",
                                 ("endpoint", "status"), registry=r)
    self.latency = prom.Histogram("jbert_serve_request_seconds", "Time from a request's arrival to its answer.",
                                  ("endpoint",), buckets=_LATENCY, registry=r)
    self.queue_inputs = prom.Gauge("jbert_serve_queue_inputs", "Inputs accepted and not yet answered (--max_queue "
                                   "bounds it).", registry=r)
    self.queue_wait = prom.Histogram("jbert_serve_queue_seconds", "Time a request waited for its batch.",
                                     buckets=_LATENCY, registry=r)
    self.batch_inputs = prom.Histogram("jbert_serve_batch_inputs", "Inputs a device batch computed together.",
                                       buckets=_POWERS, registry=r)
    self.batch_rows = prom.Histogram("jbert_serve_batch_rows", "Packed rows a device batch ran (embeddings and "
                                     "bi-encoder re-ranking).", buckets=_POWERS, registry=r)
    self.batch_tokens = prom.Histogram("jbert_serve_batch_tokens", "Real tokens a device batch computed.",
                                       buckets=_POWERS, registry=r)
    self.padding = prom.Counter("jbert_serve_padding_tokens", "Tokens computed on padding (packed rows' free "
                                "tails; on accelerators also the rows that fill a batch).", registry=r)
    self.compute_workers = prom.Gauge("jbert_serve_compute_workers", "Compute worker processes warm and taking "
                                      "batches (0: batches run in the server's process).", registry=r)
    self.tokens = prom.Counter("jbert_serve_tokens", "Real tokens computed.", registry=r)
    self.compiles = prom.Counter("jbert_serve_compiles", "XLA programs compiled while serving (after warm-up; "
                                 "0 is the goal).", registry=r)
    self.warm_compiles = prom.Gauge("jbert_serve_warmup_programs", "XLA programs warm-up compiled or loaded.",
                                    registry=r)
    self.cancelled = prom.Counter("jbert_serve_cancelled_inputs", "Inputs dropped because their client "
                                  "disconnected before their batch ran.", registry=r)
    self.rejected = prom.Counter("jbert_serve_rejected", "Requests refused before queueing, by reason.",
                                 ("reason",), registry=r)

  def render(self) -> tuple[bytes, str]:
    return prom.generate_latest(self.registry), prom.CONTENT_TYPE_LATEST
