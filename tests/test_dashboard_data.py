"""The dashboard's pure parts: rollout filters and pages, the attempts timeline, the span waterfall, LLM calls,
rewards, chart data; and the dead-letter headers it reads."""

from __future__ import annotations

import json
from typing import Any

import pytest

from litstream.schemas.events import AttemptSnapshot, RolloutSnapshot
from litstream.schemas.models import OtelResource, Span, SpanContext, TraceStatus
from litstream.workers.dashboard import data
from litstream.workers.dashboard.deadletters import letter_from


def snap(rid: str, status: str = "succeeded", mode: str | None = "train", start: float = 1000.0,
         resources: str | None = None, attempts: list[AttemptSnapshot] | None = None,
         end: float | None = None) -> RolloutSnapshot:
    return RolloutSnapshot(rollout_id=rid, version=1, input={}, start_time=start, end_time=end, mode=mode,  # type: ignore[arg-type]
                           resources_id=resources, status=status, attempts=attempts or [], updated_ns=1)  # type: ignore[arg-type]


def span(sid: str, parent: str | None, start: float, end: float, name: str = "s", **attrs: Any) -> Span:
    return Span(rollout_id="ro-1", attempt_id="at-1", sequence_id=int(start * 10), trace_id="t", span_id=sid,
                parent_id=parent, name=name, status=TraceStatus(status_code="OK"), attributes=attrs, events=[],
                links=[], start_time=start, end_time=end, context=SpanContext(trace_id="t", span_id=sid),
                parent=None, resource=OtelResource(attributes={}, schema_url=""))


def test_filters_and_pages() -> None:
    snaps = [snap(f"ro-{i}", status="failed" if i % 3 == 0 else "succeeded", mode="val" if i % 2 else "train",
                  start=1000.0 + i, resources="policy-v1" if i < 10 else "policy-v2") for i in range(60)]
    page = data.rollout_page(snaps, data.RolloutFilter(), now=2000.0)
    assert page.total == 60 and page.pages == 3 and len(page.items) == data.PAGE_SIZE
    assert page.items[0].rollout_id == "ro-59"  # newest first
    assert page.counts["failed"] == 20 and page.counts["succeeded"] == 40
    f = data.RolloutFilter.from_query({"status": "failed", "mode": "val", "resources_id": "policy-v1", "page": "9"})
    page = data.rollout_page(snaps, f, now=2000.0)
    assert [s.rollout_id for s in page.items] == ["ro-9", "ro-3"] and page.page == 1  # past the end: the last
    used = frozenset({"ro-0"})  # ran with policy-v9 without naming it: known from its spans
    assert [s.rollout_id for s in data.rollout_page(snaps, data.RolloutFilter(resources_id="policy-v9"),
                                                    now=2000.0, used=used).items] == ["ro-0"]
    recent = data.RolloutFilter.from_query({"since": "5m"})
    assert data.rollout_page(snaps, recent, now=1000.0 + 300).total == 60
    assert data.rollout_page(snaps, recent, now=1000.0 + 310).total == 50


@pytest.mark.parametrize("query, word", [({"status": "done"}, "status"), ({"mode": "x"}, "mode"),
                                         ({"since": "2d"}, "since"), ({"page": "two"}, "page")])
def test_bad_filters_say_what_is_allowed(query: dict[str, str], word: str) -> None:
    with pytest.raises(data.BadFilter, match=word):
        data.RolloutFilter.from_query(query)


def test_timeline_shows_the_wait_then_each_attempt() -> None:
    attempts = [AttemptSnapshot(attempt_id="a1", sequence_id=1, start_time=1002.0, end_time=1004.0, status="timeout",
                                worker_id="w1"),
                AttemptSnapshot(attempt_id="a2", sequence_id=2, start_time=1004.0, end_time=1010.0,
                                status="succeeded", worker_id="w2")]
    bars = data.attempt_timeline(snap("ro-1", attempts=attempts, end=1010.0), now=2000.0)
    assert [(b.label, b.status) for b in bars] == [("queued", "queued"), ("attempt 1", "timeout"),
                                                   ("attempt 2", "succeeded")]
    assert bars[0].left == 0 and bars[0].width == pytest.approx(20) and bars[2].left == pytest.approx(40)
    assert bars[2].width == pytest.approx(60) and bars[1].worker == "w1"


def test_waterfall_orders_parents_before_children_and_scales_time() -> None:
    spans = [span("c2", "root", 6.0, 8.0, name="verify"), span("root", None, 0.0, 10.0),
             span("c1", "root", 1.0, 5.0, name="chat", **{"gen_ai.operation.name": "chat"}),
             span("g", "c1", 2.0, 3.0), span("r", "root", 9.0, 9.0, name="agentlightning.annotation",
                                              **{"agentlightning.reward.0.value": 1.0})]
    rows = data.waterfall(spans)
    assert [(r.span.span_id, r.depth) for r in rows] == [("root", 0), ("c1", 1), ("g", 2), ("c2", 1), ("r", 1)]
    assert rows[1].left == pytest.approx(10) and rows[1].width == pytest.approx(40) and rows[1].kind == "llm"
    assert rows[4].kind == "reward" and rows[4].width == 0.5  # an instant still shows
    assert data.waterfall([]) == []


def test_llm_calls_and_rewards() -> None:
    indexed = span("l1", None, 0, 1, name="chat m", **{
        "gen_ai.operation.name": "chat", "gen_ai.request.model": "m", "gen_ai.prompt.0.role": "system",
        "gen_ai.prompt.0.content": "be brief", "gen_ai.prompt.1.content": "2+2?",
        "gen_ai.completion.0.content": "4", "gen_ai.usage.prompt_tokens": 7, "gen_ai.usage.output_tokens": "1"})
    as_json = span("l2", None, 1, 2, **{"gen_ai.operation.name": "chat",
                                        "gen_ai.input.messages": '[{"role": "user", "content": "hi"}]',
                                        "gen_ai.output.messages": "not json"})
    reward = span("r", None, 2, 2, name="agentlightning.annotation", **{
        "agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": 0.5,
        "agentlightning.reward.1.name": "style", "agentlightning.reward.1.value": 1})
    calls = data.llm_calls([indexed, as_json, reward])
    assert [m[:2] for m in calls[0].messages] == [("system", "be brief"), ("user", "2+2?"), ("assistant", "4")]
    assert (calls[0].model, calls[0].input_tokens, calls[0].output_tokens) == ("m", 7, 1)
    assert [m[:2] for m in calls[1].messages] == [("user", "hi"), ("assistant", "not json")]
    assert calls[1].input_tokens is None
    assert data.rewards([indexed, reward]) == [("r", "primary", 0.5), ("r", "style", 1.0)]


def test_tool_calls_show_in_the_conversation_and_the_span_tree() -> None:
    tools = json.dumps([{"type": "function", "function": {"name": "get_weather", "parameters": {}}},
                        {"type": "function", "function": {"name": "search", "parameters": {}}}])
    c1 = {"id": "c1", "type": "function", "name": "get_weather", "arguments": '{"city": "Oslo"}'}
    c2 = {"id": "c2", "type": "function", "name": "search", "arguments": '{"q": "x"}'}
    ask = span("l1", None, 0, 1, name="chat m", **{
        "gen_ai.operation.name": "chat", "gen_ai.tool.definitions": tools, "gen_ai.request.tool_choice": "required",
        "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "Weather in Oslo?",
        "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "",
        "gen_ai.completion.0.tool_calls": json.dumps([c1, c2]), "litstream.constrained": True,
        "litstream.tool_calls.count": 2, "litstream.tool_calls.malformed": 0})
    run = span("t1", None, 1, 2, name="execute_tool get_weather", **{
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "get_weather", "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.call.arguments": '{"city": "Oslo"}', "gen_ai.tool.call.result": '{"sky": "clear"}'})
    failed = span("t2", None, 2, 3, name="execute_tool search", **{
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search", "gen_ai.tool.call.id": "c2",
        "gen_ai.tool.call.arguments": '{"q": "x"}'})
    failed.status = TraceStatus(status_code="ERROR", description="ValueError: search is down")
    answer = span("l2", None, 3, 4, name="chat m", **{
        "gen_ai.operation.name": "chat", "gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "Weather?",
        "gen_ai.prompt.1.role": "assistant", "gen_ai.prompt.1.tool_calls": json.dumps([c1]),
        "gen_ai.prompt.2.role": "tool", "gen_ai.prompt.2.content": '{"sky": "clear"}',
        "gen_ai.prompt.2.tool_call_id": "c1", "gen_ai.completion.0.content": "Clear.",
        "litstream.tool_calls.malformed": 1})
    semconv = span("l3", None, 4, 5, **{
        "gen_ai.operation.name": "chat",
        "gen_ai.input.messages": json.dumps([{"role": "tool", "parts": [
            {"type": "tool_call_response", "id": "c1", "response": "clear"}]}]),
        "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
            {"type": "text", "content": "Let me look."},
            {"type": "tool_call", "id": "c9", "name": "search", "arguments": {"q": "Oslo"}}]}])})

    first, second, third = data.llm_calls([ask, run, failed, answer, semconv])
    assert (first.tools, first.tool_choice, first.constrained, first.malformed) == (
        ["get_weather", "search"], "required", True, 0)
    done, raised = first.messages[-1].tool_calls
    assert (done.name, done.arguments, done.result, done.error, done.span_id) == (
        "get_weather", '{"city": "Oslo"}', '{"sky": "clear"}', None, "t1")
    assert (raised.name, raised.result, raised.error) == ("search", None, "ValueError: search is down")
    assert second.malformed == 1 and not second.constrained
    assert [(m.role, m.content, m.tool_call_id) for m in second.messages] == [
        ("user", "Weather?", ""), ("assistant", "", ""), ("tool", '{"sky": "clear"}', "c1"),
        ("assistant", "Clear.", "")]
    assert [c.id for c in second.messages[1].tool_calls] == ["c1"]
    assert [(m.role, m.content, m.tool_call_id) for m in third.messages] == [
        ("tool", "clear", "c1"), ("assistant", "Let me look.", "")]
    assert [(c.name, c.arguments) for c in third.messages[1].tool_calls] == [("search", '{"q": "Oslo"}')]

    rows = {r.span.span_id: r for r in data.waterfall([ask, run, failed, answer, semconv])}
    assert [rows[i].kind for i in ("l1", "t1", "t2", "l2", "l3")] == ["llm", "tool", "tool", "llm", "llm"]
    assert rows["l1"].note == '→ get_weather({"city": "Oslo"}), search({"q": "x"})'
    assert rows["t1"].note == '{"city": "Oslo"} → {"sky": "clear"}' and rows["t2"].note == '{"q": "x"}'
    assert rows["l2"].note == "" and rows["l3"].note == '→ search({"q": "Oslo"})'


def test_chart_data() -> None:
    rows = [["policy-v10", "train", 0.5, 4], ["policy-v2", "train", 0.25, 4], ["policy-v2", "val", 0.0, 1]]
    series = data.reward_series(rows)
    assert series["labels"] == ["policy-v2", "policy-v10"]  # versions in number order
    assert series["series"] == {"train": [0.25, 0.5], "val": [0.0, None]}
    steps = data.step_series([{"version": 1, "tokens": 100, "seconds": 0.5, "reward_mean": 0.1},
                              {"version": 2, "tokens": 50, "seconds": 0.0, "reward_mean": 0.2}])
    assert steps["tokens_per_s"] == [200.0, 0.0] and steps["current_version"] == 2 and steps["steps"] == 2
    assert data.step_series([])["current_version"] is None
    chart = data.sql_chart(["name", "n", "avg"], ["String", "UInt64", "Nullable(Float64)"], [["a", 1, None]])
    assert chart == {"labels": ["a"], "series": {"n": [1.0], "avg": [None]}}
    assert data.sql_chart(["name"], ["String"], [["a"]]) is None


def test_dead_letter_headers_become_a_row() -> None:
    headers = [("litstream.dlq.reason", b"not Avro"), ("litstream.dlq.error_type", b"decode"),
               ("litstream.dlq.source_topic", b"p.rollout-events"), ("litstream.dlq.partition", b"1"),
               ("litstream.dlq.offset", b"42"), ("litstream.dlq.processor", b"lifecycle"),
               ("litstream.dlq.time_ns", b"5000000000")]
    letter = letter_from("p.rollout-events.dlq", 0, 1, b"ro-1", b"\x00garbage", headers)
    assert (letter.reason, letter.error_type, letter.source, letter.time_s) == (
        "not Avro", "decode", "p.rollout-events[1]@42", 5.0)
    bare = letter_from("t.dlq", 3, 2000, None, None, None)
    assert bare.reason == "(no reason header)" and bare.time_s == 2.0


def test_each_run_is_a_validation_and_a_training_line_over_the_versions_of_all() -> None:
    from litstream.workers.runs import RunSummary, Score

    first = RunSummary("run-20261128T100000Z-aaaaaa", 1.0, 2.0, name="train",
                       validation={"v0": Score(64, 0.5, 0.06), "v5": Score(64, 0.75, 0.05)},
                       training={"v0": Score(32, 0.4, 0.08)})
    joined = RunSummary("run-20261129T100000Z-bbbbbb", 3.0, 4.0, validation={"v10": Score(64, 0.9, 0.04)})
    chart = data.run_series([first, joined])
    assert chart["labels"] == ["v0", "v5", "v10"]  # by number, not as text
    assert chart["series"] == {"train …aaaaaa validation": [0.5, 0.75, None], "train …aaaaaa train": [0.4, None, None],
                               "run-20261129T100000Z-bbbbbb validation": [None, None, 0.9]}
    assert data.run_series([]) == {"labels": [], "series": {}}
