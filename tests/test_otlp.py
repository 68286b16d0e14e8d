"""The OTLP/HTTP trace receiver on the real pipeline: the stock OpenTelemetry exporter, hand-written OTLP/JSON
with gzip, partial success for spans it cannot place, and 4xx answers for bad requests."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from aiohttp import web
from google.rpc.status_pb2 import Status
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as ProtoResource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from litstream.infra import metrics
from litstream.infra.broker import free_port
from litstream.infra.settings import Settings
from litstream.workers.otlp import ATTEMPT_ID, ROLLOUT_ID, SEQUENCE_ID, OtlpError, add_otlp_routes, gunzip
from litstream.workers.store import LitStore

MAX_BODY = 64 << 10
PROTOBUF, JSON = "application/x-protobuf", "application/json"


@asynccontextmanager
async def receiver(settings: Settings) -> AsyncIterator[tuple[LitStore, str]]:
    """A store and an aiohttp app with only the OTLP routes, on a free local port."""
    store = LitStore(settings)
    await store.wait_until_ready()
    app = web.Application()
    add_otlp_routes(app, store, MAX_BODY)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield store, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
        await store.close()


def post(url: str, body: bytes, content_type: str, **headers: str) -> tuple[int, str, bytes]:
    req = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type, **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get_content_type(), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get_content_type(), exc.read()


async def apost(url: str, body: bytes, content_type: str, **headers: str) -> tuple[int, str, bytes]:
    return await asyncio.to_thread(post, url, body, content_type, **headers)


def export_nested_spans(rollout_id: str, attempt_id: str) -> SpanExportResult:
    """An agent's spans, exported by the stock OTLP/HTTP exporter configured only through the environment."""
    collected = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({ROLLOUT_ID: rollout_id, ATTEMPT_ID: attempt_id,
                                                        "service.name": "agent"}))
    provider.add_span_processor(SimpleSpanProcessor(collected))
    tracer = provider.get_tracer("test-agent")
    with tracer.start_as_current_span("agent.run", attributes={"task": "sum"}):
        with tracer.start_as_current_span("openai.chat.completion",
                                          attributes={"gen_ai.usage.prompt_tokens": 12, "ids": [1, 2]}) as llm:
            llm.add_event("token", {"i": 1})
            with tracer.start_as_current_span("tool.call"):
                pass
        with tracer.start_as_current_span("agentlightning.annotation",
                                          attributes={"agentlightning.reward.0.value": 1.0}):
            pass
    provider.shutdown()
    exporter = OTLPSpanExporter()  # endpoint and compression from OTEL_EXPORTER_OTLP_*
    try:
        return exporter.export(collected.get_finished_spans())  # one request, spans in the order they ended
    finally:
        exporter.shutdown()


def kv(key: str, value: str | int) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(int_value=value) if isinstance(value, int) else AnyValue(string_value=value))


def proto_span(name: str, n: int, **attrs: str | int) -> ProtoSpan:
    now = time.time_ns()
    return ProtoSpan(trace_id=bytes([7]) * 16, span_id=n.to_bytes(8, "big"), name=name, start_time_unix_nano=now,
                     end_time_unix_nano=now + 1000, attributes=[kv(k, v) for k, v in attrs.items()])


def resource_spans(spans: list[ProtoSpan], **attrs: str) -> ResourceSpans:
    return ResourceSpans(resource=ProtoResource(attributes=[kv(k, v) for k, v in attrs.items()]),
                         scope_spans=[ScopeSpans(spans=spans)])


def test_otlp_ingest(pipeline: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        async with receiver(pipeline) as (store, base):
            ro = await store.start_rollout({"q": 1})
            rid, aid = ro.rollout_id, ro.attempt.attempt_id

            # (a) the stock exporter, pointed here the way any OpenTelemetry SDK is: by environment, gzip on
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", base)
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
            assert await asyncio.to_thread(export_nested_spans, rid, aid) == SpanExportResult.SUCCESS
            spans = (await store.query_spans(rid)).items
            assert [s.name for s in spans] == ["tool.call", "openai.chat.completion", "agentlightning.annotation",
                                               "agent.run"]  # sequence ids in request order
            seqs = [s.sequence_id for s in spans]
            assert seqs == sorted(set(seqs)) and seqs[0] >= 1
            by_name = {s.name: s for s in spans}
            root, llm = by_name["agent.run"], by_name["openai.chat.completion"]
            assert root.parent_id is None and llm.parent_id == root.span_id
            assert by_name["tool.call"].parent_id == llm.span_id
            assert by_name["agentlightning.annotation"].parent_id == root.span_id
            assert len({s.trace_id for s in spans}) == 1 and len(root.trace_id) == 32
            assert llm.attributes["gen_ai.usage.prompt_tokens"] == 12 and llm.attributes["ids"] == [1, 2]
            assert by_name["agentlightning.annotation"].attributes["agentlightning.reward.0.value"] == 1.0
            assert [e.name for e in llm.events] == ["token"] and llm.events[0].attributes == {"i": 1}
            assert root.resource.attributes[ROLLOUT_ID] == rid and root.resource.attributes["service.name"] == "agent"
            assert root.start_time is not None and abs(root.start_time - time.time()) < 120  # seconds, not ns
            assert all(s.attempt_id == aid for s in spans)

            # spans are heartbeats: the attempt is running
            deadline = time.monotonic() + 15
            while (att := await store.get_latest_attempt(rid)) is not None and att.status != "running":
                assert time.monotonic() < deadline, att
                await asyncio.sleep(0.1)

            # (b) OTLP/JSON as other SDKs write it (hex ids in any case, int64 as strings), gzip-compressed
            now = time.time_ns()
            doc = {"resourceSpans": [{
                "resource": {"attributes": [{"key": ROLLOUT_ID, "value": {"stringValue": rid}},
                                            {"key": ATTEMPT_ID, "value": {"stringValue": aid}}]},
                "scopeSpans": [{"scope": {"name": "js-agent"}, "spans": [
                    {"traceId": "5B8EFFF798038103D269B633813FC60C", "spanId": "EEE19B7EC3C1B174", "name": "js.root",
                     "kind": 2, "startTimeUnixNano": str(now), "endTimeUnixNano": str(now + 5_000_000),
                     "attributes": [{"key": "tokens", "value": {"intValue": "42"}},
                                    {"key": "meta", "value": {"kvlistValue": {"values": [
                                        {"key": "a", "value": {"boolValue": True}}]}}}],
                     "status": {"code": 2, "message": "tool failed"}, "someFutureField": 1},
                    {"traceId": "5b8efff798038103d269b633813fc60c", "spanId": "eee19b7ec3c1b175",
                     "parentSpanId": "eee19b7ec3c1b174", "name": "js.child", "startTimeUnixNano": str(now),
                     "endTimeUnixNano": str(now + 1_000_000)}]}]}]}
            status, ctype, body = await apost(f"{base}/v1/traces", gzip.compress(json.dumps(doc).encode()), JSON,
                                              **{"Content-Encoding": "gzip"})
            assert (status, ctype, json.loads(body)) == (200, JSON, {})  # full success: partialSuccess unset
            js = {s.name: s for s in (await store.query_spans(rid, name_contains="js.")).items}
            assert js["js.child"].parent_id == js["js.root"].span_id == "eee19b7ec3c1b174"
            assert js["js.root"].trace_id == "5b8efff798038103d269b633813fc60c"
            assert js["js.root"].attributes == {"tokens": 42, "meta": '{"a":true}'}
            assert js["js.root"].status.status_code == "ERROR" and js["js.root"].status.description == "tool failed"
            assert js["js.root"].end_time - js["js.root"].start_time == pytest.approx(0.005, abs=1e-4)  # type: ignore[operator]
            assert seqs[-1] < js["js.root"].sequence_id < js["js.child"].sequence_id

            # (c) spans it cannot place are counted, with the reason; the rest is stored
            request = ExportTraceServiceRequest(resource_spans=[
                resource_spans([proto_span("no.ids", 1),
                                proto_span("span.ids", 2, **{ROLLOUT_ID: rid, ATTEMPT_ID: aid, SEQUENCE_ID: "1000"})],
                               **{"service.name": "mixed"}),
                resource_spans([proto_span("lost", 3)], **{ROLLOUT_ID: "ro-nope", ATTEMPT_ID: aid}),
                resource_spans([proto_span("stray", 4), proto_span("stray", 5)], **{ROLLOUT_ID: rid,
                                                                                     ATTEMPT_ID: "at-nope"}),
                resource_spans([proto_span("", 6)], **{ROLLOUT_ID: rid, ATTEMPT_ID: aid}),
            ])
            status, ctype, body = await apost(f"{base}/v1/traces", request.SerializeToString(), PROTOBUF)
            assert (status, ctype) == (200, PROTOBUF)
            partial = ExportTraceServiceResponse.FromString(body).partial_success
            assert partial.rejected_spans == 5
            assert "1 span: the span has no name" in partial.error_message
            assert "1 span: no agentlightning.rollout_id" in partial.error_message
            assert "1 span: unknown rollout ro-nope" in partial.error_message
            assert f"2 spans: unknown attempt at-nope of rollout {rid}" in partial.error_message
            kept = (await store.query_spans(rid, name="span.ids")).items
            assert [s.sequence_id for s in kept] == [1000]  # the span's own sequence id
            assert (await store.get_next_span_sequence_id(rid, aid)) > 1000  # and the counter moved past it

    asyncio.run(scenario())


def test_otlp_bad_requests(settings: Settings) -> None:
    async def scenario() -> None:
        async with receiver(settings) as (_, base):
            url = f"{base}/v1/traces"

            def message(ctype: str, body: bytes) -> str:
                return Status.FromString(body).message if ctype == PROTOBUF else json.loads(body)["message"]

            cases: list[tuple[bytes, str, dict[str, str], int, str]] = [
                (b"\xff\xff\xff", PROTOBUF, {}, 400, "not a protobuf ExportTraceServiceRequest"),
                (b"{not json", JSON, {}, 400, "not JSON"),
                (b"[]", JSON, {}, 400, "must be a JSON object"),
                (b'{"resourceSpans": 5}', JSON, {}, 400, "not an OTLP/JSON ExportTraceServiceRequest"),
                (b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"traceId": "zz"}]}]}]}', JSON, {}, 400,
                 "traceId 'zz' is not hex"),
                (b"not gzip at all", PROTOBUF, {"Content-Encoding": "gzip"}, 400, "could not be read as gzip"),
                (b"{}", "text/plain", {}, 415, "Content-Type 'text/plain' is not supported"),
                (b"{}", JSON, {"Content-Encoding": "compress"}, 415, "Content-Encoding 'compress'"),
                (b"\x0a" + b"\x00" * (MAX_BODY + 10), PROTOBUF, {}, 413, f"over the {MAX_BODY}-byte limit"),
                (gzip.compress(b" " * (MAX_BODY * 4)), JSON, {"Content-Encoding": "gzip"}, 413, "over the"),
            ]
            for body, ctype, headers, want_status, want_text in cases:
                status, got_ctype, raw = await apost(url, body, ctype, **headers)
                assert status == want_status, (ctype, headers, raw[:200])
                assert got_ctype == (ctype if ctype in (PROTOBUF, JSON) else JSON)
                assert want_text in message(got_ctype, raw), raw[:300]

            # partial success in OTLP/JSON: int64 as a string, lowerCamelCase keys
            doc = {"resourceSpans": [{"scopeSpans": [{"spans": [
                {"traceId": "01" * 16, "spanId": "02" * 8, "name": "orphan"}]}]}]}
            status, ctype, raw = await apost(url, json.dumps(doc).encode(), JSON)
            partial = json.loads(raw)["partialSuccess"]
            assert (status, ctype, partial["rejectedSpans"]) == (200, JSON, "1")
            assert "no agentlightning.rollout_id" in partial["errorMessage"]

            status, ctype, raw = await apost(url, b"", PROTOBUF)  # an empty request succeeds
            assert (status, ctype, raw) == (200, PROTOBUF, b"")
            status, ctype, raw = await apost(f"{base}/v1/metrics", b"", PROTOBUF)
            assert status == 501 and "only traces" in Status.FromString(raw).message

    asyncio.run(scenario())

    # the fallback for servers that hand over gzip bodies undecoded
    assert gunzip(gzip.compress(b"abc"), 10) == b"abc"
    for data, status in ((gzip.compress(b"x" * 100), 413), (b"\x1f\x8bnot", 400), (gzip.compress(b"abc")[:-6], 400)):
        with pytest.raises(OtlpError) as err:
            gunzip(data, 10)
        assert err.value.status == status


def _rejected(reason: str) -> float:
    return metrics.REGISTRY.get_sample_value("litstream_otlp_rejected_spans_total", {"reason": reason}) or 0.0


def test_spans_without_attempt_go_to_the_latest_and_refusals_are_logged_and_counted(
        pipeline: Settings, caplog: pytest.LogCaptureFixture) -> None:
    async def scenario() -> None:
        async with receiver(pipeline) as (store, base):
            ro = await store.start_rollout({"q": 1})
            latest = (await store.start_attempt(ro.rollout_id)).attempt.attempt_id
            queued = await store.enqueue_rollout({"q": 2})  # no attempt yet: nowhere to put a span
            before = {k: _rejected(k) for k in ("no_attempt", "missing_rollout_id")}
            request = ExportTraceServiceRequest(resource_spans=[
                resource_spans([proto_span("to.latest", 1)], **{ROLLOUT_ID: ro.rollout_id}),
                resource_spans([proto_span("too.early", 2)], **{ROLLOUT_ID: queued.rollout_id}),
                resource_spans([proto_span("no.ids", 3)]),
            ])
            with caplog.at_level("WARNING", logger="litstream.otlp"):
                status, _, body = await apost(f"{base}/v1/traces", request.SerializeToString(), PROTOBUF)
            assert status == 200
            partial = ExportTraceServiceResponse.FromString(body).partial_success
            assert partial.rejected_spans == 2 and "has no attempt yet" in partial.error_message
            spans = (await store.query_spans(ro.rollout_id)).items
            assert [(s.name, s.attempt_id) for s in spans] == [("to.latest", latest)]
            # the stock exporters ignore partialSuccess: the server says it and counts it
            logged = [r.getMessage() for r in caplog.records if r.name == "litstream.otlp"]
            assert any("accepted 1 spans" in m and "2 spans" not in m and "no agentlightning.rollout_id" in m
                       for m in logged), logged
            assert _rejected("no_attempt") == before["no_attempt"] + 1
            assert _rejected("missing_rollout_id") == before["missing_rollout_id"] + 1

            refused = metrics.REGISTRY.get_sample_value("litstream_otlp_rejected_requests_total", {"status": "415"})
            await apost(f"{base}/v1/traces", b"{}", "text/plain")
            after = metrics.REGISTRY.get_sample_value("litstream_otlp_rejected_requests_total", {"status": "415"})
            assert (after or 0) == (refused or 0) + 1

    asyncio.run(scenario())
