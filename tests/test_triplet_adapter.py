"""The span -> triplet adapters on hand-built traces: one test per rule of the reference adapter, plus the
OpenTelemetry GenAI conventions."""

from __future__ import annotations

import json
from typing import Any

from litstream.schemas.events import EventMeta, SpanRecorded
from litstream.streams.span_attrs import reward_dimension_values, reward_value, unflatten
from litstream.streams.trace_tree import VIRTUAL_ROOT, RewardMatchPolicy, TraceSpan, TraceTree
from litstream.streams.triplet_adapter import LlmProxyTraceToTriplet, TracerTraceToTriplet, trace_spans

LLM = "openai.chat.completion"
TOKENS: dict[str, Any] = {"prompt_token_ids": [1, 2, 3], "response_token_ids": [4, 5]}


def sp(span_id: str, parent: str | None, name: str, start: int, end: int, seq: int = 0, /,
       **attrs: Any) -> TraceSpan:
    return TraceSpan(span_id=span_id, parent_id=parent, name=name, start=start, end=end, attributes=attrs,
                     sequence_id=seq)


def llm(span_id: str, parent: str | None, start: int, end: int, /, **attrs: Any) -> TraceSpan:
    return sp(span_id, parent, LLM, start, end, **{**TOKENS, **attrs})


def reward(span_id: str, parent: str | None, at: int, value: float, seq: int = 0) -> TraceSpan:
    return sp(span_id, parent, "agentlightning.annotation", at, at, seq,
              **{"agentlightning.reward.0.name": "primary", "agentlightning.reward.0.value": value})


def test_one_call_and_its_reward() -> None:
    spans = [
        sp("root", None, "agent.rollout", 0, 100),
        llm("c1", "root", 10, 20, **{"gen_ai.prompt.0.role": "user", "gen_ai.prompt.0.content": "2+2?",
                                     "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "4",
                                     "gen_ai.response.id": "resp-1", "gen_ai.request.model": "m"}),
        reward("r", "root", 30, 1.0),
    ]
    result = TracerTraceToTriplet().adapt(spans)
    assert result.reason is None and result.llm_calls == 1 and result.reward_spans == 1
    [t] = result.usable
    assert (t.prompt_token_ids, t.response_token_ids, t.reward) == ([1, 2, 3], [4, 5], 1.0)
    assert (t.prompt_text, t.response_text) == ("2+2?", "4")
    assert t.prompt_raw == [{"role": "user", "content": "2+2?"}]
    assert t.metadata["response_id"] == "resp-1" and t.metadata["request"] == {"model": "m"}
    assert t.metadata["agent_name"] == "*" and "policy_version" not in t.metadata
    [versioned] = TracerTraceToTriplet().adapt([*spans[:1], llm("c1", "root", 10, 20, **{
        "litstream.policy.version": 4}), spans[2]]).usable
    assert versioned.metadata["policy_version"] == 4
    [forced] = TracerTraceToTriplet().adapt([*spans[:1], llm("c1", "root", 10, 20, **{
        "litstream.constrained": True, "litstream.grammar": "start: call\n"}), spans[2]]).usable
    assert forced.metadata["constrained"] is True and forced.metadata["grammar"] == "start: call\n"


def test_lost_parent_becomes_a_virtual_span_and_several_roots_a_virtual_root() -> None:
    spans = [
        llm("c1", "lost", 10, 20),  # its parent never arrived
        sp("x", "lost", "tool", 25, 40),
        sp("other", None, "agent.other", 50, 90),
        reward("r", "other", 60, 0.5),
    ]
    tree = TraceTree.from_spans(spans)
    assert tree.id == VIRTUAL_ROOT and [c.id for c in tree.children] == ["other", "lost"]
    lost = tree.children[1]
    assert lost.span.virtual and (lost.start, lost.end) == (10, 40) and [c.id for c in lost.children] == ["c1", "x"]
    [t] = TracerTraceToTriplet().adapt(spans).usable
    assert t.reward == 0.5


def test_repair_hierarchy_moves_a_floating_call_under_the_agent_that_encloses_it() -> None:
    spans = [
        sp("session", None, "run.session", 0, 1000),
        sp("agent", "session", "agent.step", 100, 500, **{"agent.name": "solver"}),
        llm("c1", "session", 200, 300),  # floats under the session, inside the agent in time
        reward("r", "session", 600, 1.0),
    ]
    repaired = TracerTraceToTriplet(agent_match="solver").adapt(spans)
    assert [t.metadata["agent_name"] for t in repaired.usable] == ["solver"]
    assert repaired.usable[0].reward == 1.0
    unrepaired = TracerTraceToTriplet(agent_match="solver", repair_hierarchy=False).adapt(spans)
    assert unrepaired.llm_calls == 0 and unrepaired.reason is not None and "no LLM call" in unrepaired.reason


def test_agent_match_keeps_only_calls_of_matching_agents() -> None:
    spans = [
        sp("root", None, "r", 0, 100),
        sp("a", "root", "agent", 0, 40, **{"agent.name": "writer"}),
        llm("c1", "a", 10, 20),
        sp("b", "root", "agent", 50, 90, **{"agent.name": "critic"}),
        llm("c2", "b", 60, 70),
        reward("r1", "root", 95, 1.0),
    ]
    result = TracerTraceToTriplet(agent_match="^critic$").adapt(spans)
    assert [t.span_id for t in result.triplets] == ["c2"]


def test_duplicate_response_ids_and_nested_copies_give_one_triplet() -> None:
    spans = [
        sp("root", None, "agent", 0, 100),
        llm("c1", "root", 10, 20, **{"gen_ai.response.id": "same"}),
        llm("c1-inner", "c1", 11, 19),  # an instrumentation's nested copy, no response id
        llm("c2", "root", 30, 40, **{"gen_ai.response.id": "same"}),  # the same response recorded twice
        llm("c3", "root", 50, 60, **{"gen_ai.response.id": "other"}),
        reward("r", "root", 70, 1.0),
    ]
    result = TracerTraceToTriplet().adapt(spans)
    assert [t.span_id for t in result.triplets] == ["c1", "c3"]
    assert TracerTraceToTriplet().adapt([*spans, spans[1]]).triplets == result.triplets  # same span twice


def test_of_two_copies_of_a_call_the_one_with_token_ids_stands_for_it() -> None:
    """An instrumented client (AgentOps in Agent Lightning's runner) records the call without token ids; the
    policy server records the same response with them. The copy that can train is kept, in the call's place."""
    client = sp("client", "root", LLM, 10, 40, **{"gen_ai.response.id": "resp-1"})
    spans = [
        sp("root", None, "agent", 0, 100),
        client,
        llm("server", "client", 12, 38, **{"gen_ai.response.id": "resp-1", "response_logprobs": [-0.1, -0.2]}),
        sp("client-2", "root", LLM, 50, 60),
        llm("server-2", "client-2", 51, 59),  # nested, no response id
        reward("r", "root", 70, 1.0),
    ]
    result = TracerTraceToTriplet().adapt(spans)
    assert [t.span_id for t in result.triplets] == ["server", "server-2"]
    assert result.usable[1].reward == 1.0 and result.triplets[0].response_logprobs == [-0.1, -0.2]
    # with token ids in both, the first copy is kept, as before
    assert [t.span_id for t in TracerTraceToTriplet().adapt([spans[0], llm("client", "root", 10, 40, **{
        "gen_ai.response.id": "resp-1"}), *spans[2:3]]).triplets] == ["client"]


def test_calls_under_a_reward_span_are_not_llm_calls() -> None:
    spans = [
        sp("root", None, "agent", 0, 100),
        llm("c1", "root", 10, 20),
        sp("judge", "root", "agentlightning.operation", 30, 60, **{"agentlightning.operation.name":
                                                                   "agentlightning.reward"}),
        llm("c-judge", "judge", 35, 45),
        reward("r", "root", 70, 1.0),
    ]
    assert [t.span_id for t in TracerTraceToTriplet().adapt(spans).triplets] == ["c1"]
    kept = TracerTraceToTriplet(exclude_llm_call_in_reward=False).adapt(spans)
    assert [t.span_id for t in kept.triplets] == ["c1", "c-judge"]


def test_first_occurrence_gives_each_reward_to_the_latest_call_that_ended_before_it() -> None:
    spans = [
        sp("root", None, "agent", 0, 200),
        llm("c1", "root", 10, 20),
        reward("r1", "root", 25, 0.25),
        llm("c2", "root", 30, 50),
        reward("early", "root", 40, 9.0),  # starts before c2 ends, and c1 has its reward: nobody gets it
        llm("c3", "root", 60, 70),
        llm("c4", "root", 80, 90),
        reward("r2", "root", 100, 1.0),  # the latest call first
        reward("r3", "root", 110, 0.5),  # then the one before it
    ]
    result = TracerTraceToTriplet().adapt(spans)
    assert [(t.span_id, t.reward) for t in result.triplets] == [("c1", 0.25), ("c2", None), ("c3", 0.5),
                                                               ("c4", 1.0)]


def test_first_sibling_matches_rewards_only_among_siblings() -> None:
    spans = [
        sp("root", None, "agent", 0, 200),
        sp("turn1", "root", "turn", 0, 50),
        llm("c1", "turn1", 10, 20),
        sp("turn2", "root", "turn", 60, 120),
        llm("c2", "turn2", 70, 80),
        reward("r2", "turn2", 90, 1.0),
        reward("r-root", "root", 150, 0.5),  # a sibling of the turns, not of any call
    ]
    sibling = TracerTraceToTriplet(reward_match=RewardMatchPolicy.FIRST_SIBLING).adapt(spans)
    assert [(t.span_id, t.reward) for t in sibling.triplets] == [("c1", None), ("c2", 1.0)]
    occurrence = TracerTraceToTriplet().adapt(spans)
    assert [(t.span_id, t.reward) for t in occurrence.triplets] == [("c1", 0.5), ("c2", 1.0)]


def test_opentelemetry_genai_spans_are_llm_calls() -> None:
    messages_in = [{"role": "system", "parts": [{"type": "text", "content": "Be brief."}]},
                   {"role": "user", "parts": [{"type": "text", "content": "2+2?"}]}]
    messages_out = [{"role": "assistant", "parts": [{"type": "text", "content": "4"}], "finish_reason": "stop"}]
    spans = [
        sp("root", None, "invoke_agent calc", 0, 100),
        sp("c1", "root", "chat gpt-4o", 10, 20, **TOKENS, **{
            "gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(messages_in),
            "gen_ai.output.messages": json.dumps(messages_out), "gen_ai.usage.input_tokens": 3}),
        sp("c2", "root", "text_completion llama", 30, 40, **TOKENS),  # named by the convention only
        sp("tool", "root", "execute_tool calc", 45, 50, **{"gen_ai.operation.name": "execute_tool"}),
        reward("r", "root", 60, 1.0),
    ]
    result = TracerTraceToTriplet().adapt(spans)
    assert [t.span_id for t in result.triplets] == ["c1", "c2"]
    first = result.triplets[0]
    assert (first.prompt_text, first.response_text) == ("Be brief.\n2+2?", "4")
    assert first.metadata["usage"] == {"input_tokens": 3}
    assert TracerTraceToTriplet(genai_llm_calls=False).adapt(spans).llm_calls == 0


def test_logprobs_from_a_list_or_the_openai_json() -> None:
    content = json.dumps([{"token": "4", "logprob": -0.1, "top_logprobs": []}, {"token": ".", "logprob": -2.0}])
    spans = [
        sp("root", None, "agent", 0, 100),
        llm("c1", "root", 10, 20, response_logprobs=[-0.5, -0.25]),
        llm("c2", "root", 30, 40, **{"logprobs.content": content}),
        reward("r", "root", 50, 1.0),
    ]
    result = TracerTraceToTriplet().adapt(spans)
    assert [t.response_logprobs for t in result.triplets] == [[-0.5, -0.25], [-0.1, -2.0]]


def test_weave_style_operation_keys() -> None:
    spans = [
        sp("root", None, "agent", 0, 100),
        sp("c1", "root", LLM, 10, 20, **{
            "agentlightning.operation.output.prompt_token_ids": [7, 8],
            "agentlightning.operation.output.choices.0.token_ids": [9],
            "agentlightning.operation.output.id": "resp-w",
            "agentlightning.operation.input.messages.0.role": "user",
            "agentlightning.operation.input.messages.0.content": "hi"}),
        reward("r", "root", 50, 1.0),
    ]
    [t] = TracerTraceToTriplet().adapt(spans).usable
    assert (t.prompt_token_ids, t.response_token_ids, t.prompt_text) == ([7, 8], [9], "hi")
    assert t.metadata["response_id"] == "resp-w"


def test_reasons_when_nothing_can_train() -> None:
    adapter = TracerTraceToTriplet()
    assert adapter.adapt([]).reason == "no spans"
    no_call = adapter.adapt([sp("root", None, "agent", 0, 10), reward("r", "root", 5, 1.0)])
    assert no_call.reason is not None and no_call.reason.startswith("no LLM call among 2 spans")
    no_tokens = adapter.adapt([sp("root", None, "agent", 0, 10), sp("c", "root", LLM, 1, 2),
                               reward("r", "root", 5, 1.0)])
    assert no_tokens.reason is not None and no_tokens.reason.startswith("no token ids")
    assert no_tokens.usable == [] and len(no_tokens.triplets) == 1
    no_reward = adapter.adapt([sp("root", None, "agent", 0, 10), llm("c", "root", 1, 2)])
    assert no_reward.reason is not None and no_reward.reason.startswith("no reward:")
    unmatched = adapter.adapt([sp("root", None, "agent", 0, 10), reward("r", "root", 1, 1.0), llm("c", "root", 2, 3)])
    assert unmatched.reason is not None and unmatched.reason.startswith("no reward matched")


def test_skipping_calls_without_tokens_before_matching_keeps_the_reward_trainable() -> None:
    spans = [
        sp("root", None, "agent", 0, 100),
        llm("policy", "root", 10, 20),
        sp("grader", "root", LLM, 30, 40),  # an LLM call with no token ids (another model)
        reward("r", "root", 50, 1.0),
    ]
    plain = TracerTraceToTriplet().adapt(spans)
    assert [(t.span_id, t.reward) for t in plain.triplets] == [("policy", None), ("grader", 1.0)]
    assert plain.reason is not None and plain.reason.startswith("no reward matched")
    skipping = TracerTraceToTriplet(skip_empty_token_spans=True).adapt(spans)
    assert [(t.span_id, t.reward) for t in skipping.usable] == [("policy", 1.0)]


def test_llm_proxy_adapter_orders_and_matches_by_sequence_id() -> None:
    spans = [
        reward("r-first", None, 0, 9.0, seq=1),  # no call before it
        sp("p1", None, "raw_gen_ai_request", 100, 110, 2, **{
            "llm.hosted_vllm.prompt_token_ids": "[1, 2]", "llm.hosted_vllm.response_token_ids": "[[3, 4]]",
            "llm.hosted_vllm.id": "a"}),
        sp("p1-copy", None, "raw_gen_ai_request", 100, 110, 3, **{
            "llm.hosted_vllm.prompt_token_ids": "[1, 2]", "llm.hosted_vllm.choices": "[{'token_ids': [3, 4]}]",
            "llm.hosted_vllm.id": "a"}),
        sp("p2", None, "litellm_request", 0, 1, 4, prompt_token_ids=[5], response_token_ids=[6]),
        reward("r", None, 0, 1.0, seq=5),  # timestamps are ignored: only sequence ids count
        reward("r-same-seq", None, 0, 0.5, seq=2),  # not strictly after p1
    ]
    result = LlmProxyTraceToTriplet().adapt(spans)
    assert [(t.span_id, t.prompt_token_ids, t.response_token_ids, t.reward) for t in result.triplets] == [
        ("p1", [1, 2], [3, 4], None), ("p2", [5], [6], 1.0)]
    assert result.reason is None and result.reward_spans == 3


def test_records_are_ordered_by_sequence_and_deduplicated() -> None:
    def rec(span_id: str, seq: int) -> SpanRecorded:
        meta = EventMeta(event_id=f"e{span_id}{seq}", rollout_id="ro-1", producer_id="p", producer_seq=seq,
                         timestamp_ns=1)
        return SpanRecorded(meta=meta, attempt_id="at-1", sequence_id=seq, trace_id="0" * 32, span_id=span_id,
                            name="s", start_time_ns=10, end_time_ns=None)

    spans = trace_spans([rec("b" * 16, 2), rec("a" * 16, 1), rec("b" * 16, 2)])
    assert [s.span_id for s in spans] == ["a" * 16, "b" * 16]
    assert spans[0].end == spans[0].start == 10


def test_reward_readers() -> None:
    assert reward_value("x", {"agentlightning.reward.0.name": "task", "agentlightning.reward.0.value": 0.7,
                              "agentlightning.reward.1.name": "speed", "agentlightning.reward.1.value": 0.1}) == 0.7
    assert reward_value("x", {"agentops.task.output": json.dumps({"type": "reward", "value": 0.3})}) == 0.3
    assert reward_value("agentlightning.annotation", {"reward": 2}) == 2.0
    assert reward_value("agentlightning.reward", {"reward": 2.0}) is None  # the 0.2 format, as in 0.3.0
    two = {"agentlightning.reward.0.name": "task", "agentlightning.reward.0.value": 0.7,
           "agentlightning.reward.1.name": "speed", "agentlightning.reward.1.value": 0.1}
    assert list(reward_dimension_values(two).items()) == [("task", 0.7), ("speed", 0.1)]
    assert reward_dimension_values({"reward": 2.0}) == {}
    assert unflatten({"a.0": 1, "a.1": 2, "b.2": 3}) == {"a": [1, 2], "b": {"2": 3}}
