"""SpanRecorded events -> rows of the otel_traces-compatible spans table (pure).

:func:`span_arrow` builds the columnar (Arrow) batch the sink inserts; :func:`span_columns` the same data as Python
columns for clickhouse-connect's plain ``insert``.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa

from litstream.schemas.events import AttrValue, SpanRecorded

SPAN_COLUMNS: list[str] = [
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind", "ServiceName",
    "ResourceAttributes", "ScopeName", "ScopeVersion", "SpanAttributes", "Duration", "StatusCode", "StatusMessage",
    "Events.Timestamp", "Events.Name", "Events.Attributes",
    "Links.TraceId", "Links.SpanId", "Links.TraceState", "Links.Attributes",
    "rollout_id", "attempt_id", "sequence_id", "resources_id", "ingested_ns", "raw_json",
]

# Arrow types per column. DateTime64(9) goes as timestamp[ns] built from integer nanoseconds: exact (no Python
# datetime in between), where a plain int64 column would be read as seconds and saturate.
ATTR_MAP = pa.map_(pa.string(), pa.string())
NS = pa.timestamp("ns")
SPAN_SCHEMA = pa.schema([
    ("Timestamp", NS), ("TraceId", pa.string()), ("SpanId", pa.string()), ("ParentSpanId", pa.string()),
    ("TraceState", pa.string()), ("SpanName", pa.string()), ("SpanKind", pa.string()), ("ServiceName", pa.string()),
    ("ResourceAttributes", ATTR_MAP), ("ScopeName", pa.string()), ("ScopeVersion", pa.string()),
    ("SpanAttributes", ATTR_MAP), ("Duration", pa.uint64()), ("StatusCode", pa.string()),
    ("StatusMessage", pa.string()),
    ("Events.Timestamp", pa.list_(NS)), ("Events.Name", pa.list_(pa.string())),
    ("Events.Attributes", pa.list_(ATTR_MAP)),
    ("Links.TraceId", pa.list_(pa.string())), ("Links.SpanId", pa.list_(pa.string())),
    ("Links.TraceState", pa.list_(pa.string())), ("Links.Attributes", pa.list_(ATTR_MAP)),
    ("rollout_id", pa.string()), ("attempt_id", pa.string()), ("sequence_id", pa.uint64()),
    ("resources_id", pa.string()), ("ingested_ns", pa.uint64()), ("raw_json", pa.string()),
])
assert SPAN_SCHEMA.names == SPAN_COLUMNS

# OTLP's names for span kinds and status codes, as the collector's exporter writes them.
_KIND = {"INTERNAL": "Internal", "SERVER": "Server", "CLIENT": "Client", "PRODUCER": "Producer", "CONSUMER": "Consumer"}
_STATUS = {"UNSET": "Unset", "OK": "Ok", "ERROR": "Error"}


def attr_str(value: AttrValue) -> str:
    """Attribute values as the exporter stores them in Map(String, String)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value)


def _attrs(attrs: dict[str, AttrValue]) -> dict[str, str]:
    return {k: attr_str(v) for k, v in attrs.items()}


def span_columns(spans: list[SpanRecorded], ingested_ns: int | None = None) -> list[list[Any]]:
    """Column-oriented data for :data:`SPAN_COLUMNS` (Python values)."""
    now = ingested_ns if ingested_ns is not None else time.time_ns()
    cols: list[list[Any]] = [[] for _ in SPAN_COLUMNS]
    for s in spans:
        end = s.end_time_ns if s.end_time_ns is not None else s.start_time_ns
        service = s.resource.attributes.get("service.name")
        values = (
            s.start_time_ns, s.trace_id, s.span_id, s.parent_id or "", s.trace_state, s.name,
            _KIND.get(s.kind, s.kind), attr_str(service) if service is not None else "",
            _attrs(s.resource.attributes), s.scope_name, s.scope_version, _attrs(s.attributes),
            max(0, end - s.start_time_ns), _STATUS.get(s.status_code, s.status_code), s.status_message or "",
            [e.timestamp_ns or s.start_time_ns for e in s.events], [e.name for e in s.events],
            [_attrs(e.attributes) for e in s.events],
            [ln.trace_id for ln in s.links], [ln.span_id for ln in s.links], [ln.trace_state for ln in s.links],
            [_attrs(ln.attributes) for ln in s.links],
            s.rollout_id, s.attempt_id, s.sequence_id, s.resources_id or "", now, s.model_dump_json(),
        )
        for col, v in zip(cols, values):
            col.append(v)
    return cols


def span_arrow(spans: list[SpanRecorded], ingested_ns: int | None = None) -> pa.Table:
    """An Arrow table of :data:`SPAN_COLUMNS`, typed by :data:`SPAN_SCHEMA`, for ``insert_arrow``."""
    return columns_to_arrow(span_columns(spans, ingested_ns), SPAN_SCHEMA)


def columns_to_arrow(columns: list[list[Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays([pa.array(col, type=field.type) for col, field in zip(columns, schema)],
                                schema=schema)
