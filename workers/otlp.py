"""OTLP/HTTP trace receiver: ``POST /v1/traces`` turns OpenTelemetry spans into Agent Lightning spans.

Any OpenTelemetry SDK, in any language, exports here with ``OTEL_EXPORTER_OTLP_ENDPOINT=http://<gateway>`` (or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=http://<gateway>/v1/traces``). Both OTLP/HTTP encodings are accepted: binary
protobuf (``application/x-protobuf``) and OTLP/JSON (``application/json``: hex trace/span ids, lowerCamelCase
keys, 64-bit integers as strings), plain or gzip. The answer is an ``ExportTraceServiceResponse`` in the
request's encoding.

Ids follow the reference: rollout and attempt from the span attributes ``agentlightning.rollout_id`` and
``agentlightning.attempt_id``, else from its resource's; a span with a rollout id and no attempt id goes to the
rollout's latest attempt. ``agentlightning.span_sequence_id`` likewise (a resource's value is shared by all its
spans), else the store allocates ids in request order. The reference drops spans it cannot place with a log
line; here they are counted in the answer's ``partialSuccess`` with the reason (missing ids, unknown rollout or
attempt, malformed trace/span id, no name), OTLP's way of telling the sender — and since the stock exporters
ignore ``partialSuccess``, every refusal is also logged on the server with counts and reasons and counted in
``litstream_otlp_rejected_spans_total`` (whole requests in ``litstream_otlp_rejected_requests_total``).

Status codes: 200 for full and partial success; 400 for a body that does not decode (protobuf, JSON or gzip);
413 over the size limit; 415 for a Content-Type or Content-Encoding other than the above (the reference answers
400; OTLP/HTTP leaves this case to HTTP, whose code for it is 415, as the OpenTelemetry Collector answers); 503
when the pipeline does not answer in time, which OTLP clients retry. Error bodies are a ``google.rpc.Status`` in
the request's encoding (JSON when the content type is not one of the two).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan

from litstream.infra import metrics
from litstream.schemas.events import AttrValue
from litstream.schemas.models import AttributeValue
from litstream.workers.store import LitStore, StoreError

from .attributes import attributes_bytes, check_span_attributes
from .otel import with_token_aliases

log = logging.getLogger("litstream.otlp")

PROTOBUF = "application/x-protobuf"
JSON = "application/json"
ROLLOUT_ID = "agentlightning.rollout_id"
ATTEMPT_ID = "agentlightning.attempt_id"
SEQUENCE_ID = "agentlightning.span_sequence_id"
MISSING_IDS = (f"no {ROLLOUT_ID} in the span's or its resource's attributes (set OTEL_RESOURCE_ATTRIBUTES="
               f"{ROLLOUT_ID}=...,{ATTEMPT_ID}=...)")

_STATUS_CODES = {0: "UNSET", 1: "OK", 2: "ERROR"}
_RPC_CODES = {400: 3, 413: 8, 415: 3, 501: 12, 503: 14}  # google.rpc.Code for Status.code, for troubleshooting
_GZIP_MAGIC = b"\x1f\x8b"
_CATCH_UP_S = 5.0
_MAX_REASONS = 5


class OtlpError(Exception):
    """A request refused as a whole: the HTTP status and a developer-facing message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class _Rejected(Exception):
    """One span refused; the message is the reason reported in ``partialSuccess``."""


@dataclass
class Draft:
    """A span whose ids are read but whose sequence id may still have to be allocated: the SpanRecorded Avro
    record without its ``meta`` and ``sequence_id`` (see :meth:`LitStore.add_span_records`)."""

    rollout_id: str
    attempt_id: str | None  # None: the rollout's latest attempt, looked up before anything is written
    sequence_id: int | None
    record: dict[str, Any]

    def to_record(self, sequence_id: int) -> dict[str, Any]:
        assert self.attempt_id is not None, "attempt resolved before the record is made"
        return {**self.record, "rollout_id": self.rollout_id, "attempt_id": self.attempt_id,
                "sequence_id": sequence_id}


# -- decoding the body -------------------------------------------------------------------------------------------


def decode_request(body: bytes, content_type: str) -> ExportTraceServiceRequest:
    """Parse a (decompressed) body; an empty body is an empty request, which OTLP answers with success."""
    if not body:
        return ExportTraceServiceRequest()
    if content_type == PROTOBUF:
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except DecodeError as exc:
            raise OtlpError(400, f"body is not a protobuf ExportTraceServiceRequest: {exc}") from None
        return request
    return _from_json(body)


def _from_json(body: bytes) -> ExportTraceServiceRequest:
    try:
        doc = json.loads(body)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise OtlpError(400, f"body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise OtlpError(400, "body must be a JSON object (an OTLP/JSON ExportTraceServiceRequest)")
    _hex_ids_to_base64(doc)
    try:
        # OTLP/JSON receivers must ignore unknown fields, so newer senders keep working.
        return json_format.ParseDict(doc, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except json_format.ParseError as exc:
        raise OtlpError(400, f"body is not an OTLP/JSON ExportTraceServiceRequest: {exc}") from None


def _hex_ids_to_base64(doc: dict[str, Any]) -> None:
    """OTLP/JSON writes trace and span ids in hex where proto3's JSON mapping expects base64: rewrite them in
    place so the standard parser reads the rest. Values of the wrong type are left for the parser to refuse."""
    for resource_spans in _items(doc, "resourceSpans"):
        for scope_spans in _items(resource_spans, "scopeSpans"):
            for span in _items(scope_spans, "spans"):
                _rewrite_ids(span, ("traceId", "spanId", "parentSpanId"))
                for link in _items(span, "links"):
                    _rewrite_ids(link, ("traceId", "spanId"))


def _items(obj: Any, key: str) -> list[Any]:
    value = obj.get(key) if isinstance(obj, dict) else None
    return value if isinstance(value, list) else []


def _rewrite_ids(obj: Any, keys: tuple[str, ...]) -> None:
    if not isinstance(obj, dict):
        return
    for key in keys:
        value = obj.get(key)
        if isinstance(value, str):
            try:
                raw = bytes.fromhex(value)
            except ValueError:
                raise OtlpError(400, f"{key} {value[:64]!r} is not hex (OTLP/JSON encodes ids in hex)") from None
            obj[key] = base64.b64encode(raw).decode()


def gunzip(data: bytes, max_body: int) -> bytes:
    """Decompress with a bound on the output, so a small gzip bomb cannot exhaust memory."""
    inflater = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
    try:
        out = inflater.decompress(data, max_body + 1)
    except zlib.error as exc:
        raise OtlpError(400, f"body is not valid gzip: {exc}") from None
    if len(out) > max_body:
        raise OtlpError(413, f"body is over {max_body} bytes once decompressed")
    if not inflater.eof:
        raise OtlpError(400, "body is not valid gzip: truncated")
    return out


async def read_body(request: web.Request, max_body: int) -> bytes:
    """The body, decompressed, at most ``max_body`` bytes (before and after decompression).

    aiohttp's server gunzips request bodies itself (``auto_decompress``, its default), so what is read is
    usually plain already. A server built without it hands over the gzip bytes, recognised by their magic
    number, which can start neither a protobuf message nor JSON."""
    encoding = request.headers.get("Content-Encoding", "identity").strip().lower() or "identity"
    if encoding not in ("identity", "gzip"):
        raise OtlpError(415, f"Content-Encoding {encoding!r} is not supported; send gzip or no encoding")
    if request.content_length is not None and request.content_length > max_body:
        raise OtlpError(413, f"body of {request.content_length} bytes is over the {max_body}-byte limit")
    body = bytearray()
    try:
        async for chunk in request.content.iter_chunked(1 << 16):
            body += chunk
            if len(body) > max_body:
                raise OtlpError(413, f"body is over the {max_body}-byte limit")
    except web.RequestPayloadError as exc:  # the server could not gunzip it
        raise OtlpError(400, f"body could not be read as {encoding}: {' '.join(str(exc).split())}") from None
    if encoding == "gzip" and body[:2] == _GZIP_MAGIC:
        return gunzip(bytes(body), max_body)
    return bytes(body)


# -- OTLP spans to reference spans ---------------------------------------------------------------------------


def attributes(kvs: Iterable[KeyValue]) -> dict[str, AttrValue]:
    return {kv.key: _value(kv.value) for kv in kvs}


def _value(value: AnyValue) -> AttrValue:
    kind = value.WhichOneof("value")
    if kind == "string_value":  # most values: read at once
        return value.string_value
    if kind == "array_value":
        return [_scalar(v, v.WhichOneof("value")) for v in value.array_value.values]
    return _scalar(value, kind)


def _scalar(value: AnyValue, kind: str | None) -> str | bool | int | float | None:
    if kind is None:
        return None
    if kind == "bytes_value":
        return value.bytes_value.hex()  # as the reference: JSON-friendly
    if kind in ("array_value", "kvlist_value"):
        # Reference attributes are flat scalars or lists of them; nested values are kept whole, as JSON text.
        return json.dumps(_plain(value), separators=(",", ":"))
    result: str | bool | int | float = getattr(value, kind)
    return result


def _plain(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_plain(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _plain(kv.value) for kv in value.kvlist_value.values}
    return _scalar(value, kind)


def _first(key: str, *sources: Mapping[str, AttributeValue]) -> AttributeValue:
    return next((s[key] for s in sources if s.get(key) is not None), None)


def _text_id(key: str, *sources: Mapping[str, AttributeValue]) -> str | None:
    value = _first(key, *sources)
    return str(value) if value is not None and str(value) else None


def _sequence_id(*sources: Mapping[str, AttributeValue]) -> int | None:
    """An explicit sequence id: a positive int or a string of digits (as the LLM proxy sends it). Anything else
    is ignored and the store allocates one, as the reference does."""
    value = _first(SEQUENCE_ID, *sources)
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if value >= 1 else None


def _hex_id(raw: bytes, size: int, field: str) -> str:
    if len(raw) != size or not any(raw):
        raise _Rejected(f"{field} must be {size} bytes and not all zero")
    return raw.hex()


def _link(link: ProtoSpan.Link) -> dict[str, Any]:
    return {"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex(), "trace_state": "",  # as the store keeps it
            "attributes": attributes(link.attributes)}


def _event(event: ProtoSpan.Event) -> dict[str, Any]:
    return {"name": event.name, "timestamp_ns": event.time_unix_nano or None, "attributes": attributes(event.attributes)}


def _draft(span: ProtoSpan, resource_attrs: dict[str, AttrValue], resource: dict[str, Any],
           resource_bytes: int) -> Draft:
    """The span as the SpanRecorded record, built straight from the protobuf (no model in between: what a
    model would check is checked here, as the reference's Span fields were)."""
    attrs = with_token_aliases(attributes(span.attributes))  # the same readings as spans from the SDK processor
    rollout_id = _text_id(ROLLOUT_ID, attrs, resource_attrs)
    attempt_id = _text_id(ATTEMPT_ID, attrs, resource_attrs)
    if rollout_id is None:
        raise _Rejected(MISSING_IDS)
    if not span.name:
        raise _Rejected("the span has no name")
    trace_id = _hex_id(span.trace_id, 16, "trace_id")
    span_id = _hex_id(span.span_id, 8, "span_id")
    parent_id = _hex_id(span.parent_span_id, 8, "parent_span_id") if span.parent_span_id else None
    events = [_event(e) for e in span.events]
    links = [_link(ln) for ln in span.links]
    try:  # over the limits a span could not be one Kafka message
        check_span_attributes(attrs, "attributes", sum(attributes_bytes(e["attributes"]) for e in events)
                              + sum(attributes_bytes(ln["attributes"]) for ln in links)
                              + resource_bytes)
    except ValueError as exc:
        raise _Rejected(str(exc)) from None
    start, end = span.start_time_unix_nano, span.end_time_unix_nano or None
    if end is not None and end < start:
        raise _Rejected("end_time_ns must not be before start_time_ns")
    record = {
        "attempt_id": attempt_id, "trace_id": trace_id, "span_id": span_id, "parent_id": parent_id,
        "trace_state": "", "name": span.name, "kind": "INTERNAL",  # as the reference's Span: neither is kept
        "status_code": _STATUS_CODES.get(span.status.code, "UNSET"), "status_message": span.status.message or None,
        "start_time_ns": start, "end_time_ns": end, "attributes": attrs, "events": events, "links": links,
        "resource": resource, "scope_name": "", "scope_version": "",
    }
    return Draft(rollout_id, attempt_id, _sequence_id(attrs, resource_attrs), record)


def drafts_from_request(request: ExportTraceServiceRequest) -> tuple[list[Draft], Counter[str]]:
    """Spans in request order, and the count of refused spans by reason."""
    drafts: list[Draft] = []
    rejected: Counter[str] = Counter()
    for resource_spans in request.resource_spans:
        resource_attrs = attributes(resource_spans.resource.attributes)
        resource = {"attributes": resource_attrs, "schema_url": resource_spans.schema_url}
        resource_bytes = attributes_bytes(resource_attrs)  # counted in each of its spans' limit: measured once
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                try:
                    drafts.append(_draft(span, resource_attrs, resource, resource_bytes))
                except _Rejected as exc:
                    rejected[str(exc)] += 1
    return drafts, rejected


# -- into the store --------------------------------------------------------------------------------------------


async def _unknown(store: LitStore, pairs: Iterable[tuple[str, str | None]]) -> dict[tuple[str, str | None], str]:
    """The (rollout, attempt) pairs the live view does not know, with the reason; an attempt of None (the latest)
    is unknown while the rollout has no attempt."""
    reasons: dict[tuple[str, str | None], str] = {}
    for rid, aid in pairs:
        if await store.get_rollout_by_id(rid) is None:
            reasons[(rid, aid)] = f"unknown rollout {rid}"
        elif aid is None:
            if await store.get_latest_attempt(rid) is None:
                reasons[(rid, aid)] = f"rollout {rid} has no attempt yet and the span names no {ATTEMPT_ID}"
        elif all(a.attempt_id != aid for a in (await store.query_attempts(rid)).items):
            reasons[(rid, aid)] = f"unknown attempt {aid} of rollout {rid}"
    return reasons


async def _to_latest(store: LitStore, drafts: list[Draft]) -> None:
    """Spans with a rollout id and no attempt id go to the rollout's latest attempt."""
    for d in drafts:
        if d.attempt_id is None and (latest := await store.get_latest_attempt(d.rollout_id)) is not None:
            d.attempt_id = latest.attempt_id


async def _known_only(store: LitStore, drafts: list[Draft], rejected: Counter[str]) -> list[Draft]:
    """Drop (and count) spans of unknown rollouts or attempts before anything is written, so one stray span
    does not fail the batch in the store."""
    pairs = {(d.rollout_id, d.attempt_id) for d in drafts}
    unknown = await _unknown(store, pairs)
    if unknown:  # the view may trail the log by a moment (a rollout started elsewhere just now): catch up once
        await asyncio.to_thread(store.rollouts.caught_up, _CATCH_UP_S)
        unknown = await _unknown(store, unknown)
    for d in drafts:
        if (reason := unknown.get((d.rollout_id, d.attempt_id))) is not None:
            rejected[reason] += 1
    known = [d for d in drafts if (d.rollout_id, d.attempt_id) not in unknown]
    await _to_latest(store, known)
    return [d for d in known if d.attempt_id is not None]


async def ingest(store: LitStore, request: ExportTraceServiceRequest) -> tuple[int, Counter[str]]:
    """Write the request's spans; returns how many were accepted and the refused ones by reason."""
    drafts, rejected = drafts_from_request(request)
    drafts = await _known_only(store, drafts, rejected)
    missing = [(d.rollout_id, str(d.attempt_id)) for d in drafts if d.sequence_id is None]
    try:
        allocated = iter(await store.get_many_span_sequence_ids(missing) if missing else [])
        records = [d.to_record(d.sequence_id if d.sequence_id is not None else next(allocated)) for d in drafts]
        if records:
            await store.add_span_records(records)
    except ValueError as exc:  # the store refused a span after all (an id it no longer knows, a field it cannot hold)
        raise OtlpError(400, str(exc)) from None
    return len(drafts), rejected


def reason_kind(reason: str) -> str:
    """A reason's kind, the label of the rejection counter (reasons name rollouts: too many to be labels)."""
    if reason == MISSING_IDS:
        return "missing_rollout_id"
    for marker, kind in (("unknown rollout", "unknown_rollout"), ("unknown attempt", "unknown_attempt"),
                         ("has no attempt", "no_attempt"), ("trace_id", "bad_id"), ("span_id", "bad_id"),
                         ("no name", "no_name")):
        if marker in reason:
            return kind
    return "invalid"


def record_rejections(accepted: int, rejected: Counter[str]) -> None:
    """Log and count spans refused in a request the sender was answered 200 (with ``partialSuccess``)."""
    for reason, n in rejected.items():
        metrics.OTLP_REJECTED_SPANS.labels(reason=reason_kind(reason)).inc(n)
    log.warning("OTLP: accepted %d spans, %s", accepted, summary(rejected))


def summary(rejected: Counter[str]) -> str:
    parts = [f"{n} span{'s' if n > 1 else ''}: {reason}" for reason, n in rejected.most_common(_MAX_REASONS)]
    if len(rejected) > _MAX_REASONS:
        parts.append(f"and {len(rejected) - _MAX_REASONS} more reasons")
    return "rejected " + "; ".join(parts)


# -- HTTP ----------------------------------------------------------------------------------------------------------


def _encoded(message: ExportTraceServiceResponse, content_type: str) -> web.Response:
    if content_type == PROTOBUF:
        return web.Response(body=message.SerializeToString(), content_type=PROTOBUF)
    return web.Response(body=json_format.MessageToJson(message, indent=None).encode(), content_type=JSON)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def status_response(status: int, message: str, content_type: str,
                    headers: dict[str, str] | None = None) -> web.Response:
    """An error as OTLP/HTTP wants it: a ``google.rpc.Status`` in the request's encoding."""
    code = _RPC_CODES.get(status, 2)
    if content_type == PROTOBUF:
        # Status {int32 code = 1; string message = 2;} written directly: two fields do not warrant a
        # dependency on googleapis-common-protos.
        text = message.encode()
        body = b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text
    else:
        content_type = JSON
        body = json.dumps({"code": code, "message": message}).encode()
    return web.Response(status=status, body=body, content_type=content_type, headers=headers)


def _refused(status: int, message: str, content_type: str, headers: dict[str, str] | None = None) -> web.Response:
    """A whole request refused: logged and counted on the server too, not only told to the sender."""
    metrics.OTLP_REJECTED_REQUESTS.labels(status=str(status)).inc()
    log.warning("OTLP: request refused with %d: %s", status, message)
    return status_response(status, message, content_type, headers)


def add_otlp_routes(app: web.Application, store: LitStore, max_body: int) -> None:
    """``POST /v1/traces`` into ``store``, with bodies of at most ``max_body`` bytes (also once decompressed);
    ``/v1/metrics``, ``/v1/logs`` and ``/v1/development/profiles`` answer 501, as in the reference."""

    async def traces(request: web.Request) -> web.Response:
        content_type = request.content_type  # media type only, lower case
        try:
            if content_type not in (PROTOBUF, JSON):
                raise OtlpError(415, f"Content-Type {content_type!r} is not supported; send {PROTOBUF} or {JSON}")
            body = await read_body(request, max_body)
            accepted, rejected = await ingest(store, decode_request(body, content_type))
        except OtlpError as exc:
            return _refused(exc.status, exc.message, content_type)
        except StoreError as exc:  # the pipeline is down or behind: worth a retry
            return _refused(503, str(exc), content_type, {"Retry-After": "5"})
        response = ExportTraceServiceResponse()
        if rejected:
            response.partial_success.rejected_spans = sum(rejected.values())
            response.partial_success.error_message = summary(rejected)
            record_rejections(accepted, rejected)
        return _encoded(response, content_type)

    async def not_ingested(request: web.Request) -> web.Response:
        return status_response(501, f"{request.path} is not ingested; only traces are (POST /v1/traces)",
                               request.content_type)

    app.router.add_post("/v1/traces", traces)
    for path in ("/v1/metrics", "/v1/logs", "/v1/development/profiles"):
        app.router.add_post(path, not_ingested)


__all__ = ["Draft", "OtlpError", "add_otlp_routes", "attributes", "decode_request", "drafts_from_request",
           "gunzip", "ingest", "read_body", "status_response", "summary"]
