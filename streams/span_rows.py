"""SpanRecorded events -> rows of the otel_traces-compatible spans table (pure).

:func:`span_record_arrow` builds the columnar (Arrow) batch the sink inserts from the decoded Avro records;
:func:`span_arrow` and :func:`span_columns` the same from models.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pyarrow as pa
from pydantic_core import to_json

from litstream.schemas.events import AttrValue, SpanRecorded

SPAN_COLUMNS: list[str] = [
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind", "ServiceName",
    "ResourceAttributes", "ScopeName", "ScopeVersion", "SpanAttributes", "Duration", "StatusCode", "StatusMessage",
    "Events.Timestamp", "Events.Name", "Events.Attributes",
    "Links.TraceId", "Links.SpanId", "Links.TraceState", "Links.Attributes",
    "rollout_id", "attempt_id", "sequence_id", "resources_id", "ingested_ns", "raw_json", "run_id",
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
    ("resources_id", pa.string()), ("ingested_ns", pa.uint64()), ("raw_json", pa.string()), ("run_id", pa.string()),
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
    return {k: v if type(v) is str else attr_str(v) for k, v in attrs.items()}


def _raw_json(record: dict[str, Any]) -> str:
    """The span as JSON, as SpanRecorded.model_dump_json writes it (pydantic's compiled encoder: a quarter of
    the cost of json.dumps on a 2 kB span)."""
    return to_json(record).decode()


def span_record_columns(records: list[dict[str, Any]], ingested_ns: int | None = None) -> list[list[Any]]:
    """Column-oriented data for :data:`SPAN_COLUMNS` from SpanRecorded Avro records (as the codec's
    ``decode_record`` gives them): one comprehension per column, no model in between."""
    now = ingested_ns if ingested_ns is not None else time.time_ns()
    starts = [r["start_time_ns"] for r in records]
    events = [r["events"] for r in records]
    links = [r["links"] for r in records]
    resources = [r["resource"]["attributes"] for r in records]
    services = [res.get("service.name") for res in resources]
    return [
        starts, [r["trace_id"] for r in records], [r["span_id"] for r in records],
        [r["parent_id"] or "" for r in records], [r["trace_state"] for r in records], [r["name"] for r in records],
        [_KIND.get(r["kind"], r["kind"]) for r in records],
        [attr_str(s) if s is not None else "" for s in services], [_attrs(res) for res in resources],
        [r["scope_name"] for r in records], [r["scope_version"] for r in records],
        [_attrs(r["attributes"]) for r in records],
        [max(0, (r["end_time_ns"] if r["end_time_ns"] is not None else st) - st) for r, st in zip(records, starts)],
        [_STATUS.get(r["status_code"], r["status_code"]) for r in records],
        [r["status_message"] or "" for r in records],
        [[e["timestamp_ns"] or st for e in evs] for evs, st in zip(events, starts)],
        [[e["name"] for e in evs] for evs in events], [[_attrs(e["attributes"]) for e in evs] for evs in events],
        [[ln["trace_id"] for ln in lns] for lns in links], [[ln["span_id"] for ln in lns] for lns in links],
        [[ln["trace_state"] for ln in lns] for lns in links],
        [[_attrs(ln["attributes"]) for ln in lns] for lns in links],
        [r["meta"]["rollout_id"] for r in records], [r["attempt_id"] for r in records],
        [r["sequence_id"] for r in records], [r["resources_id"] or "" for r in records], [now] * len(records),
        [_raw_json(r) for r in records], [r["meta"].get("run_id") or "" for r in records],
    ]


def span_columns(spans: list[SpanRecorded], ingested_ns: int | None = None) -> list[list[Any]]:
    """Column-oriented data for :data:`SPAN_COLUMNS` (Python values)."""
    return span_record_columns([s.to_record() for s in spans], ingested_ns)


def span_arrow(spans: list[SpanRecorded], ingested_ns: int | None = None) -> pa.Table:
    """An Arrow table of :data:`SPAN_COLUMNS`, typed by :data:`SPAN_SCHEMA`, for ``insert_arrow``."""
    return columns_to_arrow(span_columns(spans, ingested_ns), SPAN_SCHEMA)


def span_record_arrow(records: list[dict[str, Any]], ingested_ns: int | None = None) -> pa.Table:
    """:func:`span_arrow` from Avro records (the sink's path)."""
    return columns_to_arrow(span_record_columns(records, ingested_ns), SPAN_SCHEMA)


def columns_to_arrow(columns: list[list[Any]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_arrays([pa.array(col, type=field.type) for col, field in zip(columns, schema)],
                                schema=schema)
