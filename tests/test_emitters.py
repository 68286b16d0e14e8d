"""Emitters write the reference's span names and attribute keys into the active attempt, read back from the spans
topic; a bad argument raises at the call and nothing reaches Kafka."""

from __future__ import annotations

import asyncio
import base64
import json
import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import pytest

from litstream.infra.kafka import read_to_end
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.codec import Codec
from litstream.schemas.events import AttemptHeartbeat, SpanRecorded
from litstream.schemas.models import AttemptedRollout, NamedResources
from litstream.workers.agent import LitAgent, litagent
from litstream.workers.emitters import (
    NoActiveAttemptError,
    attempt_context,
    current_context,
    emit_annotation,
    emit_exception,
    emit_message,
    emit_object,
    emit_reward,
    flatten_attributes,
    make_link_attributes,
    make_tag_attributes,
    tool_span,
)
from litstream.workers.runner import Runner
from litstream.workers.sdk import AttemptContext
from litstream.workers.store import LitStore
from tests.test_runner import Background, finish


class Custom(Exception):
    pass


def spans(events: EventProducer) -> list[SpanRecorded]:
    found = [events.codec.decode_as(m.value(), SpanRecorded) for m in read_to_end(events.settings, events.topics.spans)]
    return sorted(found, key=lambda s: s.sequence_id)


def test_flatten_and_helpers_follow_the_reference() -> None:
    assert make_tag_attributes(["a", "b"]) == {"agentlightning.tag.0": "a", "agentlightning.tag.1": "b"}
    assert make_link_attributes({"gen_ai.response.id": "resp-1"}) == {
        "agentlightning.link.0.key_match": "gen_ai.response.id", "agentlightning.link.0.value_match": "resp-1"}
    assert flatten_attributes({"a": {"b": 1, "c": [1, 2]}, "d": [{"e": "x"}, "y"], "f": (True, None)}) == {
        "a.b": 1, "a.c": [1, 2], "d.0.e": "x", "d.1": "y", "f": [True, None]}


def test_each_emitter_writes_its_span(settings: Settings) -> None:
    events = EventProducer(settings, role="test")
    ctx = AttemptContext(events, "ro-emit", "at-emit", resources_id="rs-1")
    assert current_context() is None
    try:
        raise Custom("it broke")
    except Custom as exc:
        caught = exc
    with attempt_context(ctx):
        assert current_context() is ctx
        with ctx.span("agent.run"):
            emit_reward(1)
        emit_reward({"acc": 1, "brevity": 0.25, "safe": True}, primary_key="brevity",
                    attributes={**make_tag_attributes(["fast"]), **make_link_attributes({"gen_ai.response.id": "r-1"}),
                                "judge": {"name": "exact", "version": 2}})
        assert ctx.last_reward == 0.25  # the primary value, for the runner's progress line
        emit_annotation({"note": {"text": "checked", "scores": [0.5, 0.75]}})
        emit_message("hello", {"channel": "stdout"})
        emit_object({"a": [1, 2], "b": None})
        emit_object(OrderedDict(x=1))
        emit_object(b"\x00\xffdata")
        emit_object(42)
        emit_object(True)
        emit_exception(caught, {"where": "tool"})
    events.flush()

    got = spans(events)
    assert [s.name for s in got] == [
        "agentlightning.annotation", "agent.run", "agentlightning.annotation", "agentlightning.annotation",
        "agentlightning.message", "agentlightning.object", "agentlightning.object", "agentlightning.object",
        "agentlightning.object", "agentlightning.object", "agentlightning.exception"]
    assert all(s.rollout_id == "ro-emit" and s.attempt_id == "at-emit" and s.resources_id == "rs-1" for s in got)
    reward, run, multi, note, msg, obj, ordered, raw, num, flag, exc_span = got
    assert [s.sequence_id for s in got] == list(range(1, 12))
    assert reward.parent_id == run.span_id and reward.status_code == "OK"
    assert reward.attributes == {"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 1.0}
    assert isinstance(reward.attributes["agentlightning.reward.0.value"], float)
    assert multi.attributes == {
        "agentlightning.reward.0.name": "brevity", "agentlightning.reward.0.value": 0.25,
        "agentlightning.reward.1.name": "acc", "agentlightning.reward.1.value": 1.0,
        "agentlightning.reward.2.name": "safe", "agentlightning.reward.2.value": 1.0,
        "agentlightning.tag.0": "fast", "agentlightning.link.0.key_match": "gen_ai.response.id",
        "agentlightning.link.0.value_match": "r-1", "judge.name": "exact", "judge.version": 2}
    assert note.attributes == {"note.text": "checked", "note.scores": [0.5, 0.75]}
    assert msg.attributes == {"agentlightning.message.body": "hello", "channel": "stdout"}
    assert obj.attributes["agentlightning.object.type"] == "dict"
    assert json.loads(str(obj.attributes["agentlightning.object.json"])) == {"a": [1, 2], "b": None}
    assert ordered.attributes["agentlightning.object.type"] == "collections.OrderedDict"
    assert raw.attributes == {"agentlightning.object.type": "bytes",
                              "agentlightning.object.literal": base64.b64encode(b"\x00\xffdata").decode()}
    assert num.attributes == {"agentlightning.object.type": "int", "agentlightning.object.literal": "42"}
    assert flag.attributes == {"agentlightning.object.type": "bool", "agentlightning.object.literal": "True"}
    assert exc_span.attributes["exception.type"] == f"{__name__}.Custom"
    assert exc_span.attributes["exception.message"] == "it broke"
    assert exc_span.attributes["exception.escaped"] is True and exc_span.attributes["where"] == "tool"
    assert "raise Custom" in str(exc_span.attributes["exception.stacktrace"])

    beats = [events.codec.decode(m.value()) for m in read_to_end(settings, events.topics.rollout_events)]
    assert beats and all(isinstance(b, AttemptHeartbeat) for b in beats)  # spans count as heartbeats


BAD_CALLS: list[tuple[Callable[[], Any], type[Exception], str]] = [
    (lambda: emit_reward(math.nan), ValueError, "reward must be a finite"),
    (lambda: emit_reward(math.inf), ValueError, "reward must be a finite"),
    (lambda: emit_reward("1.0"), TypeError, "reward must be a number"),  # type: ignore[arg-type]
    (lambda: emit_reward({"a": 1.0}), ValueError, "primary_key"),
    (lambda: emit_reward({"a": 1.0}, primary_key="b"), ValueError, "primary_key 'b'"),
    (lambda: emit_reward({"a": 1.0, "b": "x"}, primary_key="a"), TypeError, r"reward\['b'\]"),
    (lambda: emit_reward({"a": 1.0, "b": math.nan}, primary_key="a"), ValueError, r"reward\['b'\]"),
    (lambda: emit_reward(1.0, attributes={"k": object()}), TypeError, r"attributes\['k'\]"),
    (lambda: emit_reward(1.0, attributes={"k": {"deep": None}}), TypeError, r"attributes\['k.deep'\]: None"),
    (lambda: emit_annotation({"k": [1, "a"]}), TypeError, r"annotation\['k'\]"),
    (lambda: emit_annotation({"k": 2**70}), ValueError, "64 bits"),
    (lambda: emit_annotation(["not", "a", "dict"]), TypeError, "annotation must be a dict"),  # type: ignore[arg-type]
    (lambda: emit_message(b"bytes"), TypeError, "message must be a str"),  # type: ignore[arg-type]
    (lambda: emit_message("hi", {"k": {1, 2}}), TypeError, r"attributes\['k'\]"),
    (lambda: emit_object(object()), TypeError, "obj: a object cannot be serialised"),
    (lambda: emit_object({"x": math.nan}), TypeError, "obj: a dict cannot be serialised"),
    (lambda: emit_exception("boom"), TypeError, "exc must be an exception"),  # type: ignore[arg-type]
    (lambda: tool_span("", {}), TypeError, "name must be the tool's name"),
    (lambda: tool_span("t", ["a"]), TypeError, "arguments must be a str"),  # type: ignore[arg-type]
    (lambda: tool_span("t", {"x": math.nan}), TypeError, "arguments: a dict cannot be written as JSON"),
    (lambda: tool_span("t", {}, call_id=""), TypeError, "call_id must be"),
]


def test_bad_arguments_raise_at_the_call_and_produce_nothing(settings: Settings) -> None:
    events = EventProducer(settings, role="test")
    ctx = AttemptContext(events, "ro-bad", "at-bad")
    with attempt_context(ctx):
        for call, exc_type, match in BAD_CALLS:
            with pytest.raises(exc_type, match=match):
                call()
    with pytest.raises(NoActiveAttemptError, match="attempt_context"):
        emit_reward(1.0)
    with pytest.raises(NoActiveAttemptError, match="tool_span"):
        tool_span("t", {})
    events.flush()
    assert spans(events) == []
    assert list(read_to_end(settings, events.topics.rollout_events)) == []
    assert ctx.max_sequence_id is None  # no sequence id was taken either


def test_an_attempts_spans_are_on_the_broker_before_its_terminal_event_is_sent(settings: Settings) -> None:
    """The order the triplet processor relies on: spans first, then the event that ends the attempt (here with a
    producer that would otherwise hold records back for a minute)."""
    events = EventProducer(settings, role="test", **{"linger.ms": 60_000})
    ctx = AttemptContext(events, "ro-order", "at-order")
    with ctx.span("step-1"), ctx.span("step-2"):
        pass
    ctx.finish("succeeded")
    try:
        assert len(spans(events)) == 2  # read from the broker; the terminal event may still be queued
    finally:
        events.flush()


def test_a_tools_execution_is_one_span_with_its_call_and_result(settings: Settings) -> None:
    events = EventProducer(settings, role="test")
    ctx = AttemptContext(events, "ro-tool", "at-tool")
    with attempt_context(ctx):
        with ctx.span("agent.run"):
            with tool_span("get_weather", {"city": "Zürich"}, call_id="call_1") as t:
                assert t.result({"temp": 21.5, "sky": "clear"}) == {"temp": 21.5, "sky": "clear"}
        with ctx.tool_span("lookup", '{"q": "unterminated', call_id="call_2") as t:  # kept as the model wrote it
            t.result("found it")
        with pytest.raises(Custom, match="no network"), tool_span("fetch", {"url": "x"}):
            raise Custom("no network")
        with pytest.raises(TypeError, match="result: a object cannot be written as JSON"), \
                ctx.tool_span("broken", {}) as t:
            t.result(object())
        with tool_span("noop", {}):  # a tool whose result is not recorded
            pass
    events.flush()

    weather, run, lookup, fetch, broken, noop = spans(events)
    assert [s.name for s in (weather, lookup, fetch, broken, noop)] == [
        "execute_tool get_weather", "execute_tool lookup", "execute_tool fetch", "execute_tool broken",
        "execute_tool noop"]
    assert weather.parent_id == run.span_id and weather.kind == "INTERNAL" and weather.status_code == "OK"
    assert weather.attributes == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": "call_1",
        "gen_ai.tool.call.arguments": '{"city": "Zürich"}',
        "gen_ai.tool.call.result": '{"temp": 21.5, "sky": "clear"}'}
    assert weather.end_time_ns is not None and weather.end_time_ns >= weather.start_time_ns
    assert lookup.attributes["gen_ai.tool.call.arguments"] == '{"q": "unterminated'
    assert lookup.attributes["gen_ai.tool.call.result"] == "found it"  # a string as it is, not JSON-quoted
    assert fetch.status_code == "ERROR" and fetch.status_message == "Custom: no network"
    assert fetch.attributes["error.type"] == f"{__name__}.Custom" and "gen_ai.tool.call.id" not in fetch.attributes
    assert "gen_ai.tool.call.result" not in fetch.attributes
    assert broken.status_code == "ERROR" and broken.attributes["error.type"] == "TypeError"
    assert noop.status_code == "OK" and "gen_ai.tool.call.result" not in noop.attributes


class ToolUsingAgent(LitAgent):
    """A LitAgent that calls a tool through the emitters' ``tool_span`` (the runner's active attempt)."""

    def rollout(self, task: Any, resources: NamedResources, rollout: AttemptedRollout) -> float:
        with tool_span("add", {"a": task["a"], "b": task["b"]}, call_id=f"call-{task['a']}") as t:
            total = t.result(task["a"] + task["b"])
        return float(total)


@litagent
async def async_tool_agent(task: Any, ctx: AttemptContext) -> float:
    async def square(n: int) -> int:
        with ctx.tool_span("square", {"n": n}) as t:
            await asyncio.sleep(0)
            return t.result(n * n)

    results = await asyncio.gather(square(task["a"]), square(task["b"]))
    return float(sum(results))


@pytest.mark.usefixtures("processor_running")
def test_tool_spans_of_agents_run_by_the_runner(settings: Settings) -> None:
    """A LitAgent (the module's ``tool_span``) and an async function agent (``ctx.tool_span`` in two tasks at once),
    each run by the runner: the spans carry the attempt's ids."""

    async def run(agent: Any, task: dict[str, int]) -> tuple[str, str]:
        store = LitStore(settings)
        bg = Background(Runner(settings, agent, concurrency=1))
        try:
            ro = await store.enqueue_rollout(task)
            done = await finish(store, [ro.rollout_id])
            assert done[ro.rollout_id].status == "succeeded"
            return ro.rollout_id, store.rollouts.snapshots[ro.rollout_id].attempts[-1].attempt_id
        finally:
            bg.stop()
            await store.close()

    first = asyncio.run(run(ToolUsingAgent(), {"a": 2, "b": 3}))
    second = asyncio.run(run(async_tool_agent, {"a": 4, "b": 5}))
    recorded = [s for s in _spans_of(settings) if s.name.startswith("execute_tool ")]
    by_attempt = {ids: [s for s in recorded if (s.rollout_id, s.attempt_id) == ids] for ids in (first, second)}
    [add] = by_attempt[first]
    assert add.attributes["gen_ai.tool.call.id"] == "call-2" and add.attributes["gen_ai.tool.call.result"] == "5"
    assert sorted(str(s.attributes["gen_ai.tool.call.result"]) for s in by_attempt[second]) == ["16", "25"]
    assert len(recorded) == 3 and all(s.status_code == "OK" for s in recorded)


def _spans_of(settings: Settings) -> list[SpanRecorded]:
    codec = Codec()
    return [codec.decode_as(m.value(), SpanRecorded) for m in read_to_end(settings, f"{settings.topic_prefix}.spans")]
