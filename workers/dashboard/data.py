"""What the dashboard's pages show, computed from the store's live views, ClickHouse and the health beats.

Pure functions where possible (filters, waterfall layout, LLM-call extraction), so the pages stay thin templates.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from litstream.schemas.events import RolloutSnapshot
from litstream.schemas.models import ROLLOUT_STATUSES, Span
from litstream.schemas.policy_versions import label_order, resources_order
from litstream.streams.replay import parse_until
from litstream.workers.runs import RunSummary

PAGE_SIZE = 25
MODES = ("train", "val", "test")
QUEUED = ("queuing", "requeuing")
SINCE_CHOICES = {"": "any time", "5m": "last 5 minutes", "1h": "last hour", "24h": "last 24 hours"}
_SINCE_SECONDS = {"5m": 300, "1h": 3600, "24h": 86400}


class BadFilter(ValueError):
    """A filter value the page cannot use; the message says which and what is allowed."""


@dataclass(frozen=True)
class RolloutFilter:
    status: str = ""
    mode: str = ""
    resources_id: str = ""
    since: str = ""
    page: int = 1
    as_of: str = ""  # a point of the log (docs/history.md): the rollouts as they were then

    @classmethod
    def from_query(cls, query: Mapping[str, str]) -> RolloutFilter:
        status, mode, since = query.get("status", ""), query.get("mode", ""), query.get("since", "")
        if status and status not in ROLLOUT_STATUSES:
            raise BadFilter(f"status must be one of {', '.join(ROLLOUT_STATUSES)} (got {status!r})")
        if mode and mode not in MODES:
            raise BadFilter(f"mode must be one of {', '.join(MODES)} (got {mode!r})")
        if since not in SINCE_CHOICES:
            raise BadFilter(f"since must be one of {', '.join(k for k in SINCE_CHOICES if k)} (got {since!r})")
        try:
            page = max(1, int(query.get("page", "1") or 1))
        except ValueError:
            raise BadFilter(f"page must be a whole number (got {query.get('page')!r})") from None
        as_of = query.get("as_of", "").strip()
        if as_of:
            try:
                parse_until(as_of)
            except ValueError as exc:
                raise BadFilter(f"as of: {exc}") from None
        return cls(status, mode, query.get("resources_id", "").strip(), since, page, as_of)

    def matches(self, s: RolloutSnapshot, now: float, used: frozenset[str] = frozenset()) -> bool:
        """``used``: rollouts whose spans name resources matching the filter (a rollout that names none runs on
        the latest published, so what it used is known from its spans)."""
        return ((not self.status or s.status == self.status) and (not self.mode or (s.mode or "") == self.mode)
                and (not self.resources_id or self.resources_id in (s.resources_id or "") or s.rollout_id in used)
                and (not self.since or s.start_time >= now - _SINCE_SECONDS[self.since]))


@dataclass
class RolloutPage:
    items: list[RolloutSnapshot]
    total: int
    page: int
    pages: int
    counts: dict[str, int] = field(default_factory=dict)


def rollout_page(snapshots: Iterable[RolloutSnapshot], f: RolloutFilter, now: float | None = None,
                 used: frozenset[str] = frozenset()) -> RolloutPage:
    """Newest first; ``counts`` are per status over every rollout (the summary bar ignores the filter)."""
    now = time.time() if now is None else now
    every = list(snapshots)
    counts = {status: 0 for status in ROLLOUT_STATUSES}
    for s in every:
        counts[s.status] = counts.get(s.status, 0) + 1
    chosen = sorted((s for s in every if f.matches(s, now, used)), key=lambda s: s.start_time, reverse=True)
    pages = max(1, math.ceil(len(chosen) / PAGE_SIZE))
    page = min(f.page, pages)
    items = chosen[(page - 1) * PAGE_SIZE: page * PAGE_SIZE]
    return RolloutPage(items, len(chosen), page, pages, counts)


# -- one rollout ---------------------------------------------------------------------------------------------


@dataclass
class TimelineBar:
    label: str
    status: str
    worker: str
    left: float  # percent of the rollout's span of time
    width: float
    start: float
    end: float | None
    error: str | None


def attempt_timeline(s: RolloutSnapshot, now: float | None = None) -> list[TimelineBar]:
    """The wait in the queue, then each attempt, as bars on one time axis from the rollout's start to its end
    (or now)."""
    now = time.time() if now is None else now
    t0 = s.start_time
    t1 = max([s.end_time or now, *[(a.end_time or now) for a in s.attempts]])
    total = max(t1 - t0, 1e-6)

    def bar(label: str, status: str, worker: str, start: float, end: float | None, error: str | None) -> TimelineBar:
        stop = end if end is not None else now
        return TimelineBar(label, status, worker, max(0.0, (start - t0) / total * 100),
                           max(0.8, (stop - start) / total * 100), start, end, error)

    first = s.attempts[0].start_time if s.attempts else None
    bars = [bar("queued", "queued", "waiting for a runner", t0, first, None)]
    bars += [bar(f"attempt {a.sequence_id}", a.status, a.worker_id or "-", a.start_time, a.end_time, a.error)
             for a in s.attempts]
    return bars


@dataclass
class WaterfallRow:
    span: Span
    depth: int
    left: float
    width: float
    duration_ms: float
    attributes: list[tuple[str, str]]
    kind: str  # llm | tool | reward | other
    note: str = ""  # a tool's arguments and result, the tool calls an LLM call answered with


TOOL_OPERATION = "execute_tool"  # a tool's execution (the SDK's tool_span, the OpenTelemetry GenAI convention)


def span_kind(span: Span) -> str:
    attrs = span.attributes
    if span.name == "agentlightning.annotation" or any(k.startswith("agentlightning.reward") for k in attrs):
        return "reward"
    if attrs.get("gen_ai.operation.name") == TOOL_OPERATION or span.name.startswith(TOOL_OPERATION + " "):
        return "tool"
    if any(k.startswith(("gen_ai.prompt", "gen_ai.input", "gen_ai.usage")) for k in attrs) or \
            attrs.get("gen_ai.operation.name") in ("chat", "text_completion", "generate_content"):
        return "llm"
    return "other"


def _depths(spans: Sequence[Span]) -> dict[str, int]:
    parents = {s.span_id: s.parent_id for s in spans}
    depths: dict[str, int] = {}
    for s in spans:
        depth, node, seen = 0, s.parent_id, {s.span_id}
        while node in parents and node not in seen:  # a parent outside the attempt is a root's parent
            seen.add(node)
            depth += 1
            node = parents[node]
        depths[s.span_id] = depth
    return depths


def _tree_order(spans: Sequence[Span]) -> list[Span]:
    """Parents before children, siblings by start time (a waterfall reads top to bottom)."""
    ids = {s.span_id for s in spans}
    children: dict[str | None, list[Span]] = {}
    for s in sorted(spans, key=lambda s: (s.start_time or 0, s.sequence_id)):
        children.setdefault(s.parent_id if s.parent_id in ids else None, []).append(s)
    out: list[Span] = []
    stack = list(reversed(children.get(None, [])))
    while stack:
        s = stack.pop()
        out.append(s)
        stack.extend(reversed(children.get(s.span_id, [])))
    return out if len(out) == len(spans) else list(spans)  # a cycle: keep the recorded order


def waterfall(spans: Sequence[Span]) -> list[WaterfallRow]:
    if not spans:
        return []
    t0 = min(s.start_time or 0 for s in spans)
    t1 = max((s.end_time or s.start_time or 0) for s in spans)
    total = max(t1 - t0, 1e-9)
    depths = _depths(spans)
    rows = []
    for s in _tree_order(spans):
        start, end = s.start_time or t0, s.end_time or s.start_time or t0
        attrs = sorted((k, _short(v)) for k, v in s.attributes.items())
        kind = span_kind(s)
        rows.append(WaterfallRow(s, depths.get(s.span_id, 0), (start - t0) / total * 100,
                                 max(0.5, (end - start) / total * 100), (end - start) * 1000, attrs, kind,
                                 span_note(s, kind)))
    return rows


def span_note(span: Span, kind: str) -> str:
    """One line beside a span's name: a tool's arguments and result, or the calls an LLM call answered with."""
    a = span.attributes
    if kind == "tool":
        note = _short(a.get("gen_ai.tool.call.arguments", ""), 120)
        return note + (f" → {_short(a['gen_ai.tool.call.result'], 120)}" if "gen_ai.tool.call.result" in a else "")
    if kind == "llm":
        calls = answer_tool_calls(a)
        return ("→ " + ", ".join(f"{c.name}({_short(c.arguments, 80)})" for c in calls)) if calls else ""
    return ""


def _short(value: Any, limit: int = 2000) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + f" ... ({len(text)} characters)"


@dataclass
class ToolCall:
    """A call the model made; ``result`` and ``error`` come from the attempt's ``execute_tool`` span of the same
    call id, when it recorded one."""

    id: str
    name: str
    arguments: str
    result: str | None = None
    error: str | None = None
    span_id: str | None = None  # the execution's span


class Message(NamedTuple):
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls
    tool_call_id: str = ""  # a tool message: the call it answers


@dataclass
class LlmCall:
    span_id: str
    name: str
    model: str
    messages: list[Message]  # prompt then completion
    input_tokens: int | None
    output_tokens: int | None
    tools: list[str] = field(default_factory=list)  # the tools offered
    tool_choice: str = ""
    malformed: int = 0  # answers that began a tool call and did not parse (returned as text)
    constrained: bool = False


def _json_list(raw: Any) -> list[Any]:
    if isinstance(raw, list):
        return raw
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError:
        return []
    return value if isinstance(value, list) else []


def _tool_call(item: Mapping[str, Any]) -> ToolCall:
    """``{"id", "name", "arguments"}`` (the endpoint's spans, a GenAI ``tool_call`` part) or OpenAI's
    ``{"id", "function": {"name", "arguments"}}``."""
    fn = item["function"] if isinstance(item.get("function"), Mapping) else item
    args = fn.get("arguments", "")
    return ToolCall(str(item.get("id") or ""), str(fn.get("name") or "?"),
                    args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))


def _tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    return tuple(_tool_call(c) for c in _json_list(raw) if isinstance(c, Mapping))


def _indexed_messages(attrs: Mapping[str, Any], prefix: str, default_role: str) -> list[Message]:
    out = []
    i = 0
    while any(f"{prefix}.{i}.{key}" in attrs for key in ("content", "role", "tool_calls")):
        p = f"{prefix}.{i}"
        out.append(Message(str(attrs.get(f"{p}.role", default_role)), str(attrs.get(f"{p}.content", "")),
                           _tool_calls(attrs.get(f"{p}.tool_calls")), str(attrs.get(f"{p}.tool_call_id", ""))))
        i += 1
    return out


def _json_message(m: Mapping[str, Any], default_role: str) -> Message:
    """A message of ``gen_ai.input.messages`` / ``gen_ai.output.messages``: plain ``content``, or GenAI ``parts``
    (text, ``tool_call``, ``tool_call_response``)."""
    role = str(m.get("role", default_role))
    parts = m.get("parts")
    if not isinstance(parts, list):
        return Message(role, _short(m.get("content", "")), _tool_calls(m.get("tool_calls")),
                       str(m.get("tool_call_id") or ""))
    texts, calls, answers = [], [], ""
    for part in (p for p in parts if isinstance(p, Mapping)):
        if part.get("type") == "tool_call":
            calls.append(_tool_call(part))
        elif part.get("type") == "tool_call_response":
            answers = str(part.get("id") or "")
            texts.append(_short(part.get("response", part.get("result", ""))))
        else:
            texts.append(_short(part.get("content", "")))
    return Message(role, "\n".join(texts), tuple(calls), answers)


def _json_messages(raw: Any, default_role: str) -> list[Message]:
    try:
        items = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return [Message(default_role, str(raw))]
    if not isinstance(items, list):
        return [Message(default_role, str(raw))]
    return [_json_message(m, default_role) for m in items if isinstance(m, Mapping)]


def answer_tool_calls(attrs: Mapping[str, Any]) -> tuple[ToolCall, ...]:
    """The tool calls an LLM call answered with: ``gen_ai.completion.0.tool_calls``, else the ``tool_call`` parts
    of ``gen_ai.output.messages``."""
    if "gen_ai.completion.0.tool_calls" in attrs:
        return _tool_calls(attrs["gen_ai.completion.0.tool_calls"])
    return tuple(c for m in _json_messages(attrs.get("gen_ai.output.messages", "[]"), "assistant")
                 for c in m.tool_calls)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _tool_names(raw: Any) -> list[str]:
    """The names in ``gen_ai.tool.definitions`` (OpenAI tool objects)."""
    out = []
    for tool in (t for t in _json_list(raw) if isinstance(t, Mapping)):
        fn = tool["function"] if isinstance(tool.get("function"), Mapping) else tool
        out.append(str(fn.get("name") or "?"))
    return out


def executions(spans: Sequence[Span]) -> dict[str, Span]:
    """The attempt's ``execute_tool`` spans by the call id they ran."""
    return {str(s.attributes["gen_ai.tool.call.id"]): s for s in spans
            if span_kind(s) == "tool" and s.attributes.get("gen_ai.tool.call.id")}


def _attach_results(messages: list[Message], runs: Mapping[str, Span]) -> None:
    for call in (c for m in messages for c in m.tool_calls):
        run = runs.get(call.id)
        if run is None:
            continue
        call.span_id = run.span_id
        if "gen_ai.tool.call.result" in run.attributes:
            call.result = _short(run.attributes["gen_ai.tool.call.result"])
        if run.status.status_code == "ERROR":
            call.error = run.status.description or "the tool raised"


def _llm_call(s: Span, runs: Mapping[str, Span]) -> LlmCall:
    a = s.attributes
    messages = _indexed_messages(a, "gen_ai.prompt", "user") + _indexed_messages(a, "gen_ai.completion", "assistant")
    if not messages:
        messages = _json_messages(a.get("gen_ai.input.messages", "[]"), "user") + \
            _json_messages(a.get("gen_ai.output.messages", "[]"), "assistant")
    _attach_results(messages, runs)
    inp = _int(a.get("gen_ai.usage.input_tokens", a.get("gen_ai.usage.prompt_tokens")))
    out = _int(a.get("gen_ai.usage.output_tokens", a.get("gen_ai.usage.completion_tokens")))
    model = str(a.get("gen_ai.request.model") or a.get("gen_ai.response.model") or "")
    return LlmCall(s.span_id, s.name, model, messages, inp, out, _tool_names(a.get("gen_ai.tool.definitions")),
                   str(a.get("gen_ai.request.tool_choice", "")), _int(a.get("litstream.tool_calls.malformed")) or 0,
                   a.get("litstream.constrained") is True)


def llm_calls(spans: Sequence[Span]) -> list[LlmCall]:
    """Each LLM call's conversation; a tool call carries what its execution span recorded."""
    runs = executions(spans)
    return [_llm_call(s, runs) for s in spans if span_kind(s) == "llm"]


def rewards(spans: Sequence[Span]) -> list[tuple[str, str, float]]:
    """(span id, dimension, value) of every reward annotation, in recorded order."""
    out = []
    for s in spans:
        a = s.attributes
        i = 0
        while f"agentlightning.reward.{i}.value" in a:
            value = a[f"agentlightning.reward.{i}.value"]
            if isinstance(value, (int, float)):
                out.append((s.span_id, str(a.get(f"agentlightning.reward.{i}.name", "primary")), float(value)))
            i += 1
    return out


# -- resources ----------------------------------------------------------------------------------------------


def resource_lines(resources: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(name, type, the fields that tell versions apart: endpoint, model, template) of each named resource."""
    out = []
    for name, res in resources.items():
        fields = res.model_dump(exclude={"resource_type"}, exclude_none=True) if hasattr(res, "model_dump") else res
        summary = ", ".join(f"{k}={_short(v, 160)}" for k, v in fields.items() if v not in ({}, [], ""))
        out.append((name, str(getattr(res, "resource_type", "")), summary))
    return out


# -- training -----------------------------------------------------------------------------------------------


def reward_series(rows: list[list[Any]]) -> dict[str, Any]:
    """Rows of (resources id, mode, mean reward, count) -> chart data: one label per version, one line per mode."""
    versions = sorted({str(r[0]) for r in rows}, key=resources_order)
    by_mode: dict[str, dict[str, float]] = {"train": {}, "val": {}}
    for resources_id, mode, mean, _n in rows:
        by_mode.setdefault(str(mode) or "train", {})[str(resources_id)] = float(mean)
    return {"labels": versions,
            "series": {mode: [values.get(v) for v in versions] for mode, values in by_mode.items()}}


def run_series(runs: list[RunSummary]) -> dict[str, Any]:
    """Training runs -> chart data: one label per version, a validation and a training line per run (named by the
    run's name and the end of its id, which is unique)."""
    labels = sorted({label for r in runs for label in (*r.validation, *r.training)}, key=label_order)
    series: dict[str, list[float | None]] = {}
    for r in runs:
        name = f"{r.name} …{r.run_id[-6:]}" if r.name else r.run_id
        for mode, scores in (("validation", r.validation), ("train", r.training)):
            if scores:
                series[f"{name} {mode}"] = [round(scores[k].mean, 4) if k in scores else None for k in labels]
    return {"labels": labels, "series": series}


def step_series(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The trainer's per-step records -> chart data and the headline numbers."""
    steps = [r for r in records if "version" in r]
    tokens_per_s = [r.get("tokens", 0) / r["seconds"] if r.get("seconds") else 0.0 for r in steps]
    last = steps[-1] if steps else None
    return {
        "labels": [f"v{r['version']}" for r in steps],
        "reward": [r.get("reward_mean") for r in steps],
        "step_s": [r.get("seconds") for r in steps],
        "tokens_per_s": tokens_per_s,
        "current_version": last["version"] if last else None,
        "last_step_s": last.get("seconds") if last else None,
        "last_tokens_per_s": tokens_per_s[-1] if tokens_per_s else None,
        "steps": len(steps),
    }


# -- chart data for an SQL result ---------------------------------------------------------------------------


NUMERIC_TYPES = ("Int", "UInt", "Float", "Decimal", "Nullable(Int", "Nullable(UInt", "Nullable(Float")


def sql_chart(columns: list[str], types: list[str], rows: list[list[Any]], limit: int = 500) -> dict[str, Any] | None:
    """A chart of the result: the first column as labels, every numeric column after it as a series; None when
    nothing is numeric."""
    numeric = [i for i, t in enumerate(types) if i > 0 and t.startswith(NUMERIC_TYPES)]
    if not columns or not numeric or not rows:
        return None
    shown = rows[:limit]
    return {"labels": [str(r[0]) for r in shown],
            "series": {columns[i]: [_number(r[i]) for r in shown] for i in numeric}}


def _number(value: Any) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def age(t: float | None, now: float | None = None) -> str:
    """'3s ago', '2m ago', '1h ago'."""
    if t is None:
        return "-"
    seconds = max(0.0, (time.time() if now is None else now) - t)
    if seconds < 60:
        return f"{seconds:.0f}s ago"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m ago"
    return f"{seconds / 3600:.1f}h ago"
