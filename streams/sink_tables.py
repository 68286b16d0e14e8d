"""Which topic lands in which table, and one batch of them: decode, route, insert as Arrow.

Shared by the sink (live, committing offsets after :meth:`SinkBatch.insert`) and by ``litstream replay --sink
clickhouse`` (rebuilding the tables from the beginning of each topic).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from litstream.infra.clickhouse import ClickHouse
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec, DecodeError
from litstream.schemas.events import RolloutSnapshot, SpanRecorded, TripletEmitted, VersionTrained

from .deadletter import DeadLetter, Rejected
from .event_rows import LIFECYCLE_TYPES, Positioned, event_arrow, lineage_arrow, rollout_arrow, triplet_arrow
from .span_rows import span_record_arrow

SPANS_TABLE = "spans"
EVENTS_TABLE = "rollout_events"
TRIPLETS_TABLE = "triplets"
LINEAGE_TABLE = "trained_on"
ROLLOUTS_TABLE = "rollouts"
# topic role -> table; every table is a ReplacingMergeTree keyed by the record's identity (see migrations/).
SINK_TOPICS: dict[str, str] = {"spans": SPANS_TABLE, "rollout-events": EVENTS_TABLE, "triplets": TRIPLETS_TABLE,
                               "lineage": LINEAGE_TABLE, "rollout-state": ROLLOUTS_TABLE}


def sink_topics(topics: Topics) -> dict[str, str]:
    """Physical topic name -> table."""
    return {topics.name(role): table for role, table in SINK_TOPICS.items()}


SinkRow = tuple[str, Any, int]  # (table, decoded record, bytes read)


def decode_row(topics: Topics, codec: Codec, topic: str, partition: int, offset: int, value: bytes | None) -> SinkRow:
    """A record of a sink topic as the row its table stores; :class:`Rejected` when it cannot be one."""
    size = len(value or b"")
    try:
        if topic == topics.spans:
            return SPANS_TABLE, codec.decode_record(value, SpanRecorded), size
        if topic == topics.triplets:
            return TRIPLETS_TABLE, codec.decode_as(value, TripletEmitted), size
        if topic == topics.lineage:
            return LINEAGE_TABLE, codec.decode_as(value, VersionTrained), size
        if topic == topics.state:
            return ROLLOUTS_TABLE, codec.decode_as(value, RolloutSnapshot), size
        if topic == topics.rollout_events:
            event = codec.decode(value)
            if not isinstance(event, LIFECYCLE_TYPES):
                raise Rejected(f"{type(event).__name__} does not belong on {topic}", "invalid")
            return EVENTS_TABLE, Positioned(event, partition, offset), size
    except DecodeError as exc:
        raise Rejected(exc.reason, "decode") from exc
    raise Rejected(f"{topic} is not a topic the sink stores", "invalid")


@dataclass
class SinkBatch:
    """Decoded records waiting for one insert per table, and the messages that cannot be stored (dead letters)."""

    topics: Topics
    codec: Codec
    processor: str
    spans: list[dict[str, Any]] = field(default_factory=list)  # SpanRecorded Avro records: no model needed
    events: list[Positioned] = field(default_factory=list)
    triplets: list[TripletEmitted] = field(default_factory=list)
    lineage: list[VersionTrained] = field(default_factory=list)
    rollouts: list[RolloutSnapshot] = field(default_factory=list)
    letters: list[DeadLetter] = field(default_factory=list)
    nbytes: int = 0

    def __len__(self) -> int:
        return (len(self.spans) + len(self.events) + len(self.triplets) + len(self.lineage) + len(self.rollouts)
                + len(self.letters))

    def add(self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes | None) -> None:
        try:
            self.append(decode_row(self.topics, self.codec, topic, partition, offset, value))
        except Rejected as exc:
            self.nbytes += len(value or b"")
            self.letters.append(DeadLetter(topic, partition, offset, key, value, exc.reason, self.processor,
                                           exc.error_type))

    def append(self, row: SinkRow) -> None:
        table, record, size = row
        self.nbytes += size
        if table == SPANS_TABLE:
            self.spans.append(record)
        elif table == EVENTS_TABLE:
            self.events.append(record)
        elif table == LINEAGE_TABLE:
            self.lineage.append(record)
        elif table == ROLLOUTS_TABLE:
            self.rollouts.append(record)
        else:
            self.triplets.append(record)

    def counts(self) -> dict[str, int]:
        """Records per table (a lineage record is a version: its rows are its triplets)."""
        return {SPANS_TABLE: len(self.spans), EVENTS_TABLE: len(self.events), TRIPLETS_TABLE: len(self.triplets),
                LINEAGE_TABLE: len(self.lineage), ROLLOUTS_TABLE: len(self.rollouts)}

    def tables(self) -> list[tuple[str, pa.Table]]:
        """Each table's rows as Arrow, ready for ``insert_arrow`` (tables without rows left out)."""
        now = time.time_ns()
        out = []
        if self.spans:
            out.append((SPANS_TABLE, span_record_arrow(self.spans, now)))
        if self.events:
            out.append((EVENTS_TABLE, event_arrow(self.events, now)))
        if self.triplets:
            out.append((TRIPLETS_TABLE, triplet_arrow(self.triplets, now)))
        if self.lineage:
            out.append((LINEAGE_TABLE, lineage_arrow(self.lineage, now)))
        if self.rollouts:
            out.append((ROLLOUTS_TABLE, rollout_arrow(self.rollouts, now)))
        return out

    def insert(self, ch: ClickHouse) -> dict[str, int]:
        """Insert every table's rows (Arrow); returns rows per table. Idempotent: the tables collapse repeats."""
        insert_tables(ch, self.tables())
        return self.counts()


def insert_tables(ch: ClickHouse, tables: list[tuple[str, pa.Table]]) -> None:
    for table, data in tables:
        ch.insert_arrow(table, data)
