"""Lifecycle events, rollout snapshots, triplets and lineage -> rows of the ``rollout_events``, ``rollouts``,
``triplets`` and ``trained_on`` tables, as Arrow (pure)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, get_args

import pyarrow as pa

from litstream.schemas.events import (
    AttemptStarted,
    Event,
    LifecycleEvent,
    RolloutEnqueued,
    RolloutSnapshot,
    TripletEmitted,
    VersionTrained,
)

from .span_rows import NS, columns_to_arrow

LIFECYCLE_TYPES: tuple[type[Event], ...] = get_args(LifecycleEvent)

EVENT_SCHEMA = pa.schema([
    ("timestamp", NS), ("event_type", pa.string()), ("rollout_id", pa.string()), ("attempt_id", pa.string()),
    ("sequence_id", pa.uint32()), ("status", pa.string()), ("event_time", pa.timestamp("us")),
    ("worker_id", pa.string()), ("resources_id", pa.string()), ("mode", pa.string()), ("error", pa.string()),
    ("event_id", pa.string()), ("producer_id", pa.string()), ("producer_seq", pa.uint64()),
    ("kafka_partition", pa.uint32()), ("kafka_offset", pa.uint64()), ("ingested_ns", pa.uint64()),
    ("raw_json", pa.string()), ("run_id", pa.string()),
])

ROLLOUT_SCHEMA = pa.schema([
    ("rollout_id", pa.string()), ("version", pa.uint64()), ("status", pa.string()), ("start_time", pa.float64()),
    ("end_time", pa.float64()), ("mode", pa.string()), ("resources_id", pa.string()), ("attempts", pa.uint32()),
    ("updated_ns", pa.uint64()), ("ingested_ns", pa.uint64()), ("raw_json", pa.string()),
])

TRIPLET_SCHEMA = pa.schema([
    ("timestamp", NS), ("rollout_id", pa.string()), ("attempt_id", pa.string()), ("index", pa.uint32()),
    ("group_id", pa.string()), ("policy_version", pa.string()), ("resources_id", pa.string()),
    ("prompt_token_ids", pa.list_(pa.int64())), ("response_token_ids", pa.list_(pa.int64())),
    ("response_logprobs", pa.list_(pa.float64())), ("prompt_text", pa.string()), ("response_text", pa.string()),
    ("reward", pa.float64()), ("metadata_json", pa.string()), ("event_id", pa.string()),
    ("producer_id", pa.string()), ("producer_seq", pa.uint64()), ("ingested_ns", pa.uint64()), ("run_id", pa.string()),
])


LINEAGE_SCHEMA = pa.schema([
    ("version", pa.uint32()), ("run_id", pa.string()), ("resources_id", pa.string()), ("rollout_id", pa.string()), ("attempt_id", pa.string()),
    ("index", pa.uint32()), ("group_id", pa.string()), ("generated_by", pa.uint32()), ("reward", pa.float64()),
    ("turns", pa.uint32()), ("window", pa.string()), ("trained_time", pa.timestamp("us")), ("event_id", pa.string()),
    ("ingested_ns", pa.uint64()),
])


@dataclass(frozen=True)
class Positioned:
    """An event with where it sits in the log (its rollout's partition, and its offset there)."""

    event: Event
    partition: int
    offset: int


def _str(event: Event, name: str) -> str:
    value = getattr(event, name, None)
    return "" if value is None else str(value)


def _event_time_us(event: Event) -> int:
    """The event's own clock (``time`` or ``start_time``, float seconds); else when it was produced."""
    for name in ("time", "start_time"):
        value = getattr(event, name, None)
        if isinstance(value, (int, float)):
            return int(value * 1e6)
    return event.meta.timestamp_ns // 1000


def _attempt(event: Event) -> tuple[str, int]:
    """(attempt id, attempt number): AttemptStarted numbers its attempt; a start_rollout enqueue starts attempt 1."""
    if isinstance(event, RolloutEnqueued):
        return (event.start_attempt_id, 1) if event.start_attempt_id else ("", 0)
    return _str(event, "attempt_id"), event.sequence_id if isinstance(event, AttemptStarted) else 0


def event_columns(events: list[Positioned], ingested_ns: int | None = None) -> list[list[Any]]:
    now = ingested_ns if ingested_ns is not None else time.time_ns()
    cols: list[list[Any]] = [[] for _ in EVENT_SCHEMA]
    for p in events:
        e, meta = p.event, p.event.meta
        attempt_id, seq = _attempt(e)
        error = _str(e, "error") or _str(e, "reason")
        values = (
            meta.timestamp_ns, type(e).__name__, meta.rollout_id, attempt_id, seq, _str(e, "status"),
            _event_time_us(e), _str(e, "worker_id"), _str(e, "resources_id"), _str(e, "mode"), error,
            meta.event_id, meta.producer_id, meta.producer_seq, p.partition, p.offset, now, e.model_dump_json(),
            meta.run_id or "",
        )
        for col, v in zip(cols, values):
            col.append(v)
    return cols


def event_arrow(events: list[Positioned], ingested_ns: int | None = None) -> pa.Table:
    return columns_to_arrow(event_columns(events, ingested_ns), EVENT_SCHEMA)


def rollout_columns(snapshots: list[RolloutSnapshot], ingested_ns: int | None = None) -> list[list[Any]]:
    now = ingested_ns if ingested_ns is not None else time.time_ns()
    cols: list[list[Any]] = [[] for _ in ROLLOUT_SCHEMA]
    for s in snapshots:
        values = (s.rollout_id, s.version, s.status, s.start_time, s.end_time, s.mode or "", s.resources_id or "",
                  len(s.attempts), s.updated_ns, now, s.model_dump_json())
        for col, v in zip(cols, values):
            col.append(v)
    return cols


def rollout_arrow(snapshots: list[RolloutSnapshot], ingested_ns: int | None = None) -> pa.Table:
    return columns_to_arrow(rollout_columns(snapshots, ingested_ns), ROLLOUT_SCHEMA)


def triplet_columns(triplets: list[TripletEmitted], ingested_ns: int | None = None) -> list[list[Any]]:
    now = ingested_ns if ingested_ns is not None else time.time_ns()
    cols: list[list[Any]] = [[] for _ in TRIPLET_SCHEMA]
    for t in triplets:
        record = t.to_record()  # metadata as its JSON string, as on the wire
        values = (
            t.meta.timestamp_ns, t.rollout_id, t.attempt_id, t.index, t.group_id, t.policy_version or "",
            t.resources_id or "", t.prompt_token_ids, t.response_token_ids, t.response_logprobs, t.prompt_text,
            t.response_text, t.reward, record["metadata_json"], t.meta.event_id, t.meta.producer_id,
            t.meta.producer_seq, now, t.meta.run_id or "",
        )
        for col, v in zip(cols, values):
            col.append(v)
    return cols


def triplet_arrow(triplets: list[TripletEmitted], ingested_ns: int | None = None) -> pa.Table:
    return columns_to_arrow(triplet_columns(triplets, ingested_ns), TRIPLET_SCHEMA)


def lineage_columns(records: list[VersionTrained], ingested_ns: int | None = None) -> list[list[Any]]:
    """One row per triplet a version trained on: a sample of ``turns`` joined triplets is ``turns`` rows."""
    now = ingested_ns if ingested_ns is not None else time.time_ns()
    cols: list[list[Any]] = [[] for _ in LINEAGE_SCHEMA]
    for r in records:
        for s in r.samples:
            for index in range(s.index, s.index + s.turns):
                values = (r.version, r.run_id or "", r.resources_id, s.rollout_id, s.attempt_id, index, s.group_id, s.policy_version,
                          s.reward, s.turns, r.window, int(r.time * 1e6), r.event_id, now)
                for col, v in zip(cols, values):
                    col.append(v)
    return cols


def lineage_arrow(records: list[VersionTrained], ingested_ns: int | None = None) -> pa.Table:
    return columns_to_arrow(lineage_columns(records, ingested_ns), LINEAGE_SCHEMA)
