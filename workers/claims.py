"""Claim outcomes for a runner: a claim is accepted or rejected by the lifecycle fold, and the snapshot that
follows it on ``rollout-state`` says which (``last_event_id``, ``last_accepted``, ``last_reason``)."""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import Future

from confluent_kafka import TopicPartition

from litstream.infra.kafka import admin, consumer, tail_start_offset
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec, DecodeError
from litstream.schemas.events import RolloutSnapshot

log = logging.getLogger("litstream.claims")


class ClaimWatcher:
    def __init__(self, settings: Settings, codec: Codec) -> None:
        self.codec = codec
        topic = Topics(settings.topic_prefix).state
        parts = admin(settings).list_topics(topic=topic, timeout=10.0).topics[topic].partitions
        self._consumer = consumer(settings, group_id=f"claims-{os.getpid()}-{time.monotonic_ns()}")
        start = tail_start_offset(settings)
        self._consumer.assign([TopicPartition(topic, p, start) for p in parts])
        self._waiters: dict[str, Future[tuple[bool, str | None]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="claim-watcher", daemon=True)
        self._thread.start()

    def expect(self, event_id: str) -> Future[tuple[bool, str | None]]:
        """Register before producing the claim, so a fast answer is not missed."""
        fut: Future[tuple[bool, str | None]] = Future()
        with self._lock:
            self._waiters[event_id] = fut
        return fut

    def forget(self, event_id: str) -> None:
        with self._lock:
            self._waiters.pop(event_id, None)

    def _run(self) -> None:
        while not self._stop.is_set():
            for msg in self._consumer.consume(num_messages=500, timeout=0.2):
                if msg.error() is not None:
                    continue
                try:
                    snap = self.codec.decode_as(msg.value(), RolloutSnapshot)
                except DecodeError:
                    continue
                if snap.last_event_id is None:
                    continue
                with self._lock:
                    fut = self._waiters.pop(snap.last_event_id, None)
                if fut is not None:
                    fut.set_result((snap.last_accepted, snap.last_reason))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._consumer.close()
