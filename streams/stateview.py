"""A reader's view of rollout state: the newest snapshot of each rollout on ``rollout-state``.

The topic is compacted in production; the embedded broker never compacts, so every version of a key may be
there and the highest ``version`` wins.
"""

from __future__ import annotations

import os
import time

from confluent_kafka import KafkaError, TopicPartition

from litstream.infra.kafka import admin, consumer
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec, DecodeError, default_codec
from litstream.schemas.events import RolloutSnapshot


class StateView:
    """Follows the state topic from its beginning; ``catch_up()`` reads to the current end."""

    def __init__(self, settings: Settings, codec: Codec | None = None) -> None:
        self.topic = Topics(settings.topic_prefix).state
        self.codec = codec or default_codec(settings.schema_registry_url)
        self.snapshots: dict[str, RolloutSnapshot] = {}
        self.undecodable = 0
        meta = admin(settings).list_topics(topic=self.topic, timeout=10.0).topics.get(self.topic)
        if meta is None or meta.error is not None:
            raise LookupError(f"topic {self.topic} does not exist; is the stack up (`litstream up`)?")
        self._parts = sorted(meta.partitions)
        self._at_end: set[int] = set()
        self._consumer = consumer(settings, group_id=f"stateview-{os.getpid()}-{time.monotonic_ns()}",
                                  **{"enable.partition.eof": True})
        self._consumer.assign([TopicPartition(self.topic, p, 0) for p in self._parts])

    def catch_up(self, timeout: float = 30.0) -> dict[str, RolloutSnapshot]:
        """Read everything written so far (until every partition is at its end)."""
        deadline = time.monotonic() + timeout
        first = True
        while first or (self._at_end != set(self._parts) and time.monotonic() < deadline):
            first = False
            for msg in self._consumer.consume(num_messages=1000, timeout=0.2):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        self._at_end.add(msg.partition())
                    continue
                self._at_end.discard(msg.partition())
                self._apply(msg.value())
        return self.snapshots

    def _apply(self, value: bytes | None) -> None:
        try:
            snap = self.codec.decode_as(value, RolloutSnapshot)
        except DecodeError:
            self.undecodable += 1
            return
        current = self.snapshots.get(snap.rollout_id)
        if current is None or snap.version >= current.version:  # same version: a later outcome snapshot
            self.snapshots[snap.rollout_id] = snap

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> StateView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
