"""Live read models: a background thread follows a topic and folds it into memory, so reads are local.

Each view also answers "has my write been applied yet?" (read-your-writes): writers wait on a future the
follower settles after a batch shows the write (:meth:`TopicFollower.until`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from litstream.infra.kafka import PartitionEnds, admin, consumer, poll_batch
from litstream.infra.settings import Settings
from litstream.schemas.codec import Codec, DecodeError
from litstream.schemas.events import AvroModel, ResourcesPublished, RolloutSnapshot, WorkerObserved
from litstream.schemas.models import Worker

from .resources import ResourcesState, apply_resources
from .worker_fold import apply_worker

T = TypeVar("T")


class TopicFollower:
    """Reads ``topic`` from the beginning (or where :meth:`start_offsets` says) in a daemon thread and hands each
    decoded record to ``on_record``."""

    record_type: type[AvroModel] = AvroModel

    def __init__(self, settings: Settings, topic: str, codec: Codec) -> None:
        self.topic = topic
        self.codec = codec
        self.undecodable = 0
        meta = admin(settings).list_topics(topic=topic, timeout=10.0).topics.get(topic)
        if meta is None or meta.error is not None:
            raise LookupError(f"topic {topic} does not exist; run `litstream topics create` (or `litstream up`)")
        self._parts = sorted(meta.partitions)
        self._consumer = consumer(settings, group_id=f"view-{os.getpid()}-{time.monotonic_ns()}",
                                  **{"enable.partition.eof": True})
        self._consumer.assign([TopicPartition(topic, p, o) for p, o in self.start_offsets(self._parts).items()])
        self._ends = PartitionEnds()
        self._batches = 0
        self.changed = threading.Condition()
        self._watchers: list[tuple[Callable[[], Any], Future[Any]]] = []  # checked after every batch
        self._waiters: dict[str, Future[Any]] = {}  # event id -> the answer a writer here awaits (``expect``)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"follow-{topic}", daemon=True)
        self._thread.start()

    def start_offsets(self, partitions: list[int]) -> dict[int, int]:
        """Where each partition is read from (``self._consumer`` is there to ask the broker)."""
        return dict.fromkeys(partitions, OFFSET_BEGINNING)

    def expect(self, event_id: str) -> Future[Any]:
        """Register before producing the event: the future gets this view's answer to it."""
        fut: Future[Any] = Future()
        with self.changed:
            self._waiters[event_id] = fut
        return fut

    def forget(self, event_id: str) -> None:
        """The writer gave up on (or failed to write) the event."""
        with self.changed:
            self._waiters.pop(event_id, None)

    def on_record(self, record: Any) -> None:
        raise TypeError(f"{type(self).__name__} must handle its records")

    def _take(self, msg: Any) -> None:
        """One message of a batch, under ``changed``: a record is decoded and handed to :meth:`on_record`."""
        if not self._ends.record(msg):
            return
        try:
            record = self.codec.decode_as(msg.value(), self.record_type)
        except DecodeError:
            self.undecodable += 1
            return
        self.on_record(record)

    def _run(self) -> None:
        while not self._stop.is_set():
            msgs = poll_batch(self._consumer, 0.1)
            with self.changed:
                for msg in msgs:
                    self._take(msg)
                self._batches += 1
                self._check_watchers()

    def _check_watchers(self) -> None:
        """Settle the watchers whose predicate has an answer now (under ``changed``)."""
        if self._watchers:
            self._watchers = [w for w in self._watchers if not _settled(*w)]

    def wait_for(self, predicate: Callable[[], T | None], timeout: float) -> T | None:
        """Block until ``predicate()`` returns something (checked now and after every batch) or the time is up."""
        fut = self.until(predicate)
        try:
            return fut.result(timeout)
        except TimeoutError:
            fut.cancel()
            return None

    def until(self, predicate: Callable[[], T | None]) -> Future[T]:
        """A future of the first non-None ``predicate()``, checked now and after every batch; no thread is held
        for it (cancel the future to stop checking). Async callers await it, :meth:`wait_for` blocks on it."""
        fut: Future[T] = Future()
        with self.changed:
            if not _settled(predicate, fut):
                self._watchers.append((predicate, fut))
        return fut

    def caught_up(self, timeout: float = 30.0) -> bool:
        """Wait until every partition has been read to its end at least once since now."""
        start = self._batches
        return self.wait_for(lambda: True if self._batches > start + 1 and self._ends.covers(self._parts)
                             else None, timeout) is not None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()


def _settled(predicate: Callable[[], Any], fut: Future[Any]) -> bool:
    """Resolve ``fut`` once ``predicate()`` has an answer; True when the future needs no more checks."""
    if fut.done():  # cancelled by a waiter that gave up
        return True
    try:
        found = predicate()
    except Exception as exc:  # noqa: BLE001 - the waiter gets it, the follower goes on
        fut.set_exception(exc)
        return True
    if found is None:
        return False
    try:
        fut.set_result(found)
    except InvalidStateError:  # cancelled meanwhile
        pass
    return True


class RolloutsView(TopicFollower):
    """The newest snapshot of every rollout, from the compacted ``rollout-state`` topic."""

    record_type = RolloutSnapshot

    def __init__(self, settings: Settings, codec: Codec) -> None:
        self.snapshots: dict[str, RolloutSnapshot] = {}
        super().__init__(settings, f"{settings.topic_prefix}.rollout-state", codec)

    def on_record(self, snap: RolloutSnapshot) -> None:
        current = self.snapshots.get(snap.rollout_id)
        if current is None or snap.version >= current.version:  # same version: a later outcome snapshot
            self.snapshots[snap.rollout_id] = snap


class ResourcesView(TopicFollower):
    record_type = ResourcesPublished

    def __init__(self, settings: Settings, codec: Codec) -> None:
        self.state = ResourcesState()
        self.seen_events: set[str] = set()
        super().__init__(settings, f"{settings.topic_prefix}.resources", codec)

    def on_record(self, ev: ResourcesPublished) -> None:
        apply_resources(self.state, ev)
        self.seen_events.add(ev.event_id)


class WorkersView(TopicFollower):
    record_type = WorkerObserved

    MAX_OBSERVED = 20_000

    def __init__(self, settings: Settings, codec: Codec) -> None:
        self.workers: dict[str, Worker] = {}
        self.written_here: set[str] = set()  # observations written here, until their copy is read back
        # (worker, attempt, status) of the attempts' observations seen, newest last: a write that moved an attempt
        # waits here until its worker record shows it (read-your-writes of start_rollout, start_attempt, ...).
        self.observed: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        super().__init__(settings, f"{settings.topic_prefix}.workers", codec)

    def observe(self, observations: list[WorkerObserved], written: bool = False) -> None:
        """Apply observations this process made itself, without waiting to read them back: ``written`` ones are
        on the topic too (their copy is skipped when it comes); the others are derived from attempts, as the
        lifecycle processor's copies are, and applying the same observation twice changes nothing."""
        with self.changed:
            for ev in observations:
                self._apply(ev)
                if written:
                    self.written_here.add(ev.event_id)
            self._check_watchers()

    def on_record(self, ev: WorkerObserved) -> None:
        if ev.event_id in self.written_here:  # applied when written; its copy comes once
            self.written_here.discard(ev.event_id)
            return
        self._apply(ev)

    def _apply(self, ev: WorkerObserved) -> None:
        if ev.attempt_id is not None and ev.status is not None:
            self.observed[(ev.worker_id, ev.attempt_id, ev.status)] = None
            while len(self.observed) > self.MAX_OBSERVED:
                self.observed.popitem(last=False)
        self.workers[ev.worker_id] = apply_worker(self.workers.get(ev.worker_id), ev)
