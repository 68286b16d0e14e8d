"""The rollouts a replica no longer holds, read from ClickHouse's ``rollouts`` table.

The sink stores every snapshot the lifecycle processor publishes on ``rollout-state`` there (the newest version
kept per rollout). A store's replica holds every unfinished rollout and the newest ``store_keep_finished`` finished
ones; the rollouts it let go of are finished, and read from here when asked for. A rollout is let go of thousands
of finished rollouts after its own end, long after the sink stored its last snapshot, except while a restarted
store catches up with the log (maybe ahead of a restarted sink): so before its first read the archive waits for
the sink to have stored what ``rollout-state`` held at that moment.

:class:`RolloutFilter` is the reference's rollout query (status, ids, an id substring, combined with ``and`` or
``or``), applied to a snapshot in memory and written as SQL for the table, so both sources answer alike.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from litstream.infra import clickhouse
from litstream.infra.kafka import topic_ends
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.events import RolloutSnapshot
from litstream.schemas.models import FINISHED

from .sink_progress import SinkProgress

# Fields a page of rollouts can be sorted by in SQL (the table's columns); others sort in memory, after reading
# every matching rollout.
SQL_SORTED = frozenset({"rollout_id", "status", "start_time", "end_time", "mode", "resources_id"})
READ_WAIT_S = 10.0  # for the chDB owner (the sink) to answer
# (the sort field's value as the reference sorts it, start time, rollout id): rollouts with equal values keep the
# order they began in, as the reference's stable sort keeps its insertion order, ascending or descending.
SortKey = tuple[Any, float, str]


@dataclass(frozen=True)
class RolloutFilter:
    """Which rollouts a query wants; no test given: every rollout."""

    status_in: frozenset[str] | None = None
    rollout_id_in: frozenset[str] | None = None
    rollout_id_contains: str | None = None
    logic: Literal["and", "or"] = "and"

    @classmethod
    def of(cls, status_in: Sequence[str] | None, rollout_id_in: Sequence[str] | None,
           rollout_id_contains: str | None, logic: Literal["and", "or"]) -> RolloutFilter:
        return cls(None if status_in is None else frozenset(status_in),
                   None if rollout_id_in is None else frozenset(rollout_id_in), rollout_id_contains, logic)

    def matches(self, snap: RolloutSnapshot) -> bool:
        tests = []
        if self.status_in is not None:
            tests.append(snap.status in self.status_in)
        if self.rollout_id_in is not None:
            tests.append(snap.rollout_id in self.rollout_id_in)
        if self.rollout_id_contains is not None:
            tests.append(self.rollout_id_contains in snap.rollout_id)
        if not tests:
            return True
        return all(tests) if self.logic == "and" else any(tests)

    def sql(self) -> tuple[str, dict[str, Any]]:
        """The same test as a WHERE clause, with its parameters."""
        tests: list[str] = []
        params: dict[str, Any] = {}
        if self.status_in is not None:
            tests.append("status IN {status_in:Array(String)}")
            params["status_in"] = sorted(self.status_in)
        if self.rollout_id_in is not None:
            tests.append("rollout_id IN {rollout_id_in:Array(String)}")
            params["rollout_id_in"] = sorted(self.rollout_id_in)
        if self.rollout_id_contains is not None:
            tests.append("position(rollout_id, {contains:String}) > 0")
            params["contains"] = self.rollout_id_contains
        if not tests:
            return "1", params
        return "(" + f" {self.logic.upper()} ".join(tests) + ")", params


@dataclass(frozen=True)
class LetGo:
    """The stored rollouts a replica let go of: finished, last changed at or before ``until_ns`` (the newest it let
    go of), but for the ``held`` ones (finished near that line, or let go of and held again), which it answers for.
    Said this way, the query names a handful of ids, never all the replica holds."""

    until_ns: int
    held: frozenset[str]

    def sql(self) -> tuple[str, dict[str, Any]]:
        where = "status IN {finished:Array(String)} AND updated_ns <= {until_ns:UInt64}"
        params: dict[str, Any] = {"finished": sorted(FINISHED), "until_ns": self.until_ns}
        if self.held:
            where += " AND rollout_id NOT IN {held:Array(String)}"
            params["held"] = sorted(self.held)
        return where, params


def sort_key_sql(sort_by: str | None) -> str:
    """The ORDER BY expression of a field the reference sorts by: a missing time last ascending (infinity)."""
    if sort_by is None:
        return "start_time"
    if sort_by not in SQL_SORTED:
        raise ValueError(f"{sort_by!r} is not a column of the rollouts table")
    return f"ifNull({sort_by}, inf)" if sort_by == "end_time" else sort_by


def sort_value(sort_by: str | None, value: Any) -> Any:
    """A column's value as the reference sorts it: a missing time as infinity, any other as ``""``."""
    if value is None:
        return float("inf") if sort_by is None or sort_by.endswith("_time") else ""
    return value


class RolloutArchive:
    """Reads of the ``rollouts`` table through the chDB owner, never opening its directory here."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = Topics(settings.topic_prefix).state
        self._progress = SinkProgress(settings, self.topic)
        self._ready = False
        self._lock = threading.Lock()

    def snapshots(self, rollout_ids: Iterable[str]) -> dict[str, RolloutSnapshot]:
        """The stored snapshots of these rollouts (those it has)."""
        ids = sorted(set(rollout_ids))
        if not ids:
            return {}
        rows = self._rows("SELECT raw_json FROM rollouts FINAL WHERE rollout_id IN {ids:Array(String)}", {"ids": ids})
        return {s.rollout_id: s for s in (RolloutSnapshot.model_validate_json(r[0]) for r in rows)}

    def matching(self, f: RolloutFilter, let_go: LetGo) -> list[RolloutSnapshot]:
        """Every rollout let go of that ``f`` matches."""
        where, params = self._where(f, let_go)
        rows = self._rows(f"SELECT raw_json FROM rollouts FINAL WHERE {where} ORDER BY start_time, rollout_id",
                          params)
        return [RolloutSnapshot.model_validate_json(r[0]) for r in rows]

    def first_keys(self, f: RolloutFilter, let_go: LetGo, sort_by: str | None, descending: bool,
                   n: int | None) -> tuple[int, list[SortKey]]:
        """How many rollouts let go of ``f`` matches, and the sort keys of the first ``n`` of them (all when ``n``
        is None), in order: what a page needs before it reads any rollout whole."""
        where, params = self._where(f, let_go)
        column = sort_by or "start_time"
        direction = " DESC" if descending else ""
        limit = "" if n is None else f" LIMIT {int(n)}"
        rows = self._rows(f"SELECT {column}, start_time, rollout_id, count() OVER () FROM rollouts FINAL WHERE {where} "
                          f"ORDER BY {sort_key_sql(sort_by)}{direction}, start_time, rollout_id{limit}", params)
        total = int(rows[0][3]) if rows else 0  # the limit is at least 1: no row, no match
        return total, [(sort_value(sort_by, r[0]), float(r[1]), str(r[2])) for r in rows]

    def close(self) -> None:
        self._progress.close()

    def _where(self, f: RolloutFilter, let_go: LetGo) -> tuple[str, dict[str, Any]]:
        where, params = f.sql()
        scope, more = let_go.sql()
        return f"{where} AND {scope}", {**params, **more}

    def _rows(self, sql: str, params: dict[str, Any]) -> list[list[Any]]:
        self._wait_ready()
        return clickhouse.query(self.settings.resolved_clickhouse_dsn, sql, may_open=False, wait_s=READ_WAIT_S,
                                parameters=params).rows

    def _wait_ready(self) -> None:
        """Once: wait for the sink to store what ``rollout-state`` holds now (SinkNotCaughtUp if it does not)."""
        with self._lock:
            if self._ready:
                return
            ends = topic_ends(self.settings, self.topic)
            self._progress.wait_past({p: end - 1 for p, end in ends.items() if end > 0}, "the rollouts' snapshots",
                                     timeout=30.0)
            self._ready = True
