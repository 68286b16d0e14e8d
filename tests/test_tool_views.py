"""The tool-call views (migrations 0006-0009) on spans written through the real pipeline: recorded by the SDK onto
the broker, stored by the span sink in chDB, read with the read-only SQL a person sends."""

from __future__ import annotations

import json
from typing import Any

import pytest

from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.policy_versions import UNATTRIBUTED
from litstream.streams.span_sink import SpanSink
from litstream.workers.sdk import AttemptContext
from tests.waiting import until

TOOLS = json.dumps([{"type": "function", "function": {"name": "get_weather", "description": "The weather",
                                                      "parameters": {"type": "object"}}}])


def llm_span(ctx: AttemptContext, calls: list[dict[str, str]] | None = None, malformed: int = 0,
             content: str = "") -> None:
    """An LLM call with the attributes the policy endpoint records for tool calling."""
    attrs: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "tiny-policy",
                             "gen_ai.tool.definitions": TOOLS, "gen_ai.request.tool_choice": "auto",
                             "gen_ai.completion.0.content": content, "litstream.tool_calls.count": len(calls or []),
                             "litstream.tool_calls.malformed": malformed, "litstream.constrained": bool(calls)}
    if calls:
        attrs["gen_ai.completion.0.tool_calls"] = json.dumps(calls)
        attrs["gen_ai.completion.0.finish_reason"] = "tool_calls"
    with ctx.span("chat tiny-policy", attrs) as span:
        span.status_code = "OK"  # as the endpoint ends a call it answered


def call(call_id: str, name: str, arguments: str) -> dict[str, str]:
    return {"id": call_id, "type": "function", "name": name, "arguments": arguments}


def record_attempts(events: EventProducer) -> int:
    """Three attempts (one with a good call, one with broken calls, one without tools) and a call outside any
    attempt; returns the spans recorded."""
    good = AttemptContext(events, "ro-good", "at-good")
    llm_span(good, [call("c1", "get_weather", '{"city": "Oslo"}')])
    with good.tool_span("get_weather", '{"city": "Oslo"}', call_id="c1") as t:
        t.result({"sky": "clear"})
    llm_span(good, content="Clear in Oslo.")
    good.emit_reward(1.0)

    broken = AttemptContext(events, "ro-broken", "at-broken")
    llm_span(broken, malformed=1, content='<tool_call>\n{"name": "get_weather", "arguments": {"city"')
    llm_span(broken, [call("c2", "get_weather", '{"city": "Rome"}'), call("c3", "search", '{"q": "x"}')])
    with pytest.raises(ValueError), broken.tool_span("search", '{"q": "x"', call_id="c3"):
        raise ValueError("search is down")
    broken.emit_reward(0.25)

    plain = AttemptContext(events, "ro-plain", "at-plain")
    llm_span(plain, content="4")
    plain.emit_reward(0.0)

    outside = AttemptContext(events, UNATTRIBUTED, UNATTRIBUTED)
    llm_span(outside, [call("c4", "get_weather", "{}")])
    events.flush()
    return 4 + 4 + 2 + 1


def test_tool_views_answer_calls_per_tool_failures_and_reward_by_tool_use(settings: Settings,
                                                                          sink: SpanSink) -> None:
    produced = record_attempts(EventProducer(settings, role="test"))
    until("every span stored", lambda: sink.stats["inserted"] >= produced)

    def rows(sql: str) -> list[list[Any]]:
        return sink.ch.user_query(sql).rows  # as `litstream sql` and POST /v1/sql run it: read-only

    assert rows("SELECT rollout_id, source, tool_name, call_id, arguments, arguments_json, result, status, "
                "constrained FROM tool_calls ORDER BY rollout_id, call_id, source") == [
        ["ro-broken", "llm", "get_weather", "c2", '{"city": "Rome"}', 1, "", "Ok", 1],
        ["ro-broken", "execution", "search", "c3", '{"q": "x"', 0, "", "Error", 0],
        ["ro-broken", "llm", "search", "c3", '{"q": "x"}', 1, "", "Ok", 1],
        ["ro-good", "execution", "get_weather", "c1", '{"city": "Oslo"}', 1, '{"sky": "clear"}', "Ok", 0],
        ["ro-good", "llm", "get_weather", "c1", '{"city": "Oslo"}', 1, "", "Ok", 1],
        [UNATTRIBUTED, "llm", "get_weather", "c4", "{}", 1, "", "Ok", 1]]

    assert rows("SELECT tool_name, calls, executions, execution_errors, invalid_arguments, attempts, "
                "mean_execution_ms IS NOT NULL FROM tool_usage ORDER BY tool_name") == [
        ["get_weather", 3, 1, 0, 0, 3, 1], ["search", 1, 1, 1, 1, 1, 1]]

    assert rows("SELECT rollout_id, kind, source, tool_name, call_id, count, text FROM tool_call_errors "
                "ORDER BY kind, rollout_id") == [
        ["ro-broken", "arguments_not_json", "execution", "search", "c3", 1, '{"q": "x"'],
        ["ro-broken", "malformed", "llm", "", "", 1, '<tool_call>\n{"name": "get_weather", "arguments": {"city"']]

    assert rows("SELECT rollout_id, reward, llm_calls, tool_calls, tool_executions, tool_errors, malformed, "
                "invalid_arguments, arraySort(tools), used_tool FROM attempt_tool_use ORDER BY rollout_id") == [
        ["ro-broken", 0.25, 2, 2, 1, 1, 1, 1, ["get_weather", "search"], 1],
        ["ro-good", 1.0, 2, 1, 1, 0, 0, 0, ["get_weather"], 1],
        ["ro-plain", 0.0, 1, 0, 0, 0, 0, 0, [], 0]]  # the call outside any attempt is no attempt

    assert rows("SELECT used_tool, count() AS attempts, avg(reward) AS mean_reward FROM attempt_tool_use "
                "GROUP BY used_tool ORDER BY used_tool") == [[0, 1, 0.0], [1, 2, 0.625]]
