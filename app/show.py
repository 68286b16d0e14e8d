"""What `litstream rollout show`, `litstream cancel` and `litstream dlq tail` read and print (the CLI's edges)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.tree import Tree

from litstream.infra.clickhouse import QueryResult
from litstream.infra.kafka import headers_dict, read_to_end
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import DecodeError, default_codec
from litstream.schemas.events import RolloutSnapshot
from litstream.streams.trace_tree import TraceSpan, TraceTree

ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,200}$")
SPAN_SQL = ("SELECT attempt_id, SpanId, ParentSpanId, SpanName, toUnixTimestamp64Nano(Timestamp), Duration, "
            "StatusCode, reward, sequence_id FROM spans FINAL WHERE rollout_id = {rid:String} "
            "ORDER BY attempt_id, sequence_id")


def table(*columns: str, title: str | None = None) -> Table:
    """A table whose cells wrap (never cut with an ellipsis) at any terminal width."""
    t = Table(title=title)
    for c in columns:
        t.add_column(c, overflow="fold")
    return t


def check_id(value: str, what: str = "rollout id") -> str:
    if not ID_PATTERN.match(value):
        raise ValueError(f"{value!r} is not a {what} (letters, digits and . _ : - only, as `litstream rollouts` "
                         "lists them)")
    return value


def _when(t: float | None) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S") if t else ""


def attempts_table(snap: RolloutSnapshot) -> Table:
    out = table("attempt", "#", "status", "worker", "started", "ended", "error", title="attempts")
    for a in snap.attempts:
        out.add_row(a.attempt_id, str(a.sequence_id), a.status, a.worker_id or "", _when(a.start_time),
                    _when(a.end_time), escape(a.error or ""))
    return out


def span_trees(rows: list[list[Any]]) -> dict[str, TraceTree]:
    """One tree per attempt from rows of :data:`SPAN_SQL`."""
    spans: dict[str, list[TraceSpan]] = {}
    for attempt, span_id, parent, name, start, duration, status, reward, seq in rows:
        attrs = {"status": status, **({"reward": reward} if reward is not None else {})}
        spans.setdefault(attempt, []).append(TraceSpan(span_id=span_id, parent_id=parent or None, name=name,
                                                       start=int(start), end=int(start) + int(duration),
                                                       attributes=attrs, sequence_id=int(seq)))
    return {attempt: TraceTree.from_spans(group) for attempt, group in spans.items()}


def _tree_label(node: TraceTree) -> str:
    ms = (node.end - node.start) / 1e6
    reward = node.span.attributes.get("reward")
    status = node.span.attributes.get("status")
    extra = (f" [bold green]reward {reward:g}[/]" if reward is not None else "") + \
        (f" [red]{escape(str(status))}[/]" if status not in (None, "", "Unset", "Ok") else "")
    return f"{escape(node.span.name)} [dim]{ms:.1f} ms[/]{extra}"


def _add(branch: Tree, node: TraceTree) -> None:
    for child in node.children:
        _add(branch.add(_tree_label(child)), child)


def print_rollout(console: Console, snap: RolloutSnapshot, spans: QueryResult | None, note: str = "") -> None:
    console.print(f"[bold]{escape(snap.rollout_id)}[/]: {snap.status}, mode {snap.mode or '-'}, resources "
                  f"{snap.resources_id or '-'}, started {_when(snap.start_time)}"
                  + (f", ended {_when(snap.end_time)}" if snap.end_time else ""))
    console.print(f"input: {escape(json.dumps(snap.input, default=str)[:500])}")
    console.print(attempts_table(snap))
    if spans is None:
        console.print(f"[yellow]spans not shown:[/] {escape(note)}")
        return
    trees = span_trees(spans.rows)
    rewards = [r[7] for r in spans.rows if r[7] is not None]
    console.print(f"{len(spans.rows)} spans; rewards: {', '.join(f'{r:g}' for r in rewards) or 'none'}")
    for attempt, tree in trees.items():
        root = Tree(f"[bold]attempt {escape(attempt)}[/]")
        _add(root.add(_tree_label(tree)), tree)
        console.print(root)


def cancel_rollout(settings: Settings, rollout_id: str) -> str:
    """Ask the lifecycle processor to cancel a rollout; its status afterwards, or ValueError with its reason."""
    from litstream.workers.store import LitStore

    async def run() -> str:
        store = LitStore(settings, wait_s=15.0)
        try:
            await store.wait_until_ready(timeout=15.0)
            rollout = await store.cancel_rollout(rollout_id)  # a finished rollout stays as it ended
            return str(rollout.status)
        finally:
            await store.close()

    return asyncio.run(run())


@dataclass(frozen=True)
class DeadLetterView:
    topic: str
    partition: int
    offset: int
    headers: dict[str, str]
    event: str

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset, **self.headers,
                "event": self.event}


def dead_letter_topics(settings: Settings, which: str | None) -> list[str]:
    from litstream.infra.topics import physical_topics

    names = [t.name for t in physical_topics(settings) if t.name.endswith(".dlq")]
    if which is None:
        return names
    wanted = [n for n in names if n == which or n == f"{Topics(settings.topic_prefix).prefix}.{which}.dlq"]
    if not wanted:
        raise ValueError(f"no dead-letter topic {which!r}; choose one of {', '.join(names)}")
    return wanted


def _decode(value: bytes | None, decode: Callable[[bytes | None], Any]) -> str:
    """The event as ``TypeName {json}``, or what made it undecodable and its first bytes."""
    try:
        event = decode(value)
        return f"{type(event).__name__} {event.model_dump_json()}"
    except (DecodeError, ValueError, TypeError, AttributeError) as exc:
        raw = (value or b"")[:300]
        return f"(undecodable: {exc}) {raw!r}"


def dead_letters(settings: Settings, topics: list[str]) -> Iterator[DeadLetterView]:
    codec = default_codec(settings.schema_registry_url)
    for topic in topics:
        for msg in read_to_end(settings, topic, timeout=30.0):
            headers = {k.removeprefix("litstream.dlq."): v.decode(errors="replace")
                       for k, v in headers_dict(msg).items()}
            yield DeadLetterView(topic, int(msg.partition() or 0), int(msg.offset() or 0), headers,
                                 _decode(msg.value(), codec.decode))
