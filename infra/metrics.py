"""Prometheus metrics of a long-running process, and the small HTTP server that exposes them.

Every process keeps its metrics in one registry (``REGISTRY``) and serves ``/metrics`` (Prometheus text format),
``/healthz`` (the process answers) and ``/readyz`` (it has finished starting: 200, else 503) on
``LITSTREAM_METRICS_HOST:LITSTREAM_METRICS_PORT`` — loopback and a free port by default, so the processes of one
machine never collide; the URL is recorded in the process's health beat (``litstream status`` shows it).
``LITSTREAM_METRICS_PORT=-1`` turns the server off. The metric names are listed in ``docs/dashboard.md``.

Counters the processes already keep in their stats dicts are read at scrape time (:class:`StatsCollector`), so
the hot paths carry no extra bookkeeping; consumer lag comes from librdkafka's own statistics (the high-water
mark of the Fetch responses, which is right even on the embedded broker whose ListOffsets is not).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import health
from .settings import Settings

log = logging.getLogger("litstream.metrics")
REGISTRY = CollectorRegistry(auto_describe=True)
STATS_INTERVAL_MS = 5000  # how often librdkafka reports its statistics (consumer lag) when metrics are served

# -- metrics observed where they happen (every process registers them; only the series a process touches appear) --
DEAD_LETTERS = Counter("litstream_dead_letters", "Messages sent to a dead-letter topic, by the processor that "
                       "sent them, the source topic and the kind of reason (decode, invalid, rejected, error)",
                       ["role", "topic", "reason"], registry=REGISTRY)
SINK_BATCH_SIZE = Histogram("litstream_sink_batch_size", "Messages per span-sink batch (all three topics)",
                            buckets=(1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000), registry=REGISTRY)
SINK_BATCH_SECONDS = Histogram("litstream_sink_batch_seconds", "Span-sink batch latency: decode, insert into "
                               "ClickHouse, dead letters and offset commit", registry=REGISTRY,
                               buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
TRAINER_STEP_SECONDS = Histogram("litstream_trainer_step_seconds", "Duration of one GRPO step (forward, backward, "
                                 "optimizer)", buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
                                 registry=REGISTRY)
TRAINER_TOKENS_PER_SECOND = Gauge("litstream_trainer_tokens_per_second", "Tokens trained per second in the last "
                                  "step", registry=REGISTRY)
POLICY_VERSION = Gauge("litstream_policy_version", "The newest policy version the trainer published",
                       registry=REGISTRY)
TRAINER_REWARD_MEAN = Gauge("litstream_trainer_reward_mean", "Mean reward of the samples of the last step",
                            registry=REGISTRY)

OTLP_REJECTED_SPANS = Counter("litstream_otlp_rejected_spans", "OTLP spans the gateway refused in a request it "
                              "answered 200 (partialSuccess), by the kind of reason (missing_rollout_id, "
                              "unknown_rollout, unknown_attempt, no_attempt, bad_id, no_name, invalid)",
                              ["reason"], registry=REGISTRY)
OTLP_REJECTED_REQUESTS = Counter("litstream_otlp_rejected_requests", "OTLP requests the gateway refused as a "
                                 "whole, by HTTP status (400 undecodable, 413 too large, 415 wrong type, 503 "
                                 "pipeline not answering)", ["status"], registry=REGISTRY)


def record_dead_letter(role: str, source_topic: str, reason_kind: str) -> None:
    DEAD_LETTERS.labels(role=role, topic=source_topic, reason=reason_kind).inc()


# -- counters read from a process's stats dict at scrape time ------------------------------------------------


@dataclass(frozen=True)
class StatSeries:
    """One stats-dict key as one series: ``name`` (without ``_total`` for counters) with fixed labels."""

    name: str
    help: str
    labels: Mapping[str, str] = field(default_factory=dict)
    kind: str = "counter"  # or "gauge"


class StatsCollector(Collector):
    """Exposes numeric entries of ``stats()`` as counters or gauges, each series labelled with the role."""

    def __init__(self, role: str, stats: Callable[[], Mapping[str, Any]], series: Mapping[str, StatSeries]) -> None:
        self.role = role
        self.stats = stats
        self.series = dict(series)

    def collect(self) -> Iterator[Metric]:
        values = dict(self.stats())
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for key, s in self.series.items():
            value = values.get(key)
            if not isinstance(value, (int, float)):
                continue
            label_names = ["role", *s.labels]
            if s.name not in families:
                cls = CounterMetricFamily if s.kind == "counter" else GaugeMetricFamily
                families[s.name] = cls(s.name, s.help, labels=label_names)
            families[s.name].add_metric([self.role, *s.labels.values()], float(value))
        yield from families.values()


def expose_stats(role: str, stats: Callable[[], Mapping[str, Any]], series: Mapping[str, StatSeries]) -> None:
    REGISTRY.register(StatsCollector(role, stats, series))


# -- consumer lag from librdkafka's statistics --------------------------------------------------------------


class LagCollector(Collector):
    """``litstream_consumer_lag{group,topic,partition}``: the newest lag each consumer of this process reported."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lag: dict[tuple[str, str, str], int] = {}

    def on_stats(self, group: str, raw: str) -> None:
        try:
            topics = json.loads(raw).get("topics", {})
        except json.JSONDecodeError:
            return
        seen: dict[tuple[str, str], int] = {}
        for topic, t in topics.items():
            for partition, p in t.get("partitions", {}).items():
                lag = int(p.get("consumer_lag", -1))
                if partition != "-1" and lag >= 0:
                    seen[(topic, partition)] = lag
        self.set_group(group, seen)

    def set_group(self, group: str, lags: Mapping[tuple[str, str], int]) -> None:
        """The group's lag per (topic, partition) this process holds now; partitions not named are dropped."""
        with self.lock:
            for key in [k for k in self.lag if k[0] == group]:
                del self.lag[key]  # a partition moved to another member: its lag is reported there now
            self.lag.update({(group, topic, partition): lag for (topic, partition), lag in lags.items()})

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("litstream_consumer_lag", "Messages between a consumer group's committed "
                                   "offset and the partition's end, per group, topic and partition",
                                   labels=["group", "topic", "partition"])
        with self.lock:
            for (group, topic, partition), lag in sorted(self.lag.items()):
                family.add_metric([group, topic, partition], lag)
        yield family


LAG = LagCollector()
REGISTRY.register(LAG)
_serving = threading.Event()


def serving() -> bool:
    return _serving.is_set()


def kafka_stats_config(group: str) -> dict[str, Any]:
    """Extra confluent-kafka consumer settings that report lag here; nothing when this process serves no metrics
    (statistics cost a little every interval)."""
    if not _serving.is_set():
        return {}
    return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": lambda raw: LAG.on_stats(group, raw)}


# -- the HTTP server ---------------------------------------------------------------------------------------


class MetricsPortError(RuntimeError):
    """The metrics server cannot bind its address; the message says which setting to change."""


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` in a daemon thread; ``mark_ready()`` once the process works."""

    def __init__(self, role: str, host: str, port: int) -> None:
        self.role = role
        self.ready = threading.Event()
        handler = _handler(self)
        try:
            self.httpd = ThreadingHTTPServer((host, port), handler)
        except OSError as exc:
            raise MetricsPortError(f"cannot serve metrics on {host}:{port} ({exc.strerror}); set LITSTREAM_METRICS_PORT "
                               "to a free port (0 picks one, -1 turns the metrics server off)") from None
        self.httpd.daemon_threads = True
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True).start()

    def mark_ready(self) -> None:
        self.ready.set()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _handler(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # scrapes every few seconds: not worth a log line
            pass

        def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(200, generate_latest(REGISTRY), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(200, f"ok {server.role}\n".encode())
            elif path == "/readyz":
                ready = server.ready.is_set()
                self._send(200 if ready else 503, f"{'ready' if ready else 'starting'} {server.role}\n".encode())
            else:
                self._send(404, b"not found: try /metrics, /healthz or /readyz\n")

    return Handler


_server: MetricsServer | None = None


def serve(settings: Settings, role: str) -> MetricsServer | None:
    """Start this process's metrics server (once) as the settings say; None when they turn it off."""
    global _server
    if settings.metrics_port < 0:
        return None
    if _server is None:
        _server = MetricsServer(role, settings.metrics_host, settings.metrics_port)
        _serving.set()
        health.annotate(metrics_url=_server.url)
        log.info("%s metrics on %s/metrics", role, _server.url)
    return _server


def mark_ready() -> None:
    if _server is not None:
        _server.mark_ready()
