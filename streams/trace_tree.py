"""The span tree of one attempt, as Agent Lightning 0.3's ``TraceTree`` builds and reads it (pure, no Kafka).

Rules kept from the reference (``agentlightning/adapter/triplet.py``):

* children in input order; roots are spans without a parent plus parent ids that never appear, which become
  *virtual* spans covering their children; several roots hang under a synthetic ``virtual-root``;
* ``repair_hierarchy`` moves the children of the first node with several children under the node elsewhere in
  the tree that encloses them in time most tightly;
* LLM-call detection with agent match, exclusion under reward spans and response-id de-duplication;
* reward matching ``first_occurrence`` (time order over the whole tree) and ``first_sibling`` (per parent).

On top of the reference, a span that follows the OpenTelemetry GenAI conventions (``gen_ai.operation.name`` of
``chat``/``text_completion``/``generate_content``, or a name starting with one of those and a space) is an LLM
call too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .span_attrs import OPERATION_NAME, OPERATION_SPAN, REWARD_OPERATION, first_str, reward_value

VIRTUAL_ROOT = "virtual-root"
GENAI_LLM_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
RESPONSE_ID_KEYS = ("gen_ai.response.id", "agentlightning.operation.output.id")


class RewardMatchPolicy(str, Enum):
    FIRST_SIBLING = "first_sibling"
    FIRST_OCCURRENCE = "first_occurrence"


@dataclass(frozen=True)
class TraceSpan:
    """What the adapters read of a span. ``start``/``end`` are nanoseconds; ``end`` defaults to ``start``."""

    span_id: str
    parent_id: str | None
    name: str
    start: int
    end: int
    attributes: Mapping[str, Any] = field(default_factory=dict)
    sequence_id: int = 0
    resources_id: str | None = None
    virtual: bool = False


def is_genai_llm_call(span: TraceSpan) -> bool:
    if span.attributes.get("gen_ai.operation.name") in GENAI_LLM_OPERATIONS:
        return True
    return any(span.name.startswith(op + " ") for op in GENAI_LLM_OPERATIONS)


class TraceTree:
    def __init__(self, span: TraceSpan, children: list[TraceTree] | None = None) -> None:
        self.span = span
        self.id = span.span_id
        self.children = children or []
        self._reward: tuple[float | None] | None = None

    @property
    def start(self) -> int:
        return self.span.start

    @property
    def end(self) -> int:
        return self.span.end

    def traverse(self) -> list[TraceTree]:
        """Depth first, parents before children."""
        out: list[TraceTree] = []
        stack = [self]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(reversed(node.children))
        return out

    # -- building -------------------------------------------------------------------------------------------

    @classmethod
    def from_spans(cls, spans: Sequence[TraceSpan]) -> TraceTree:
        if not spans:
            raise ValueError("no spans")
        by_id: dict[str, TraceSpan] = {}
        for s in spans:
            by_id.setdefault(s.span_id, s)
        spans = list(by_id.values())  # a span delivered twice counts once
        children: dict[str, list[str]] = {}
        roots: list[str] = []
        for s in spans:
            if s.parent_id is None:
                roots.append(s.span_id)
            else:
                children.setdefault(s.parent_id, []).append(s.span_id)
        # A parent that never arrived (e.g. a lost session span) becomes a virtual root over its children.
        roots += [pid for pid in children if pid not in by_id]
        if not roots:
            raise ValueError("no root span (every span has a parent inside the trace: a cycle)")

        def build(node_id: str, seen: frozenset[str]) -> TraceTree:
            kids = [build(c, seen | {node_id}) for c in children.get(node_id, []) if c not in seen]
            span = by_id.get(node_id)
            if span is None:
                span = TraceSpan(span_id=node_id, parent_id=None, name=node_id, start=min(k.start for k in kids),
                                 end=max(k.end for k in kids), sequence_id=kids[0].span.sequence_id, virtual=True)
            return cls(span, kids)

        trees = [build(r, frozenset()) for r in roots]
        if len(trees) == 1:
            return trees[0]
        root = TraceSpan(span_id=VIRTUAL_ROOT, parent_id=None, name=VIRTUAL_ROOT, start=trees[0].start,
                         end=trees[-1].end, sequence_id=trees[0].span.sequence_id, virtual=True)
        return cls(root, trees)

    def repair_hierarchy(self) -> None:
        """Descend while there is a single child; then re-parent each child of that node under the node that
        encloses it in time with the least positive slack (not itself, not this node)."""
        node = self
        while len(node.children) == 1:
            node = node.children[0]
        for child in list(node.children):
            if len(node.children) == 1:
                break
            inside = {n.id for n in child.traverse()}  # never under its own descendant (the reference can)
            best: TraceTree | None = None
            best_slack = float("inf")
            for candidate in node.traverse():
                if candidate is node or candidate.id in inside:
                    continue
                if candidate.start <= child.start and candidate.end >= child.end:
                    slack = (candidate.end - child.end) + (child.start - candidate.start)
                    if 0 < slack < best_slack:
                        best, best_slack = candidate, slack
            if best is not None:
                node.children.remove(child)
                best.children.append(child)

    # -- reading --------------------------------------------------------------------------------------------

    def reward(self) -> float | None:
        if self._reward is None:
            self._reward = (reward_value(self.span.name, self.span.attributes),)
        return self._reward[0]

    def is_reward_span(self) -> bool:
        if self.reward() is not None:
            return True
        return self.span.name == OPERATION_SPAN and self.span.attributes.get(OPERATION_NAME) == REWARD_OPERATION

    def agent_name(self) -> str | None:
        """The agent a span stands for, from the frameworks' attributes, in the reference's order."""
        a = self.span.attributes

        def text(key: str) -> str | None:
            v = a.get(key)
            return v if isinstance(v, str) else None

        if (name := text("agent.name")) is not None:  # OpenAI Agents SDK
            return name
        if a.get("agentops.span.kind") == "agent" and (name := text("operation.name")) is not None:
            return name
        for key in ("recipient_agent_type", "langchain.chain.type", "executor.id"):  # AutoGen, LangGraph, MAF
            if (name := text(key)) is not None:
                return name
        if a.get("type") == "agent" and (name := text("agentlightning.operation.input.name")) is not None:
            return name  # Weave
        if self.span.name.startswith("langchain.Chain.") and (name := text("lc_name")) is not None:
            return name
        return None

    def is_llm_call_name(self, llm_call_match: str, genai: bool) -> bool:
        return re.search(llm_call_match, self.span.name) is not None or (genai and is_genai_llm_call(self.span))

    def find_llm_calls(self, *, llm_call_match: str, agent_match: str | None, genai: bool = True,
                       exclude_in_reward: bool = True, dedupe: bool = True,
                       prefer: Callable[[TraceSpan], bool] | None = None) -> list[tuple[TraceTree, str]]:
        """LLM-call nodes in depth-first order, each with the agent whose subtree it is in.

        Copies of one call (the same response id, or one without an id nested in a kept call) count once: the
        first, as the reference, unless ``prefer`` holds for a later copy and not for the kept one. Then that
        copy stands for the call (an instrumented client's span without token ids, and the span the LLM server
        recorded for the same response with them: the second can train)."""
        kept_by_id: dict[str, int] = {}
        out: list[tuple[TraceTree, str]] = []
        # (node, matching agent or None, under a reward span, index in out of the enclosing kept LLM call)
        stack: list[tuple[TraceTree, str | None, bool, int | None]] = [
            (self, "*" if agent_match is None else None, False, None)]
        while stack:
            node, agent, in_reward, enclosing = stack.pop()
            if agent is not None and not (exclude_in_reward and in_reward) and \
                    node.is_llm_call_name(llm_call_match, genai):
                response_id = first_str(node.span.attributes, RESPONSE_ID_KEYS)
                copy_of = kept_by_id.get(response_id) if response_id is not None else \
                    (enclosing if dedupe else None)
                if copy_of is None:
                    out.append((node, agent))
                    if response_id is not None:
                        kept_by_id[response_id] = len(out) - 1
                    if dedupe and enclosing is None:
                        enclosing = len(out) - 1
                elif prefer is not None and prefer(node.span) and not prefer(out[copy_of][0].span):
                    out[copy_of] = (node, out[copy_of][1])
            name = node.agent_name()
            if name is not None:
                agent = name if agent_match is None or re.search(agent_match, name) else None
            in_reward = in_reward or node.is_reward_span()
            stack.extend((c, agent, in_reward, enclosing) for c in reversed(node.children))
        return out

    def match_rewards(self, policy: RewardMatchPolicy, llm_calls: Sequence[TraceTree]) -> dict[str, float | None]:
        """Give each reward to the most recent LLM call that ended before it started and has none yet."""
        call_ids = {c.id for c in llm_calls}
        rewards: dict[str, float | None] = {}

        def scan(nodes: Sequence[TraceTree]) -> None:
            open_calls: list[tuple[str, int]] = []
            for node in nodes:
                if node.id in call_ids:
                    open_calls.append((node.id, node.end))
                value = node.reward()
                if value is None:
                    continue
                for call_id, call_end in reversed(open_calls):
                    if call_end > node.start or call_id in rewards:
                        continue
                    rewards[call_id] = value
                    break

        if policy == RewardMatchPolicy.FIRST_OCCURRENCE:
            scan(sorted(self.traverse(), key=lambda n: n.start))  # stable: ties keep depth-first order
        else:
            for parent in self.traverse():
                scan(parent.children)
        return rewards
