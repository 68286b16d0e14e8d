"""Dead letters: a message that cannot be decoded or applied goes to its topic's ``.dlq`` companion, unchanged,
with the reason and its origin in headers. Processing goes on."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from litstream.infra import metrics
from litstream.infra.producer import EventProducer

log = logging.getLogger("litstream.deadletter")


@dataclass(frozen=True)
class DeadLetter:
    source_topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    reason: str
    processor: str
    error_type: str = "rejected"  # decode | invalid | rejected | error

    @property
    def topic(self) -> str:
        return f"{self.source_topic}.dlq"

    def headers(self) -> list[tuple[str, bytes]]:
        return [
            ("litstream.dlq.reason", self.reason.encode()[:4000]),
            ("litstream.dlq.error_type", self.error_type.encode()),
            ("litstream.dlq.source_topic", self.source_topic.encode()),
            ("litstream.dlq.partition", str(self.partition).encode()),
            ("litstream.dlq.offset", str(self.offset).encode()),
            ("litstream.dlq.processor", self.processor.encode()),
            ("litstream.dlq.time_ns", str(time.time_ns()).encode()),
        ]


class Rejected(Exception):
    """A record that cannot be decoded or applied: it becomes a dead letter with this reason."""

    def __init__(self, reason: str, error_type: str = "decode") -> None:
        super().__init__(reason)
        self.reason = reason
        self.error_type = error_type


def to_own_dlq(letter: DeadLetter) -> str | None:
    """The default route: the source topic's ``.dlq`` companion."""
    return letter.topic


class DeadLetters:
    """Writes a processor's dead letters with its producer, to where ``route`` says (None: logged and counted
    only, for topics whose main consumer writes their dead letters). The counts include a letter once it is
    flushed, so a figure never runs ahead of what the ``.dlq`` topic holds."""

    def __init__(self, events: EventProducer, role: str,
                 route: Callable[[DeadLetter], str | None] = to_own_dlq) -> None:
        self.events = events
        self.role = role
        self._route = route
        self.seen = 0  # every letter, written or only counted
        self.written = 0
        self.kinds: Counter[str] = Counter()
        self._unflushed: list[tuple[str, bool]] = []  # (error type, written) since the last flush

    def send(self, letter: DeadLetter, extra_headers: Iterable[tuple[str, bytes]] = ()) -> None:
        topic = self._route(letter)
        log.warning("dead letter (%s) %s[%d]@%d: %s", letter.error_type, letter.source_topic, letter.partition,
                    letter.offset, letter.reason)
        self._unflushed.append((letter.error_type, topic is not None))
        if topic is None:
            return
        self.events.produce_raw(topic, letter.key, letter.value, headers=[*letter.headers(), *extra_headers])
        metrics.record_dead_letter(self.role, letter.source_topic, letter.error_type)

    def flush(self) -> None:
        """Wait until every letter sent is on Kafka (raises if one was refused), then count them."""
        if not self._unflushed:
            return
        if any(written for _, written in self._unflushed):
            self.events.flush()
        self.seen += len(self._unflushed)
        self.written += sum(written for _, written in self._unflushed)
        self.kinds.update(kind for kind, _ in self._unflushed)
        self._unflushed = []
