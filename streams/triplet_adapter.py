"""Spans of one attempt -> (prompt token ids, response token ids, reward, metadata) triplets (pure, no Kafka).

Two adapters with Agent Lightning 0.3's semantics (``agentlightning/adapter/triplet.py``):

* :class:`TracerTraceToTriplet` (the default): the span tree (``trace_tree.py``), LLM calls found in it, one
  triplet per call in depth-first order, rewards matched by time (``first_occurrence``) or among siblings
  (``first_sibling``).
* :class:`LlmProxyTraceToTriplet`: the LLM proxy's ``raw_gen_ai_request`` / ``litellm_request`` spans, ordered
  and matched by sequence id only.

Where an LLM call's span keeps its data (the reference's keys, first found wins):

==========================  ==================================================================================
prompt token ids            ``prompt_token_ids``, ``agentlightning.operation.output.prompt_token_ids``
response token ids          ``response_token_ids``, ``agentlightning.operation.output.response_token_ids.0``,
                            ``agentlightning.operation.output.choices.0.token_ids``,
                            ``agentlightning.operation.output.choices.0.provider_specific_fields.token_ids``
response log-probs          ``response_logprobs`` (list of numbers), else ``logprobs.content`` (OpenAI JSON)
prompt / response messages  flattened ``gen_ai.prompt.N.*`` / ``gen_ai.completion.N.*`` (or the Weave
                            ``agentlightning.operation.*`` keys), else GenAI ``gen_ai.input.messages`` /
                            ``gen_ai.output.messages`` JSON
response id (de-dupe)       ``gen_ai.response.id``, ``agentlightning.operation.output.id``
reward                      ``agentlightning.annotation`` span with ``agentlightning.reward.0.value``
policy version (litstream)  ``litstream.policy.version`` (int), else the span's resources id ``policy-vN``
==========================  ==================================================================================

An :class:`AdaptResult` says which triplets can train (both token id lists present, and at least one reward
in the attempt) and, when none can, why.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from litstream.schemas.events import SpanRecorded

from . import span_attrs as sa
from .trace_tree import RESPONSE_ID_KEYS, RewardMatchPolicy, TraceSpan, TraceTree

DEFAULT_LLM_CALL_MATCH = r"openai\.chat\.completion"
POLICY_VERSION_ATTR = "litstream.policy.version"
PROMPT_TOKEN_KEYS = ("prompt_token_ids", "agentlightning.operation.output.prompt_token_ids")
RESPONSE_TOKEN_KEYS = (
    "response_token_ids",
    "agentlightning.operation.output.response_token_ids.0",
    "agentlightning.operation.output.choices.0.token_ids",
    "agentlightning.operation.output.choices.0.provider_specific_fields.token_ids",
)


@dataclass(frozen=True)
class Triplet:
    prompt_token_ids: list[int]
    response_token_ids: list[int]
    reward: float | None
    span_id: str
    sequence_id: int = 0
    resources_id: str | None = None
    response_logprobs: list[float] = field(default_factory=list)
    prompt_raw: Any = None
    response_raw: Any = None
    prompt_text: str = ""
    response_text: str = ""
    image_urls: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def has_tokens(self) -> bool:
        return bool(self.prompt_token_ids) and bool(self.response_token_ids)


@dataclass(frozen=True)
class AdaptResult:
    triplets: list[Triplet]  # what the reference adapter returns, in order
    llm_calls: int
    reward_spans: int
    reason: str | None  # why no triplet can train; None when ``usable`` is not empty

    @property
    def usable(self) -> list[Triplet]:
        return [] if self.reason is not None else [t for t in self.triplets if t.has_tokens]


class TraceAdapter(Protocol):
    def adapt(self, spans: Sequence[TraceSpan]) -> AdaptResult: ...


def trace_span(span: SpanRecorded) -> TraceSpan:
    end = span.end_time_ns if span.end_time_ns is not None else span.start_time_ns
    return TraceSpan(span_id=span.span_id, parent_id=span.parent_id, name=span.name, start=span.start_time_ns,
                     end=end, attributes=span.attributes, sequence_id=span.sequence_id,
                     resources_id=span.resources_id)


def trace_spans(spans: Sequence[SpanRecorded]) -> list[TraceSpan]:
    """In the store's order (sequence id, then start time), one per span id."""
    seen: set[str] = set()
    out: list[TraceSpan] = []
    for s in sorted(spans, key=lambda s: (s.sequence_id, s.start_time_ns)):
        if s.span_id not in seen:
            seen.add(s.span_id)
            out.append(trace_span(s))
    return out


def _why_unusable(triplets: Sequence[Triplet], n_spans: int, reward_spans: int, no_call: str) -> str | None:
    if n_spans == 0:
        return "no spans"
    if not triplets:
        return f"no LLM call among {n_spans} spans ({no_call})"
    with_tokens = [t for t in triplets if t.has_tokens]
    if not with_tokens:
        return (f"no token ids: none of {len(triplets)} LLM calls has both prompt_token_ids and "
                "response_token_ids")
    if all(t.reward is None for t in with_tokens):
        if reward_spans == 0:
            return f"no reward: {len(with_tokens)} LLM calls with token ids and no reward span"
        return f"no reward matched: {reward_spans} reward spans, none after an LLM call with token ids"
    return None


# --- the tracer adapter ------------------------------------------------------------------------------------


def _logprobs(attributes: sa.Attributes) -> list[float]:
    direct = sa.float_list(attributes.get("response_logprobs"))
    if direct is not None:
        return direct
    content = attributes.get("logprobs.content")
    parsed = json.loads(content) if isinstance(content, str) and content.startswith("[") else None
    if isinstance(parsed, list) and parsed and all(isinstance(e, dict) for e in parsed):
        return sa.float_list([e.get("logprob") for e in parsed]) or []
    return []


def _metadata_part(attributes: sa.Attributes, prefixes: Sequence[str], drop: Sequence[str]) -> Any:
    found = sa.first_unflattened(attributes, prefixes)
    if isinstance(found, dict):
        for key in drop:
            found.pop(key, None)
    return found


def span_to_triplet(span: TraceSpan, agent_name: str) -> Triplet:
    a = span.attributes
    prompt_raw = sa.first_unflattened(a, ["gen_ai.prompt", "agentlightning.operation.input.messages"]) \
        or sa.genai_messages(a, "gen_ai.input.messages")
    response_raw = sa.first_unflattened(a, ["gen_ai.completion", "agentlightning.operation.output.choices"]) \
        or sa.genai_messages(a, "gen_ai.output.messages")
    metadata: dict[str, Any] = {
        "request": _metadata_part(a, ["gen_ai.request", "agentlightning.operation.input"], ["messages"]),
        "response": _metadata_part(a, ["gen_ai.response", "agentlightning.operation.output"],
                                   ["choices", "prompt_token_ids", "response_token_ids"]),
        "response_id": sa.first_str(a, RESPONSE_ID_KEYS),
        "agent_name": agent_name,
    }
    usage = sa.under(a, "gen_ai.usage")
    if usage:
        metadata["usage"] = usage
    if a.get("litstream.constrained") is True:  # decoded under a grammar, whose masks the learner replays
        metadata["constrained"] = True
        grammar = a.get("litstream.grammar")
        if isinstance(grammar, str) and grammar:
            metadata["grammar"] = grammar
    version = a.get(POLICY_VERSION_ATTR)  # the version that generated it, when the agent knows (policy_agent.py)
    if isinstance(version, int) and not isinstance(version, bool) and version >= 0:
        metadata["policy_version"] = version
    return Triplet(
        prompt_token_ids=sa.first_int_list(a, PROMPT_TOKEN_KEYS) or [],
        response_token_ids=sa.first_int_list(a, RESPONSE_TOKEN_KEYS) or [],
        reward=None, span_id=span.span_id, sequence_id=span.sequence_id, resources_id=span.resources_id,
        response_logprobs=_logprobs(a), prompt_raw=prompt_raw, response_raw=response_raw,
        prompt_text=sa.messages_text(prompt_raw), response_text=sa.messages_text(response_raw),
        image_urls=sa.image_urls(prompt_raw), metadata=metadata,
    )


class TracerTraceToTriplet:
    """The reference's default adapter. ``genai_llm_calls`` adds OpenTelemetry GenAI spans to the LLM calls;
    ``skip_empty_token_spans`` drops calls without token ids *before* rewards are matched (the reference's
    ``_skip_empty_token_spans``), so a reward is never given to a call that cannot train."""

    def __init__(self, repair_hierarchy: bool = True, llm_call_match: str = DEFAULT_LLM_CALL_MATCH,
                 agent_match: str | None = None, exclude_llm_call_in_reward: bool = True,
                 reward_match: RewardMatchPolicy = RewardMatchPolicy.FIRST_OCCURRENCE,
                 genai_llm_calls: bool = True, skip_empty_token_spans: bool = False) -> None:
        self.repair_hierarchy = repair_hierarchy
        self.llm_call_match = llm_call_match
        self.agent_match = agent_match
        self.exclude_llm_call_in_reward = exclude_llm_call_in_reward
        self.reward_match = RewardMatchPolicy(reward_match)
        self.genai_llm_calls = genai_llm_calls
        self.skip_empty_token_spans = skip_empty_token_spans

    def tree(self, spans: Sequence[TraceSpan]) -> TraceTree:
        tree = TraceTree.from_spans(spans)
        if self.repair_hierarchy:
            tree.repair_hierarchy()
        return tree

    def adapt(self, spans: Sequence[TraceSpan]) -> AdaptResult:
        no_call = f"names matching /{self.llm_call_match}/" + (
            " or OpenTelemetry GenAI chat/text_completion/generate_content spans" if self.genai_llm_calls else "")
        if not spans:
            return AdaptResult([], 0, 0, _why_unusable([], 0, 0, no_call))
        tree = self.tree(spans)
        reward_spans = sum(1 for n in tree.traverse() if n.reward() is not None)
        calls = tree.find_llm_calls(llm_call_match=self.llm_call_match, agent_match=self.agent_match,
                                    genai=self.genai_llm_calls, exclude_in_reward=self.exclude_llm_call_in_reward,
                                    prefer=_has_token_ids)
        every = [(node, span_to_triplet(node.span, agent)) for node, agent in calls]
        kept = [(node, t) for node, t in every if t.has_tokens or not self.skip_empty_token_spans]
        rewards = tree.match_rewards(self.reward_match, [node for node, _ in kept])
        triplets = [_with_reward(t, rewards.get(node.id)) for node, t in kept]
        reason = _why_unusable(triplets or [t for _, t in every], len(spans), reward_spans, no_call)
        return AdaptResult(triplets, len(calls), reward_spans, reason)


def _has_token_ids(span: TraceSpan) -> bool:
    a = span.attributes
    return bool(sa.first_int_list(a, PROMPT_TOKEN_KEYS)) and bool(sa.first_int_list(a, RESPONSE_TOKEN_KEYS))


def _with_reward(t: Triplet, reward: float | None) -> Triplet:
    return Triplet(**{**t.__dict__, "reward": reward})


# --- the LLM proxy adapter ---------------------------------------------------------------------------------


def _literal(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return ast.literal_eval(value)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return value
    return value


def _proxy_tokens(span: TraceSpan) -> tuple[list[int], list[int]]:
    a = span.attributes
    if span.name == "raw_gen_ai_request":
        prompt = sa.int_list(_literal(a.get("llm.hosted_vllm.prompt_token_ids"))) or []
        response: list[int] = []
        nested = _literal(a.get("llm.hosted_vllm.response_token_ids"))
        if isinstance(nested, list) and nested and isinstance(nested[0], list):
            response = sa.int_list(nested[0]) or []
        if not response:
            choices = _literal(a.get("llm.hosted_vllm.choices"))
            if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                response = sa.int_list(choices[0].get("token_ids")) or []
        return prompt, response
    if span.name == "litellm_request":
        return (sa.int_list(_literal(a.get("prompt_token_ids") or [])) or [],
                sa.int_list(_literal(a.get("response_token_ids") or [])) or [])
    return [], []


class LlmProxyTraceToTriplet:
    """The reference's experimental proxy adapter: ignores timestamps and the tree; a reward goes to the latest
    unrewarded LLM call with a smaller sequence id."""

    def adapt(self, spans: Sequence[TraceSpan]) -> AdaptResult:
        ordered = sorted(spans, key=lambda s: (s.sequence_id, s.start))
        calls: list[Triplet] = []
        seen: set[str] = set()
        for s in ordered:
            prompt, response = _proxy_tokens(s)
            if not (prompt and response):
                continue
            rid = s.attributes.get("gen_ai.response.id") or s.attributes.get("llm.hosted_vllm.id")
            request_id = rid if isinstance(rid, str) and rid else None
            if request_id is not None:
                if request_id in seen:
                    continue
                seen.add(request_id)
            calls.append(Triplet(prompt_token_ids=prompt, response_token_ids=response, reward=None,
                                 span_id=s.span_id, sequence_id=s.sequence_id, resources_id=s.resources_id,
                                 metadata={"response_id": request_id}))
        calls.sort(key=lambda t: t.sequence_id)
        rewards = sorted(((s.sequence_id, v) for s in ordered
                          if (v := sa.reward_value(s.name, s.attributes)) is not None), key=lambda x: x[0])
        assigned: dict[str, float] = {}
        for seq, value in rewards:
            for call in reversed(calls):
                if call.span_id not in assigned and call.sequence_id < seq:
                    assigned[call.span_id] = value
                    break
        triplets = [_with_reward(t, assigned.get(t.span_id)) for t in calls]
        no_call = "raw_gen_ai_request or litellm_request spans with both token id lists"
        return AdaptResult(triplets, len(calls), len(rewards), _why_unusable(triplets, len(spans), len(rewards),
                                                                             no_call))
