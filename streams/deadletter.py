"""Dead letters: a message that cannot be decoded or applied goes to its topic's ``.dlq`` companion, unchanged,
with the reason and its origin in headers. Processing goes on."""

from __future__ import annotations

import time
from dataclasses import dataclass


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
