"""The reference's span query (``query_spans``): a rollout, an attempt, and filters on the trace id, span id, parent
id and name (each exact or contained) combined with ``and`` or ``or``. Written once, and answered two ways: as SQL
for ClickHouse's ``spans`` table, and as a test of a decoded span for the gateway's window of recent spans
(``span_window``), so both give the same spans."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from litstream.schemas.events import SpanRecorded

# The table's column -> the span's field, for each filter.
FILTER_FIELDS = {"TraceId": "trace_id", "SpanId": "span_id", "ParentSpanId": "parent_id", "SpanName": "name"}
Parameters = dict[str, str | int | float | list[str]]


@dataclass(frozen=True)
class SpanQuery:
    rollout_id: str
    attempt_id: str | None = None
    logic: Literal["and", "or"] = "and"
    filters: tuple[tuple[str, str | None, str | None], ...] = ()  # (column, exact, contained), given ones only

    @classmethod
    def of(cls, rollout_id: str, attempt_id: str | None, logic: Literal["and", "or"],
           **columns: tuple[str | None, str | None]) -> SpanQuery:
        """``columns``: ``column=(exact, contained)`` for the columns of :data:`FILTER_FIELDS`."""
        unknown = set(columns) - set(FILTER_FIELDS)
        if unknown:
            raise ValueError(f"no span filter on {sorted(unknown)}")
        given = tuple((c, exact, has) for c, (exact, has) in columns.items() if exact is not None or has is not None)
        return cls(rollout_id, attempt_id, logic, given)

    def sql(self) -> tuple[str, Parameters]:
        """The statement, every value a bound parameter. Without FINAL (a third of the query's time): a span stored
        twice and not merged yet is read twice, and :func:`newest_copies` keeps the copy FINAL would keep."""
        parameters: Parameters = {"rollout_id": self.rollout_id}
        where = ["rollout_id = {rollout_id:String}"]
        if self.attempt_id is not None:
            parameters["attempt_id"] = self.attempt_id
            where.append("attempt_id = {attempt_id:String}")
        tests = []
        for column, exact, contained in self.filters:
            if exact is not None:
                parameters[f"{column}_is"] = exact
                tests.append(f"{column} = {{{column}_is:String}}")
            if contained is not None:
                parameters[f"{column}_has"] = contained
                tests.append(f"position({column}, {{{column}_has:String}}) > 0")
        if tests:
            where.append("(" + f" {self.logic.upper()} ".join(tests) + ")")
        return (f"SELECT raw_json, attempt_id, sequence_id, SpanId, ingested_ns FROM spans WHERE {' AND '.join(where)} "
                "ORDER BY sequence_id, ingested_ns"), parameters

    def matches(self, span: SpanRecorded) -> bool:
        """The same test of one span (a missing parent id is the table's empty string)."""
        if span.rollout_id != self.rollout_id or (self.attempt_id is not None and span.attempt_id != self.attempt_id):
            return False
        tests = []
        for column, exact, contained in self.filters:
            value = getattr(span, FILTER_FIELDS[column]) or ""
            if exact is not None:
                tests.append(value == exact)
            if contained is not None:
                tests.append(contained in value)
        if not tests:
            return True
        return all(tests) if self.logic == "and" else any(tests)


def newest_copies(rows: Iterable[list[Any]]) -> list[str]:
    """The raw JSON of each span once: of rows ordered by ``ingested_ns`` within a sequence id, the last copy."""
    newest: dict[tuple[str, int, str], str] = {}
    for raw, attempt_id, sequence_id, span_id, _ in rows:
        newest[(attempt_id, sequence_id, span_id)] = raw
    return list(newest.values())
