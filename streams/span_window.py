"""The store's window of recent spans: ``query_spans`` of a rollout begun while the store runs is answered from
memory, where a query of ClickHouse through the chDB owner costs 10-20 ms.

A follower reads ``spans`` from where the topic ended when the window opened and keeps each record's bytes under
its key (the rollout id, as every writer keys spans), for the newest ``MAX_ROLLOUTS`` rollouts; a record is decoded
only when its rollout is asked for. A rollout's spans are all here when its enqueue lies past where
``rollout-events`` ended just after the window opened: it was enqueued after the window opened, and each of its
spans was written after its enqueue, so past where the window began. The store's replica says where each enqueue
lies (``RolloutReplica.on_enqueued``). Any other rollout (begun before the window, or beyond it) is read from
ClickHouse.

Read-your-writes, as on the ClickHouse path: a query waits until the follower has read past this store's newest
span of the rollout (the place its delivery report gave, ``SinkProgress.wanted``).
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from confluent_kafka import TopicPartition

from litstream.infra.kafka import high_watermark, topic_ends
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec, DecodeError
from litstream.schemas.events import SpanRecorded

from .rollout_replica import RolloutReplica
from .span_query import SpanQuery
from .views import TopicFollower

MAX_ROLLOUTS = 5_000  # rollouts whose spans are kept (~10 spans of ~400 bytes each: ~20 MiB)
MAX_COMPLETE = 20_000  # rollouts known to have every span here (ids only)
READ_WAIT_S = 5.0  # for the follower to read this store's own spans; then ClickHouse answers


class SpanWindow(TopicFollower):
    def __init__(self, settings: Settings, codec: Codec, replica: RolloutReplica,
                 max_rollouts: int = MAX_ROLLOUTS) -> None:
        self.max_rollouts = max_rollouts
        self._spans: OrderedDict[str, list[bytes]] = OrderedDict()  # rollout id -> its records, oldest rollout first
        self._complete: OrderedDict[str, None] = OrderedDict()
        self._dropped: OrderedDict[str, None] = OrderedDict()  # let go of before they were known complete
        self._read: dict[int, int] = {}  # partition -> the next offset the follower reads
        topics = Topics(settings.topic_prefix)
        super().__init__(settings, topics.spans, codec)  # opens at the topic's end (start_offsets)
        self._enqueued_from = topic_ends(settings, topics.rollout_events)
        replica.on_enqueued(self._enqueued)

    def start_offsets(self, partitions: list[int]) -> dict[int, int]:
        ends = {p: high_watermark(self._consumer, TopicPartition(self.topic, p), timeout=10) for p in partitions}
        self._read = dict(ends)
        return ends

    def spans(self, q: SpanQuery, wanted: dict[int, int], timeout: float = READ_WAIT_S) -> list[SpanRecorded] | None:
        """The spans ``q`` asks for, by sequence id, each once (its newest copy, as the table keeps); None when the
        window cannot answer for the rollout (then ClickHouse does)."""
        with self.changed:
            if q.rollout_id not in self._complete:
                return None
        if self.wait_for(lambda: True if self._read_past(wanted) else None, timeout) is None:
            return None
        with self.changed:
            if q.rollout_id not in self._complete:  # let go of meanwhile
                return None
            values = list(self._spans.get(q.rollout_id, ()))
        newest: dict[tuple[str, int, str], SpanRecorded] = {}
        for value in values:
            try:
                span = self.codec.decode_as(value, SpanRecorded)
            except DecodeError:  # the sink dead-letters it: not in the table either
                continue
            newest[(span.attempt_id, span.sequence_id, span.span_id)] = span
        return sorted((s for s in newest.values() if q.matches(s)), key=lambda s: s.sequence_id)

    def _read_past(self, wanted: dict[int, int]) -> bool:
        return all(self._read.get(p, -1) > o for p, o in wanted.items())

    def _enqueued(self, rollout_id: str, partition: int, offset: int) -> None:
        """The replica folded the rollout's enqueue (under its lock): begun after the window opened?"""
        if offset < self._enqueued_from.get(partition, 0):
            return
        with self.changed:
            if rollout_id in self._dropped:  # spans of it were let go of (a replica far behind): not complete
                return
            _keep_newest(self._complete, rollout_id)

    def _take(self, msg: Any) -> None:
        partition = int(msg.partition() or 0)
        if not self._ends.record(msg):
            if partition in self._ends.eof_offset:
                self._read[partition] = max(self._read.get(partition, 0), self._ends.eof_offset[partition])
            return
        self._read[partition] = int(msg.offset() or 0) + 1
        rollout_id = (msg.key() or b"").decode(errors="replace")
        kept = self._spans.get(rollout_id)
        if kept is None:
            kept = self._spans[rollout_id] = []
            while len(self._spans) > self.max_rollouts:
                old, _ = self._spans.popitem(last=False)
                if old in self._complete:
                    del self._complete[old]
                else:
                    _keep_newest(self._dropped, old)
        kept.append(msg.value())


def _keep_newest(ids: OrderedDict[str, None], rollout_id: str) -> None:
    ids[rollout_id] = None
    while len(ids) > MAX_COMPLETE:
        ids.popitem(last=False)
