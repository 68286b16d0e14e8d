"""What the dashboard's pages show, computed from the store's live views, ClickHouse and the health beats.

Pure functions where possible (filters, waterfall layout, LLM-call extraction), so the pages stay thin templates.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from litstream.schemas.events import RolloutSnapshot
from litstream.schemas.models import ROLLOUT_STATUSES, Span
from litstream.schemas.policy_versions import parse_policy_version

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
        return cls(status, mode, query.get("resources_id", "").strip(), since, page)

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
    kind: str  # llm | reward | other


def span_kind(span: Span) -> str:
    attrs = span.attributes
    if span.name == "agentlightning.annotation" or any(k.startswith("agentlightning.reward") for k in attrs):
        return "reward"
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
        rows.append(WaterfallRow(s, depths.get(s.span_id, 0), (start - t0) / total * 100,
                                 max(0.5, (end - start) / total * 100), (end - start) * 1000, attrs, span_kind(s)))
    return rows


def _short(value: Any, limit: int = 2000) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + f" ... ({len(text)} characters)"


@dataclass
class LlmCall:
    span_id: str
    name: str
    model: str
    messages: list[tuple[str, str]]  # (role, content), prompt then completion
    input_tokens: int | None
    output_tokens: int | None


def _indexed_messages(attrs: Mapping[str, Any], prefix: str, default_role: str) -> list[tuple[str, str]]:
    out = []
    i = 0
    while f"{prefix}.{i}.content" in attrs or f"{prefix}.{i}.role" in attrs:
        out.append((str(attrs.get(f"{prefix}.{i}.role", default_role)), str(attrs.get(f"{prefix}.{i}.content", ""))))
        i += 1
    return out


def _json_messages(raw: Any, default_role: str) -> list[tuple[str, str]]:
    try:
        items = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return [(default_role, str(raw))]
    if not isinstance(items, list):
        return [(default_role, str(raw))]
    return [(str(m.get("role", default_role)), _short(m.get("content", m.get("parts", ""))))
            for m in items if isinstance(m, dict)]


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def llm_calls(spans: Sequence[Span]) -> list[LlmCall]:
    calls = []
    for s in spans:
        if span_kind(s) != "llm":
            continue
        a = s.attributes
        messages = _indexed_messages(a, "gen_ai.prompt", "user") + _indexed_messages(a, "gen_ai.completion",
                                                                                       "assistant")
        if not messages:
            messages = _json_messages(a.get("gen_ai.input.messages", "[]"), "user") + \
                _json_messages(a.get("gen_ai.output.messages", "[]"), "assistant")
        inp = _int(a.get("gen_ai.usage.input_tokens", a.get("gen_ai.usage.prompt_tokens")))
        out = _int(a.get("gen_ai.usage.output_tokens", a.get("gen_ai.usage.completion_tokens")))
        model = str(a.get("gen_ai.request.model") or a.get("gen_ai.response.model") or "")
        calls.append(LlmCall(s.span_id, s.name, model, messages, inp, out))
    return calls


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


def version_order(resources_id: str) -> tuple[int, str]:
    v = parse_policy_version(resources_id)
    return (v if v is not None else -1, resources_id)


def reward_series(rows: list[list[Any]]) -> dict[str, Any]:
    """Rows of (resources id, mode, mean reward, count) -> chart data: one label per version, one line per mode."""
    versions = sorted({str(r[0]) for r in rows}, key=version_order)
    by_mode: dict[str, dict[str, float]] = {"train": {}, "val": {}}
    for resources_id, mode, mean, _n in rows:
        by_mode.setdefault(str(mode) or "train", {})[str(resources_id)] = float(mean)
    return {"labels": versions,
            "series": {mode: [values.get(v) for v in versions] for mode, values in by_mode.items()}}


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
