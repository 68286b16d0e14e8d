"""Replay: rebuild rollout state from the event log with the same pure fold the processor uses, and compare it
with the live state (``litstream replay --verify``), or rebuild it as it was at an earlier point of the log
(``litstream replay --until``, the gateway's ``as_of``); or rebuild the ClickHouse tables from their topics
(``litstream replay --sink clickhouse``, :func:`replay_clickhouse`)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from litstream.infra.clickhouse import ClickHouse, call_api, owner_api
from litstream.infra.kafka import offsets_at, read_log, read_to_end, topic_partitions
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec, default_codec
from litstream.schemas.events import Event, RolloutSnapshot

from . import fold
from .log_records import Unfoldable, lifecycle_event
from .sink_tables import SinkBatch, sink_topics
from .state import RolloutState
from .stateview import StateView

# Fields that say which event a snapshot followed, not what the state is.
OUTCOME_FIELDS = {"last_event_id", "last_producer_id", "last_producer_seq", "last_accepted", "last_reason", "last_reserved"}


@dataclass(frozen=True)
class Until:
    """A point in the log: a time (seconds since the epoch), or per partition the offset before which records
    count. The state at that point is the fold of every record before it."""

    time: float | None = None
    offsets: dict[int, int] | None = None

    def __str__(self) -> str:
        if self.offsets is not None:
            return ",".join(f"{p}:{o}" for p, o in sorted(self.offsets.items()))
        return datetime.fromtimestamp(self.time or 0.0).astimezone().isoformat(timespec="milliseconds")


_OFFSETS = re.compile(r"^\d+:\d+(,\d+:\d+)*$")
_EPOCH = re.compile(r"^\d+(\.\d+)?$")


def parse_until(text: str) -> Until:
    """``2026-11-28T10:32:00`` (ISO 8601; without a zone, this machine's), ``1795868400.5`` (seconds since the
    epoch), or ``0:120,1:98`` (the records before offset 120 of partition 0 and 98 of partition 1; a partition not
    named: none of its records). ValueError, saying which forms there are, for anything else."""
    text = text.strip()
    if _OFFSETS.match(text):
        offsets: dict[int, int] = {}
        for part in text.split(","):
            p, o = part.split(":")
            if int(p) in offsets:
                raise ValueError(f"partition {p} is named twice in {text!r}")
            offsets[int(p)] = int(o)
        return Until(offsets=offsets)
    if _EPOCH.match(text):
        return Until(time=float(text))
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"not a point in the log: {text!r}; give a time (2026-11-28T10:32:00, local unless it "
                         "names its zone, or seconds since the epoch) or offsets per partition (0:120,1:98)") from None
    return Until(time=when.astimezone().timestamp())


@dataclass
class ReplayResult:
    states: dict[str, RolloutState] = field(default_factory=dict)
    until: dict[int, int] | None = None  # the log's point it was rebuilt at (partition -> offset), if not its end
    events: int = 0
    applied: int = 0
    duplicates: int = 0
    rejected: int = 0
    undecodable: int = 0
    seconds: float = 0.0

    def apply(self, event: Event) -> None:
        self.events += 1
        out = fold.apply(self.states.get(event.rollout_id), event)
        if out.state is not None:
            self.states[event.rollout_id] = out.state
        if out.duplicate:
            self.duplicates += 1
        elif out.accepted:
            self.applied += 1
        else:
            self.rejected += 1

    def by_status(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self.states.values():
            counts[s.status] = counts.get(s.status, 0) + 1
        return dict(sorted(counts.items()))

    def summary(self) -> dict[str, Any]:
        return {"rollouts": len(self.states), "by_status": self.by_status(), "events": self.events,
                "applied": self.applied, "duplicates": self.duplicates, "rejected": self.rejected,
                "undecodable": self.undecodable, "seconds": round(self.seconds, 3),
                "events_per_s": round(self.events / self.seconds) if self.seconds else None,
                **({"until": str(Until(offsets=self.until))} if self.until is not None else {})}


def fold_events(events: Iterable[Event]) -> ReplayResult:
    """Fold events in log order (pure; what the processor does, minus Kafka)."""
    result = ReplayResult()
    for e in events:
        result.apply(e)
    return result


def replay(settings: Settings, codec: Codec | None = None, until: Until | None = None,
           rollout_id: str | None = None) -> ReplayResult:
    """Rebuild every rollout's state (or only ``rollout_id``'s) from ``rollout-events``: from the beginning to the
    current end, or to the point ``until`` (time travel: the state as it was then)."""
    codec = codec or default_codec(settings.schema_registry_url)
    t0 = time.perf_counter()
    topic = Topics(settings.topic_prefix).rollout_events
    stop = log_point(settings, until) if until is not None else None
    result = ReplayResult(until=stop)
    key = rollout_id.encode() if rollout_id is not None else None
    for msg in read_log(settings, topic, stop, timeout=600):
        if key is not None and msg.key() != key:
            continue
        event = lifecycle_event(codec, topic, msg.key(), msg.value())
        if not isinstance(event, Unfoldable):
            result.apply(event)
        elif event.undecodable:
            result.undecodable += 1
        else:
            result.events += 1  # the processor dead-letters a message keyed by another id: the fold never sees it
            result.rejected += 1
    result.seconds = time.perf_counter() - t0
    return result


def log_point(settings: Settings, until: Until) -> dict[int, int]:
    """``until`` as the offset per partition of ``rollout-events`` before which records count."""
    topic = Topics(settings.topic_prefix).rollout_events
    if until.offsets is None:
        return offsets_at(settings, topic, until.time or 0.0)
    unknown = sorted(set(until.offsets) - set(topic_partitions(settings, topic)))
    if unknown:
        raise ValueError(f"{topic} has no partition {unknown[0]} (it has {len(topic_partitions(settings, topic))})")
    return dict(until.offsets)


def comparable(snap: RolloutSnapshot) -> dict[str, Any]:
    return snap.model_dump(mode="json", exclude=OUTCOME_FIELDS)


def diff(replayed: dict[str, RolloutState], live: dict[str, RolloutSnapshot], limit: int = 20) -> list[str]:
    """Readable differences between replayed and live state; empty when they agree."""
    lines: list[str] = []
    for rid in sorted(set(replayed) | set(live)):
        if rid not in live:
            lines.append(f"{rid}: in the log but not in the live state")
        elif rid not in replayed:
            lines.append(f"{rid}: in the live state but not in the log")
        else:
            a, b = comparable(replayed[rid].snapshot()), comparable(live[rid])
            for key in sorted(a):
                if a[key] != b.get(key):
                    lines.append(f"{rid}.{key}: replayed {a[key]!r} != live {b.get(key)!r}")
        if len(lines) >= limit:
            lines.append("... (more differences not shown)")
            break
    return lines


def verify(settings: Settings, wait_s: float = 30.0) -> tuple[ReplayResult, list[str]]:
    """Replay and compare with the live state; retries while the live state may still be catching up."""
    deadline = time.monotonic() + wait_s
    with StateView(settings) as view:
        while True:
            result = replay(settings)
            differences = diff(result.states, view.catch_up())
            if not differences or time.monotonic() > deadline:
                return result, differences
            time.sleep(0.5)


# --- ClickHouse ---------------------------------------------------------------------------------------------

REBUILD_TIMEOUT_S = 1800.0


@dataclass
class TableRebuild:
    topic: str
    read: int = 0  # records on the topic, from the beginning to its end
    stored: int = 0  # decoded and inserted
    undecodable: int = 0  # not stored (the live sink dead-lettered them; the rebuild only counts them)
    rows: int = 0  # distinct rows in the table afterwards (FINAL)


@dataclass
class ClickHouseRebuild:
    tables: dict[str, TableRebuild] = field(default_factory=dict)
    truncated: bool = False
    seconds: float = 0.0

    def summary(self) -> dict[str, Any]:
        return {"tables": {t: vars(r) for t, r in self.tables.items()}, "truncated": self.truncated,
                "seconds": round(self.seconds, 3)}


def rebuild_clickhouse(settings: Settings, ch: ClickHouse, truncate: bool = False, batch_size: int = 5000,
                       codec: Codec | None = None) -> ClickHouseRebuild:
    """Insert every record of the sink's topics, from the beginning to the current end, on an open connection.

    Re-inserting what is already there is harmless (the tables collapse a record's repeats), so without
    ``truncate`` this also runs beside a live sink. With ``truncate`` the tables are emptied first: rows the live
    sink writes meanwhile come from the same topics, so nothing is lost."""
    codec = codec or default_codec(settings.schema_registry_url)
    topics = Topics(settings.topic_prefix)
    ch.migrate()
    result = ClickHouseRebuild(truncated=truncate)
    t0 = time.perf_counter()
    for topic, table in sink_topics(topics).items():
        if truncate:
            ch.command(f"TRUNCATE TABLE IF EXISTS {table}")
        stats = result.tables[table] = TableRebuild(topic)
        batch = SinkBatch(topics, codec, "replay")
        for msg in read_to_end(settings, topic, timeout=REBUILD_TIMEOUT_S):
            stats.read += 1
            batch.add(topic, int(msg.partition() or 0), int(msg.offset() or 0), msg.key(), msg.value())
            if len(batch) >= batch_size:
                _flush(ch, batch, stats)
                batch = SinkBatch(topics, codec, "replay")
        _flush(ch, batch, stats)
        stats.rows = int(ch.query(f"SELECT count() FROM {table} FINAL").rows[0][0])
    result.seconds = time.perf_counter() - t0
    return result


def _flush(ch: ClickHouse, batch: SinkBatch, stats: TableRebuild) -> None:
    stats.stored += sum(batch.insert(ch).values())
    stats.undecodable += len(batch.letters)


def replay_clickhouse(settings: Settings, truncate: bool = False) -> dict[str, Any]:
    """Rebuild the ClickHouse tables from the topics, wherever that can run: in the process that owns the chDB
    directory when one runs (through its API; it reads the topics it sinks), else here (opening the directory,
    or the server of an http:// DSN). Returns the summary, with ``where`` it ran."""
    dsn = settings.resolved_clickhouse_dsn
    api = owner_api(dsn)
    if api is not None:
        return {**call_api(api, "/replay", {"truncate": truncate}, timeout=REBUILD_TIMEOUT_S), "where": api}
    ch = ClickHouse(dsn, role="replay")
    try:
        return {**rebuild_clickhouse(settings, ch, truncate).summary(), "where": "this process"}
    finally:
        ch.close()
