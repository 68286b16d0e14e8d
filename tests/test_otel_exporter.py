"""The OpenTelemetry processor: finished spans of a real TracerProvider become SpanRecorded events on the spans
topic of a real broker, with ids resolved as documented, a bounded queue, and nothing lost on a normal exit."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from litstream.app.stack import settings_env
from litstream.infra.kafka import read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.events import AttemptHeartbeat, SpanRecorded
from litstream.workers.emitters import attempt_context
from litstream.workers.otel import KafkaSpanProcessor
from litstream.workers.sdk import AttemptContext


def ids_resource(rollout_id: str | None = None, attempt_id: str | None = None, **extra: str) -> Resource:
    attrs = {"service.name": "agent-under-test", **extra}
    if rollout_id:
        attrs |= {"agentlightning.rollout_id": rollout_id, "agentlightning.attempt_id": attempt_id or ""}
    return Resource.create(attrs)


@pytest.fixture
def events(settings: Settings) -> EventProducer:
    return EventProducer(settings, role="test")


@pytest.fixture
def make_provider(events: EventProducer) -> Iterator:
    made: list[TracerProvider] = []

    def make(resource: Resource,
             processor: KafkaSpanProcessor | None = None) -> tuple[TracerProvider, KafkaSpanProcessor]:
        processor = processor or KafkaSpanProcessor(events)
        provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        provider.add_span_processor(processor)
        made.append(provider)
        return provider, processor

    yield make
    for provider in made:
        provider.shutdown()


def read_spans(settings: Settings, events: EventProducer) -> list[SpanRecorded]:
    return [events.codec.decode_as(m.value(), SpanRecorded) for m in read_to_end(settings, events.topics.spans)]


def test_nested_genai_spans_arrive_with_parents_ids_and_both_token_spellings(settings: Settings, events: EventProducer,
                                                                              make_provider) -> None:
    provider, processor = make_provider(ids_resource("ro-otel", "at-otel"))
    tracer = provider.get_tracer("my.agent", "1.2.3")
    with tracer.start_as_current_span("agent.run", kind=SpanKind.SERVER) as root:
        root.add_event("started", {"step": 1})
        with tracer.start_as_current_span("chat gpt-x", kind=SpanKind.CLIENT, attributes={
                "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-x", "gen_ai.usage.input_tokens": 12,
                "gen_ai.usage.output_tokens": 3, "gen_ai.prompt.0.content": "2+2?", "gen_ai.completion.0.content": "4",
                "prompt_token_ids": (1, 2, 3)}, links=[Link(root.get_span_context(), {"why": "follows"})]):
            with tracer.start_as_current_span("legacy llm", attributes={
                    "gen_ai.usage.prompt_tokens": 5, "gen_ai.usage.completion_tokens": 7}) as legacy:
                legacy.set_status(Status(StatusCode.ERROR, "boom"))
    assert processor.force_flush()

    got = {s.name: s for s in read_spans(settings, events)}
    assert set(got) == {"agent.run", "chat gpt-x", "legacy llm"}
    run, chat, legacy_span = got["agent.run"], got["chat gpt-x"], got["legacy llm"]
    # sequence ids from the processor's per-rollout counter, in end order
    assert [legacy_span.sequence_id, chat.sequence_id, run.sequence_id] == [1, 2, 3]
    assert all(s.rollout_id == "ro-otel" and s.attempt_id == "at-otel" for s in got.values())
    assert len({s.trace_id for s in got.values()}) == 1 and len(run.trace_id) == 32
    assert run.parent_id is None and chat.parent_id == run.span_id and legacy_span.parent_id == chat.span_id
    assert (run.kind, chat.kind, legacy_span.kind) == ("SERVER", "CLIENT", "INTERNAL")
    assert (legacy_span.status_code, legacy_span.status_message) == ("ERROR", "boom")
    assert run.events[0].name == "started" and run.events[0].attributes == {"step": 1}
    assert chat.links[0].span_id == run.span_id and chat.links[0].attributes == {"why": "follows"}
    assert chat.attributes["gen_ai.request.model"] == "gpt-x" and chat.attributes["prompt_token_ids"] == [1, 2, 3]
    assert chat.attributes["gen_ai.usage.input_tokens"] == chat.attributes["gen_ai.usage.prompt_tokens"] == 12
    assert chat.attributes["gen_ai.usage.output_tokens"] == chat.attributes["gen_ai.usage.completion_tokens"] == 3
    assert legacy_span.attributes["gen_ai.usage.input_tokens"] == 5
    assert legacy_span.attributes["gen_ai.usage.output_tokens"] == 7
    assert run.resource.attributes["service.name"] == "agent-under-test"
    assert (run.scope_name, run.scope_version) == ("my.agent", "1.2.3")
    assert 0 < run.start_time_ns <= chat.start_time_ns <= chat.end_time_ns <= run.end_time_ns  # type: ignore[operator]

    beats = [events.codec.decode(m.value()) for m in read_to_end(settings, events.topics.rollout_events)]
    assert beats and all(isinstance(b, AttemptHeartbeat) and b.attempt_id == "at-otel" for b in beats)
    assert max(b.max_sequence_id or 0 for b in beats) == 3  # the rollout's counter moves past the ids used
    assert processor.stats()["sent"] == 3


def test_ids_come_from_span_then_resource_then_the_active_attempt(
        settings: Settings, events: EventProducer, make_provider, caplog: pytest.LogCaptureFixture) -> None:
    provider, processor = make_provider(ids_resource("ro-res", "at-res"))
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("from-resource"):
        pass
    with tracer.start_as_current_span("from-span", attributes={"agentlightning.rollout_id": "ro-span",
                                                               "agentlightning.attempt_id": "at-span"}):
        pass
    with tracer.start_as_current_span("explicit-seq", attributes={"agentlightning.span_sequence_id": "7"}):
        pass
    with tracer.start_as_current_span("after-explicit"):
        pass

    bare, bare_processor = make_provider(ids_resource(), KafkaSpanProcessor(events))
    ctx = AttemptContext(events, "ro-ctx", "at-ctx", resources_id="rs-9", worker_id="w-1", first_sequence_id=40)
    with attempt_context(ctx), bare.get_tracer("t").start_as_current_span("from-context"):
        pass
    no_ids = bare.get_tracer("t")
    with caplog.at_level(logging.WARNING, logger="litstream.otel"), no_ids.start_as_current_span("no-ids"):
        pass
    assert processor.force_flush() and bare_processor.force_flush()

    got = {s.name: s for s in read_spans(settings, events)}
    assert set(got) == {"from-resource", "from-span", "explicit-seq", "after-explicit", "from-context"}
    ident = {n: (s.rollout_id, s.attempt_id, s.sequence_id) for n, s in got.items()}
    assert ident["from-resource"] == ("ro-res", "at-res", 1)
    assert ident["from-span"] == ("ro-span", "at-span", 1)  # span attributes win over the resource's
    assert ident["explicit-seq"] == ("ro-res", "at-res", 7)
    assert ident["after-explicit"] == ("ro-res", "at-res", 8)  # the fallback counter moved past the explicit id
    assert ident["from-context"] == ("ro-ctx", "at-ctx", 40)  # the attempt's own counter
    assert got["from-context"].resources_id == "rs-9" and ctx.max_sequence_id == 40
    assert bare_processor.stats()["dropped_no_ids"] == 1
    assert any("dropped" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)


class StalledProcessor(KafkaSpanProcessor):
    """Holds its first batch until released, so the queue fills deterministically."""

    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.entered, self.release = threading.Event(), threading.Event()
        super().__init__(*args, **kwargs)

    def _export(self, batch) -> None:  # type: ignore[no-untyped-def]
        self.entered.set()
        self.release.wait(20)
        super()._export(batch)


def test_full_queue_drops_the_newest_without_blocking(settings: Settings, events: EventProducer, make_provider,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    stalled = StalledProcessor(events, max_queue_size=3, max_batch_size=1)
    provider, _ = make_provider(ids_resource("ro-full", "at-full"), stalled)
    tracer = provider.get_tracer("t")
    with tracer.start_as_current_span("s0"):
        pass
    assert stalled.entered.wait(5)  # s0 is held by the background thread; the queue is empty
    with caplog.at_level(logging.WARNING, logger="litstream.otel"):
        for i in range(1, 7):
            with tracer.start_as_current_span(f"s{i}"):
                pass
    # The agent's thread never waits for Kafka: had it waited for room, the held export would have made some, and
    # nothing would have been dropped.
    stats = stalled.stats()
    assert (stats["queued"], stats["dropped_queue_full"]) == (4, 3)
    assert [r for r in caplog.records if "queue is full" in r.getMessage()]
    stalled.release.set()
    assert stalled.force_flush()
    assert sorted(s.name for s in read_spans(settings, events)) == ["s0", "s1", "s2", "s3"]


SCRIPT = textwrap.dedent("""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
    from litstream.workers.otel import KafkaSpanProcessor

    # shutdown_on_exit=False: the processor's own exit hook has to deliver the spans
    resource = Resource.create({"agentlightning.rollout_id": "ro-exit", "agentlightning.attempt_id": "at-exit"})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(KafkaSpanProcessor())
    tracer = provider.get_tracer("exit-test")
    for i in range(N_SPANS):
        with tracer.start_as_current_span("root-%d" % i):
            with tracer.start_as_current_span("child-%d" % i):
                pass
    print("ended", flush=True)
""")


def test_a_process_that_exits_normally_delivers_every_span(settings: Settings, events: EventProducer) -> None:
    n = 300
    out = subprocess.run([sys.executable, "-c", SCRIPT.replace("N_SPANS", str(n))], check=False, timeout=60,
                         env={**os.environ, **settings_env(settings)}, capture_output=True, text=True)
    assert out.returncode == 0 and "ended" in out.stdout, out.stderr
    got = read_spans(settings, events)
    assert len(got) == 2 * n
    assert sorted(s.sequence_id for s in got) == list(range(1, 2 * n + 1))
    assert {s.name for s in got} == {f"{k}-{i}" for i in range(n) for k in ("root", "child")}


class _Collect(SpanProcessor):
    """A span processor that keeps the finished spans (no Kafka): for the pure conversion."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


def test_the_direct_record_is_the_model_and_encodes_to_the_same_bytes() -> None:
    """The exporter writes spans as Avro records built without a model: each is a valid SpanRecorded, and the
    bytes are those the model would encode to."""
    from litstream.schemas.codec import Codec
    from litstream.schemas.events import EventFactory
    from litstream.workers.otel import _Queued, span_record

    collect = _Collect()
    provider = TracerProvider(resource=Resource({"service.name": "t", "n": 3, "big": 2**70}))
    provider.add_span_processor(collect)
    tracer = provider.get_tracer("test-scope", "1.2")
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER) as root:
        root.set_attributes({"s": "x", "b": True, "i": 7, "f": 0.5, "l": [1, 2], "ls": ("a", "b")})
        with tracer.start_as_current_span("child", links=[Link(root.get_span_context(), {"k": "v"})]) as child:
            child.add_event("e", {"x": 1.5})
            child.set_status(Status(StatusCode.ERROR, "boom"))
    codec, factory = Codec(), EventFactory("test")
    assert len(collect.spans) == 2
    for i, span in enumerate(collect.spans):
        item = _Queued(span, "ro-1", "at-1", i + 1, None, None)
        plain = span_record(item, factory)
        model = SpanRecorded.model_validate(plain)  # everything a model checks holds
        assert model.to_record() == {**plain, "meta": model.meta.to_record()}
        data = codec.encode_record(SpanRecorded.avro_name, plain)
        decoded = codec.decode_as(data, SpanRecorded)
        assert decoded.model_dump(exclude={"meta"}) == model.model_dump(exclude={"meta"})
        assert codec.encode(decoded) == data
