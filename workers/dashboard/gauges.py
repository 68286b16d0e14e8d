"""The gateway's own Prometheus series, read from its live views at scrape time: rollouts by status, queue depth,
attempts retried, dead letters by reason (as seen on the dead-letter topics)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from litstream.infra import metrics
from litstream.schemas.models import ROLLOUT_STATUSES
from litstream.workers.store import LitStore

from .data import QUEUED


class GatewayCollector(Collector):
    def __init__(self) -> None:
        self.store: LitStore | None = None
        self.letters: Callable[[], Any] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.store is None:
            return
        replica = self.store.rollouts
        snaps = list(replica.snapshots.values())
        by_status = GaugeMetricFamily("litstream_rollouts", "Rollouts by status (every rollout the store knows, "
                                      "those its replica let go of included)", labels=["status"])
        counts = {s: 0 for s in ROLLOUT_STATUSES}
        for s in snaps:
            counts[s.status] = counts.get(s.status, 0) + 1
        for status, n in list(replica.let_go_statuses.items()):
            counts[status] = counts.get(status, 0) + n
        for status, n in counts.items():
            by_status.add_metric([status], n)
        yield by_status
        yield GaugeMetricFamily("litstream_queue_depth", "Rollouts waiting for a runner (queuing or requeuing)",
                                value=sum(counts.get(s, 0) for s in QUEUED))
        yield GaugeMetricFamily("litstream_attempts_retried", "Attempts beyond each rollout's first",
                                value=sum(max(0, len(s.attempts) - 1) for s in snaps) + replica.let_go_retried)
        yield GaugeMetricFamily("litstream_workers", "Agent workers the store knows",
                                value=len(self.store.workers.workers))
        yield from self._dead_letters()

    def _dead_letters(self) -> Iterator[Metric]:
        if self.letters is None:
            return
        family = GaugeMetricFamily("litstream_dead_letter_topic_messages", "Messages on each dead-letter topic by "
                                   "kind of reason, as the gateway reads them", labels=["topic", "reason"])
        for (topic, reason), n in sorted(self.letters().counts().items()):
            family.add_metric([topic, reason], n)
        yield family


_COLLECTOR = GatewayCollector()
metrics.REGISTRY.register(_COLLECTOR)


def register_gateway_gauges(store: LitStore, letters: Callable[[], Any]) -> None:
    """Point the (once-registered) collector at this gateway's store and dead-letter feed."""
    _COLLECTOR.store = store
    _COLLECTOR.letters = letters
