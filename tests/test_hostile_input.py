"""Hostile input on every edge of a running pipeline (lifecycle, span sink, triplet processor, trainer, runner,
gateway as processes on the real broker and chDB).

Every input topic gets random bytes, a single-object header with an unknown schema fingerprint, truncated Avro and
valid Avro of the wrong record type; rollout-events also gets events for unknown rollouts, a key that is not the
rollout id and impossible transitions. Each bad message must become a dead letter with its reason from the
topic's consumer, and rollouts must still run end to end afterwards. Over HTTP: oversized attributes, unknown ids,
a large OTLP batch. The SDK refuses oversized attributes at the call.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from litstream.app.stack import Stack
from litstream.infra import clickhouse, health
from litstream.infra.broker import free_port
from litstream.infra.kafka import headers_dict, producer, read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.infra.topics import CATALOGUE, Topics
from litstream.schemas.codec import default_codec
from litstream.schemas.events import (
    AttemptStarted,
    AttemptStatusChanged,
    EventFactory,
    RolloutEnqueued,
    TripletEmitted,
)
from litstream.schemas.models import FINISHED
from litstream.streams.replay import verify
from litstream.workers.attributes import MAX_ATTRIBUTES, MAX_SPAN_ATTRIBUTE_BYTES, MAX_VALUE_BYTES
from litstream.workers.sdk import AttemptContext
from tests.lifecycle_helpers import Driver
from tests.samples import all_records
from tests.waiting import until

TESTS_DIR = str(Path(__file__).parent)
CODEC = default_codec()
F = EventFactory(role="hostile")
SAMPLES = {type(r).__name__: r for r in all_records()}
REASON = "litstream.dlq.reason"

# topic role -> (the record it carries, a valid record that does not belong there)
TOPIC_RECORDS = {
    "rollout-events": ("RolloutEnqueued", "SpanRecorded"),
    "spans": ("SpanRecorded", "RolloutEnqueued"),
    "triplets": ("TripletEmitted", "SpanRecorded"),
    "rollout-state": ("RolloutSnapshot", "TripletEmitted"),
    "rollout-offers": ("RolloutOffered", "SpanRecorded"),
    "resources": ("ResourcesPublished", "SpanRecorded"),
}
# source topic role -> the (processor, dead-letter topic role) that must dead-letter its bad messages
DEAD_LETTERED_BY = {
    "rollout-events": [("lifecycle", "rollout-events")],
    "spans": [("span-sink", "spans"), ("triplets", "triplets")],
    "triplets": [("trainer", "triplets")],
    "rollout-state": [("triplets", "triplets")],
    "rollout-offers": [("runner", "rollout-offers")],
    "resources": [],  # read only by views (runner, Store API), which skip what they cannot decode
}


def bad_messages(role: str, rng: random.Random) -> dict[str, bytes]:
    right, wrong = TOPIC_RECORDS[role]
    good = CODEC.encode(SAMPLES[right])
    return {
        "random bytes": b"\x07" + rng.randbytes(63),
        "unknown fingerprint": b"\xc3\x01" + rng.randbytes(8) + good[10:],
        "truncated Avro": good[: len(good) // 2],
        "wrong record type": CODEC.encode(SAMPLES[wrong]),
    }


def call(base: str, path: str, body: Any = None, raw: bytes | None = None,
         ctype: str = "application/json") -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(base + path, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture
def everything(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Stack, str]]:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS_DIR, os.environ.get("PYTHONPATH", "")]))
    port = free_port()
    with Stack(settings) as stack:
        stack.start("lifecycle", "process", "lifecycle")
        stack.start("span-sink", "process", "span-sink")
        stack.start("triplets", "process", "triplets")
        stack.start("trainer", "process", "trainer")
        stack.start("runner", "runner", "--agent", "fault_agents:llm_call_agent", "--concurrency", "2")
        stack.start("gateway", "gateway", "--port", str(port))
        for name in ("lifecycle", "triplets", "trainer", "runner", "gateway"):
            stack.wait_ready(name, name, timeout=120)
        stack.wait_ready("span-sink", "span-sink", key="inserted", timeout=120)
        yield stack, f"http://127.0.0.1:{port}"


def _partitions(role: str, settings: Settings) -> int:
    spec = next(t for t in CATALOGUE if t.name == role)
    return spec.partitions or settings.partitions


def _run_rollout(d: Driver, settings: Settings) -> str:
    rid = d.enqueue({"q": "2+2"})
    snap = d.wait(rid, lambda s: s.status in FINISHED, timeout=120)
    assert snap.status == "succeeded", snap
    return rid


def test_bad_messages_on_every_topic_become_dead_letters_and_the_pipeline_goes_on(
        settings: Settings, everything: tuple[Stack, str]) -> None:
    stack, base = everything
    topics = Topics(settings.topic_prefix)
    rng = random.Random(7)
    raw = producer(settings)
    sent: dict[str, dict[bytes, str]] = {}  # source topic role -> bad value -> what it is
    for role in TOPIC_RECORDS:
        for what, value in bad_messages(role, rng).items():
            for partition in range(_partitions(role, settings)):  # on every partition, ahead of the good rollouts
                value_p = value + bytes([partition]) if what != "wrong record type" else value
                raw.produce(topics.name(role), key=f"ro-hostile-{partition}".encode(), value=value_p,
                            partition=partition)
                sent.setdefault(role, {})[value_p] = what
    # Well-formed events the fold must refuse: unknown rollouts, a key that is not the rollout id.
    refused: dict[bytes, str] = {}
    for event, key in (
        (AttemptStarted(meta=F.meta("ro-nobody"), attempt_id="at-x", sequence_id=1, start_time=time.time()), None),
        (AttemptStatusChanged(meta=F.meta("ro-nobody"), attempt_id="at-x", status="succeeded", time=time.time()), None),
        (RolloutEnqueued(meta=F.meta("ro-mine"), input=1, start_time=time.time()), b"ro-someone-else"),
    ):
        value = CODEC.encode(event)
        raw.produce(topics.rollout_events, key=key or event.rollout_id.encode(), value=value)
        refused[value] = type(event).__name__
    raw.flush(30)

    d = Driver(settings)
    events = EventProducer(settings, role="hostile")
    try:
        first = _run_rollout(d, settings)  # behind every bad message on its partition: processing went on
        snap = d.view.catch_up()[first]
        # Impossible transitions on a finished rollout: a second claim, a new outcome, an unknown attempt.
        attempt_id = snap.attempts[-1].attempt_id
        for event in (
            AttemptStarted(meta=events.factory.meta(first), attempt_id="at-late", sequence_id=2, start_time=time.time()),
            AttemptStatusChanged(meta=events.factory.meta(first), attempt_id=attempt_id, status="failed",
                                 time=time.time()),
            AttemptStatusChanged(meta=events.factory.meta(first), attempt_id="at-unknown", status="succeeded",
                                 time=time.time()),
        ):
            value = CODEC.encode(event)
            events.produce_raw(topics.rollout_events, first.encode(), value)
            refused[value] = f"{type(event).__name__} on a finished rollout"
        events.flush()
        second = _run_rollout(d, settings)
        final = d.view.catch_up()
    finally:
        events.close()
        d.close()

    # Each bad message is a dead letter from each of its topic's consumers, with the reason.
    for role, expected in DEAD_LETTERED_BY.items():
        for processor, dlq_role in expected:
            def letters(dlq: str = dlq_role, src: str = role, proc: str = processor) -> dict[bytes, dict[str, bytes]]:
                out = {}
                for m in read_to_end(settings, topics.dlq(dlq)):
                    h = headers_dict(m)
                    if h["litstream.dlq.source_topic"] == topics.name(src).encode() and \
                            h["litstream.dlq.processor"] == proc.encode():
                        out[m.value() or b""] = h
                return out
            def all_there(r: str = role, f: Callable[[], dict[bytes, dict[str, bytes]]] = letters
                          ) -> dict[bytes, dict[str, bytes]] | None:
                found = f()
                return found if set(sent[r]) <= set(found) else None
            got = until(f"{processor}'s dead letters of {role}", all_there)
            for value, what in sent[role].items():
                h = got[value]
                assert h[REASON], (role, processor, what)
                assert h["litstream.dlq.error_type"] in (b"decode", b"invalid"), (role, processor, what, h)
    def lifecycle_letters_of_all() -> dict[bytes | None, dict[str, bytes]] | None:
        found = {m.value(): headers_dict(m) for m in read_to_end(settings, topics.dlq("rollout-events"))}
        return found if set(refused) <= set(found) else None

    lifecycle_letters = until("the lifecycle processor's dead letters", lifecycle_letters_of_all)
    for value, what in refused.items():
        assert value in lifecycle_letters, what
        assert lifecycle_letters[value][REASON] and lifecycle_letters[value]["litstream.dlq.error_type"] in (
            b"rejected", b"invalid"), (what, lifecycle_letters[value])

    # The refused transitions changed nothing; replay of the whole log (garbage included) agrees with the live state.
    assert final[first].status == "succeeded" and final[first].attempts[-1].attempt_id == attempt_id
    assert "ro-nobody" not in final and "ro-mine" not in final
    _, differences = verify(settings, wait_s=60)
    assert differences == []

    # End to end after all that: spans in ClickHouse, a triplet per rollout, the trainer read them.
    def spans_stored() -> bool:
        rows = clickhouse.query(settings.resolved_clickhouse_dsn, "SELECT rollout_id, count() FROM spans FINAL "
                                f"WHERE rollout_id IN ('{first}', '{second}') GROUP BY rollout_id").rows
        return len(rows) == 2 and all(int(n) >= 2 for _, n in rows)
    until("the rollouts' spans in ClickHouse", spans_stored)
    until("a triplet per rollout", lambda: {first, second} <= {
        CODEC.decode_as(m.value(), TripletEmitted).rollout_id for m in read_to_end(settings, topics.triplets)
        if m.value() not in sent["triplets"]})
    until("the trainer read both triplets", lambda: (health.read(settings.data_dir, "trainer") or {}).get(
        "triplets", 0) >= 2)
    def sink_counted() -> dict[str, Any] | None:
        h = health.read(settings.data_dir, "span-sink")
        return h if h and h.get("undecodable", 0) >= len(sent["triplets"]) + len(sent["rollout-events"]) else None
    sink = until("the sink's counts", sink_counted)
    assert sink["dead_letters"] >= len(sent["spans"])
    assert all(p.alive() for p in stack.roles.values()), {n: p.proc.returncode for n, p in stack.roles.items()}

    # Over HTTP: an unknown rollout is a 404, its spans a 4xx naming why, its attempts the reference's null.
    status, body = call(base, "/v1/agl/rollouts/ro-nobody")
    assert status in (200, 404) and (body is None or "not found" in json.dumps(body)), (status, body)
    span = {"rollout_id": "ro-nobody", "attempt_id": "at-x", "sequence_id": 1, "trace_id": "ab" * 16,
            "span_id": "cd" * 8, "parent_id": None, "name": "x", "start_time": 1.0, "end_time": 2.0}
    status, body = call(base, "/v1/agl/spans", span)
    assert status == 404 and "ro-nobody" in body["detail"], (status, body)
    # Oversized attributes: 400 naming the field, before anything reaches a topic.
    real = {**span, "rollout_id": second, "attempt_id": final[second].attempts[-1].attempt_id}
    for attrs, words in (({"big": "x" * (MAX_VALUE_BYTES + 1)}, "byte limit of an attribute"),
                         ({f"k{i}": i for i in range(MAX_ATTRIBUTES + 1)}, "attributes, over the limit"),
                         ({f"k{i}": "x" * (MAX_VALUE_BYTES // 2) for i in range(7)}, "bytes of attributes")):
        status, body = call(base, "/v1/agl/spans", {**real, "attributes": attrs})
        assert (status, body["field"]) == (400, "attributes") and words in body["detail"], (status, body)
    # OTLP: a large batch (1,500 spans, ~0.4 MB) of spans nobody can place is answered in full, span by span;
    # an oversized attribute refuses its span only.
    spans = [{"traceId": f"{i + 1:032x}", "spanId": f"{i + 1:016x}", "name": f"s{i}",
              "attributes": [{"key": "agentlightning.rollout_id", "value": {"stringValue": "ro-nobody"}},
                             {"key": "agentlightning.attempt_id", "value": {"stringValue": "at-x"}}]}
             for i in range(1500)]
    spans.append({"traceId": "ff" * 16, "spanId": "ee" * 8, "name": "huge", "attributes": [
        {"key": "agentlightning.rollout_id", "value": {"stringValue": second}},
        {"key": "agentlightning.attempt_id", "value": {"stringValue": real["attempt_id"]}},
        {"key": "blob", "value": {"stringValue": "x" * (MAX_VALUE_BYTES + 1)}}]})
    doc = {"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}
    status, body = call(base, "/v1/traces", doc)
    assert status == 200 and body["partialSuccess"]["rejectedSpans"] == "1501", body
    assert "1500 spans: unknown rollout ro-nobody" in body["partialSuccess"]["errorMessage"]
    assert "byte limit of an attribute" in body["partialSuccess"]["errorMessage"]
    assert stack.roles["gateway"].alive()


def test_the_sdk_refuses_oversized_attributes_at_the_call(settings: Settings) -> None:
    events = EventProducer(settings, role="test")
    ctx = AttemptContext(events, "ro-limits", "at-1")
    with pytest.raises(ValueError, match="byte limit of an attribute"), ctx.span("a", {"big": "x" * (MAX_VALUE_BYTES + 1)}):
        pass
    with ctx.span("b") as span:
        with pytest.raises(ValueError, match="byte limit of an attribute"):
            span.set_attribute("ids", list(range(MAX_VALUE_BYTES // 8 + 1)))
        with pytest.raises(ValueError, match="over the limit of 1024 per span"):
            span.set_attributes({f"k{i}": i for i in range(MAX_ATTRIBUTES + 1)})
    with ctx.span("c") as span:
        for i in range(MAX_SPAN_ATTRIBUTE_BYTES // MAX_VALUE_BYTES - 1):
            span.set_attribute(f"part{i}", "x" * MAX_VALUE_BYTES)
        span.set_attribute("part0", "y" * MAX_VALUE_BYTES)  # replacing a value does not count it twice
        with pytest.raises(ValueError, match="per span"):
            span.set_attribute("one.more", "x" * MAX_VALUE_BYTES)
    assert ctx.spans_emitted == 2  # the spans that stayed within the limits were recorded; nothing went out whole
    events.flush()
