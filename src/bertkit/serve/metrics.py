"""Prometheus metrics of one service (its own registry, so two apps in a process never mix).

Names follow TEI's `prometheus.rs` in spirit, under the `bertkit_` prefix:
requests by route and outcome (success, validation, overloaded, ...), durations as histograms
(whole request, time queued before the model, model time per run), and per model run its
batch size (inputs) and tokens; gauges for the queue and the inputs in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["CONTENT_TYPE_LATEST", "Metrics"]  # the content type goes with the text it describes

# Latency buckets from 1 ms to 30 s: a single short sentence on a CPU takes a few ms; an
# overloaded queue seconds.
SECONDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
TOKENS = (16, 64, 256, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter("bertkit_requests", "HTTP requests answered, by route and outcome",
                                ["route", "outcome"], registry=r)
        self.request_seconds = Histogram("bertkit_request_duration_seconds", "time to answer a request",
                                         ["route"], buckets=SECONDS, registry=r)
        self.queue_seconds = Histogram("bertkit_queue_duration_seconds", "time a request waited "
                                       "for the model thread", ["model"], buckets=SECONDS, registry=r)
        self.inference_seconds = Histogram("bertkit_inference_duration_seconds", "model time of "
                                           "one run (inputs of several requests)", ["model", "use"],
                                           buckets=SECONDS, registry=r)
        self.batch_size = Histogram("bertkit_batch_size", "inputs in one model run", ["model", "use"],
                                    buckets=SIZES, registry=r)
        self.batch_tokens = Histogram("bertkit_batch_tokens", "tokens in one model run", ["model", "use"],
                                      buckets=TOKENS, registry=r)
        self.batch_requests = Histogram("bertkit_batch_requests", "requests merged into one model "
                                        "run", ["model", "use"], buckets=SIZES, registry=r)
        self.trim_seconds = Histogram("bertkit_memory_trim_duration_seconds", "time the model thread "
                                      "spent giving freed C heap memory back to the OS (malloc_trim)",
                                      buckets=SECONDS, registry=r)
        self.queue_size = Gauge("bertkit_queue_size", "requests waiting for the model thread", registry=r)
        self.in_flight = Gauge("bertkit_inputs_in_flight", "admitted inputs not yet answered", registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
