"""The dead letters of every ``.dlq`` topic, followed live for the dashboard (newest kept, oldest dropped)."""

from __future__ import annotations

import threading
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from litstream.infra.kafka import consumer
from litstream.infra.settings import Settings
from litstream.infra.topics import physical_topics

KEEP = 500


@dataclass(frozen=True)
class Letter:
    topic: str
    offset: int
    time_ns: int
    reason: str
    error_type: str
    source: str  # source topic[partition]@offset
    processor: str
    key: str
    value_preview: str

    @property
    def time_s(self) -> float:
        return self.time_ns / 1e9


def letter_from(topic: str, offset: int, timestamp_ms: int, key: bytes | None, value: bytes | None,
                headers: list[tuple[str, bytes]] | None) -> Letter:
    h = {k: (v or b"").decode(errors="replace") for k, v in headers or []}
    try:
        time_ns = int(h.get("litstream.dlq.time_ns", "")) or timestamp_ms * 1_000_000
    except ValueError:
        time_ns = timestamp_ms * 1_000_000
    source = f"{h.get('litstream.dlq.source_topic', '?')}[{h.get('litstream.dlq.partition', '?')}]" \
             f"@{h.get('litstream.dlq.offset', '?')}"
    preview = (value or b"")[:300].decode(errors="replace")
    return Letter(topic, offset, time_ns, h.get("litstream.dlq.reason", "(no reason header)"),
                  h.get("litstream.dlq.error_type", "?"), source, h.get("litstream.dlq.processor", "?"),
                  (key or b"").decode(errors="replace"), preview)


class DeadLetterFeed:
    """Reads every dead-letter topic from its beginning in a daemon thread; ``letters()`` is newest first."""

    def __init__(self, settings: Settings) -> None:
        self.topics = [t.name for t in physical_topics(settings) if t.name.endswith(".dlq")]
        self._letters: deque[Letter] = deque(maxlen=KEEP)
        self._counts: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.error: str | None = None
        self._consumer = consumer(settings, group_id=f"{settings.topic_prefix}-dashboard-{uuid.uuid4().hex[:8]}")
        self._consumer.assign([TopicPartition(t, 0, OFFSET_BEGINNING) for t in self.topics])
        threading.Thread(target=self._run, name="dead-letters", daemon=True).start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                msg = self._consumer.poll(0.5)
                if msg is None or msg.error() is not None:
                    continue
                self._add(msg)
        except KafkaException as exc:  # shown on the page rather than lost in a thread
            self.error = str(exc)
        finally:
            self._consumer.close()

    def _add(self, msg: Any) -> None:
        letter = letter_from(str(msg.topic()), int(msg.offset() or 0), msg.timestamp()[1], msg.key(), msg.value(),
                             msg.headers())
        with self._lock:
            self._letters.append(letter)
            key = (letter.topic, letter.error_type)
            self._counts[key] = self._counts.get(key, 0) + 1

    def letters(self) -> list[Letter]:
        with self._lock:
            return list(reversed(self._letters))

    def counts(self) -> dict[tuple[str, str], int]:
        """(dead-letter topic, kind of reason) -> letters seen since this gateway started."""
        with self._lock:
            return dict(self._counts)

    def close(self) -> None:
        self._stop.set()
