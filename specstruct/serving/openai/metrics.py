"""Prometheus metrics of one server (its own registry, so several apps can live in one process)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        p = "specstruct_"
        self.requests = Counter(p + "requests", "Requests by endpoint and HTTP status.", ["endpoint", "status"],
                                registry=r)
        self.prompt_tokens = Counter(p + "prompt_tokens", "Prompt tokens processed.", registry=r)
        self.completion_tokens = Counter(p + "completion_tokens", "Tokens generated.", ["mode"], registry=r)
        self.in_flight = Gauge(p + "requests_in_flight", "Requests in the server (queued or running).", registry=r)
        self.queue = Gauge(p + "queue_length", "Requests waiting for the engine.", registry=r)
        self.batch_rows = Gauge(p + "batch_rows", "Rows decoding in the engine's current batch.", registry=r)
        self.latency = Histogram(p + "request_seconds", "End-to-end request latency.", ["endpoint"],
                                 buckets=_LATENCY, registry=r)
        self.ttft = Histogram(p + "time_to_first_token_seconds", "Time to the first generated text.",
                              buckets=_LATENCY, registry=r)
        self.acceptance = Histogram(p + "acceptance_rate", "Share of drafted tokens the target accepted.", ["mode"],
                                    buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0), registry=r)
        self.tokens_per_pass = Histogram(p + "tokens_per_target_pass", "Tokens committed per target pass.",
                                         ["mode"], buckets=(1, 1.25, 1.5, 2, 2.5, 3, 4, 6, 8), registry=r)

    def finished(self, endpoint: str, status: int, seconds: float) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)

    def decoded(self, mode: str, stats: Any) -> None:
        if stats is None:
            return
        self.prompt_tokens.inc(getattr(stats, "prompt_tokens", 0))
        self.completion_tokens.labels(mode).inc(getattr(stats, "new_tokens", 0))
        if getattr(stats, "drafted", 0):
            self.acceptance.labels(mode).observe(stats.acceptance_rate)
        if getattr(stats, "target_forwards", 0):
            self.tokens_per_pass.labels(mode).observe(stats.tokens_per_forward)

    def scrape(self, engine: Any) -> bytes:
        """Prometheus text; the engine-side gauges are read from its scheduler (waiting requests, running rows)."""
        scheduler = getattr(engine, "scheduler", None)
        for gauge, name in ((self.queue, "waiting"), (self.batch_rows, "active")):
            value = getattr(scheduler, name, None)
            if isinstance(value, (int, float)):
                gauge.set(value)
        return generate_latest(self.registry)
