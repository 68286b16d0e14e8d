"""SpanRecorded events -> columns of the otel_traces-compatible spans table (pure)."""

from __future__ import annotations

import json
import time
from typing import Any

from litstream.schemas.events import AttrValue, SpanRecorded

SPAN_COLUMNS: list[str] = [
    "Timestamp", "TraceId", "SpanId", "ParentSpanId", "TraceState", "SpanName", "SpanKind", "ServiceName",
    "ResourceAttributes", "ScopeName", "ScopeVersion", "SpanAttributes", "Duration", "StatusCode", "StatusMessage",
    "Events.Timestamp", "Events.Name", "Events.Attributes",
    "Links.TraceId", "Links.SpanId", "Links.TraceState", "Links.Attributes",
    "rollout_id", "attempt_id", "sequence_id", "resources_id", "ingested_ns", "raw_json",
]

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


def span_columns(spans: list[SpanRecorded]) -> list[list[Any]]:
    """Column-oriented data for :data:`SPAN_COLUMNS`."""
    now = time.time_ns()
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
