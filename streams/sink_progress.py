"""Read-your-writes for spans: how far the span sink has stored what this store produced.

The store remembers where each rollout's newest span landed (its partition and offset, for the most recent
``MAX_ROLLOUTS`` rollouts) and waits, before a span query of a rollout, only until the sink's committed offset on
that partition is past it. The sink's committed offsets are read with one long-lived consumer and kept: a query of
a rollout the sink stored long ago costs no broker request at all. A rollout whose place was forgotten (beyond the
window) waits for the highest offset forgotten on each partition, which the sink has nearly always passed.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from confluent_kafka import Consumer, TopicPartition

from litstream.infra.kafka import consumer
from litstream.infra.settings import Settings

MAX_ROLLOUTS = 20_000  # rollouts whose newest span's place is remembered (~200 bytes each)
POLL_S = 0.01  # between two reads of the sink's committed offsets while waiting


class SinkNotCaughtUp(TimeoutError):
    """The sink has not stored the spans waited for within the timeout."""


class SinkProgress:
    def __init__(self, settings: Settings, topic: str, max_rollouts: int = MAX_ROLLOUTS) -> None:
        self.settings, self.topic, self.max_rollouts = settings, topic, max_rollouts
        self._newest: OrderedDict[str, tuple[int, int]] = OrderedDict()  # rollout id -> (partition, offset)
        self._forgotten: dict[int, int] = {}  # partition -> highest offset of a rollout no longer remembered
        self._highest: dict[int, int] = {}  # partition -> the highest offset written here
        self._stored: dict[int, int] = {}  # partition -> the sink's committed offset, as last read
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()

    def written(self, rollout_id: str, partition: int, offset: int) -> None:
        """A span of ``rollout_id`` was delivered at ``offset`` of ``partition`` (the producer's delivery report)."""
        if offset > self._highest.get(partition, -1):
            self._highest[partition] = offset
        newest = self._newest
        before = newest.pop(rollout_id, None)
        newest[rollout_id] = (partition, max(offset, before[1]) if before is not None else offset)
        if len(newest) > self.max_rollouts:
            _, (p, o) = newest.popitem(last=False)
            self._forgotten[p] = max(self._forgotten.get(p, -1), o)

    def wanted(self, rollout_id: str) -> dict[int, int]:
        """Partition -> the offset the sink must have stored for a query of ``rollout_id`` to see this store's
        spans of it (empty: none written here)."""
        place = self._newest.get(rollout_id)
        if place is not None:
            return {place[0]: place[1]}
        return dict(self._forgotten)

    def wanted_all(self) -> dict[int, int]:
        """Partition -> the offset the sink must have stored for every span written here."""
        return dict(self._highest)

    def wait(self, rollout_id: str, timeout: float = 30.0) -> None:
        """Return once the sink has committed past this store's spans of ``rollout_id``; SinkNotCaughtUp when
        it has not within ``timeout``."""
        self.wait_past(self.wanted(rollout_id), f"spans of {rollout_id}", timeout)

    def wait_past(self, wanted: dict[int, int], what: str, timeout: float = 30.0) -> None:
        """Return once the sink's committed offset on each partition of ``wanted`` is past its offset;
        SinkNotCaughtUp (naming ``what``) when it is not within ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self._stored_past(wanted):
            self._read_stored(list(wanted))
            if self._stored_past(wanted):
                break
            if time.monotonic() >= deadline:
                raise SinkNotCaughtUp(f"the sink has not stored {what} within {timeout:g} s")
            time.sleep(POLL_S)

    def _stored_past(self, wanted: dict[int, int]) -> bool:
        return all(self._stored.get(p, -1) > o for p, o in wanted.items())

    def _read_stored(self, partitions: list[int]) -> None:
        with self._lock:
            if self._consumer is None:
                self._consumer = consumer(self.settings, group_id=f"{self.settings.topic_prefix}-span-sink")
            committed = self._consumer.committed([TopicPartition(self.topic, p) for p in partitions], timeout=5.0)
        for tp in committed:
            self._stored[tp.partition] = max(self._stored.get(tp.partition, -1), tp.offset)

    def close(self) -> None:
        with self._lock:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None
