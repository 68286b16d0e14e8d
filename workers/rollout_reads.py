"""The store's reads of rollouts: from its replica, and from ClickHouse for the finished rollouts the replica let
go of (``streams/rollout_archive.py``). While the replica has let go of none, every read is the replica's alone.

A page of ``query_rollouts`` over both reads the sort keys of the first ``offset + limit`` stored rollouts the
replica does not hold, merges them with the replica's matching rollouts, and reads whole only the stored rollouts
on the page. Without ``sort_by`` the stored rollouts come first (by start time), then the replica's in the order it
learned of them. A ``sort_by`` that is not a column of the table (a metadata key, the input) reads every match.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from litstream.schemas.events import RolloutSnapshot
from litstream.schemas.models import FINISHED, Rollout
from litstream.streams.rollout_archive import (
    SQL_SORTED,
    LetGo,
    RolloutArchive,
    RolloutFilter,
    SortKey,
    sort_value,
)
from litstream.streams.rollout_replica import RolloutReplica
from litstream.streams.state import rollout_from_snapshot

Page = tuple[int, list[Rollout]]  # (total, the page's rollouts in order)
Paginate = Callable[[list[Rollout]], Page]  # the reference's sort and page in memory


class RolloutReads:
    def __init__(self, replica: RolloutReplica, archive: RolloutArchive) -> None:
        self.replica, self.archive = replica, archive

    @property
    def partial(self) -> bool:
        """Whether the replica let go of finished rollouts (then some are read from the table)."""
        return self.replica.let_go > 0

    async def snapshot(self, rollout_id: str) -> RolloutSnapshot | None:
        snap = self.replica.snapshots.get(rollout_id)
        if snap is not None or not self.partial:
            return snap
        return (await asyncio.to_thread(self.archive.snapshots, [rollout_id])).get(rollout_id)

    async def stored(self, rollout_ids: Iterable[str]) -> dict[str, RolloutSnapshot]:
        """The snapshots of the rollouts among these that the replica does not hold (and the table does)."""
        missing = [rid for rid in rollout_ids if rid not in self.replica.snapshots]
        if not missing or not self.partial:
            return {}
        return await asyncio.to_thread(self.archive.snapshots, missing)

    def totals(self) -> tuple[int, int]:
        """(rollouts, attempts), the ones let go of included."""
        snaps = list(self.replica.snapshots.values())
        return (len(snaps) + self.replica.let_go,
                sum(len(s.attempts) for s in snaps) + self.replica.let_go_attempts)

    async def page(self, f: RolloutFilter, sort_by: str | None, descending: bool, limit: int, offset: int,
                   paginate: Paginate) -> Page:
        held = [s for s in list(self.replica.snapshots.values()) if f.matches(s)]
        if sort_by is not None and sort_by not in SQL_SORTED:  # not a column: every match, sorted in memory
            stored = await asyncio.to_thread(self.archive.matching, f, self._let_go()) if self.partial else []
            return paginate([rollout_from_snapshot(s) for s in stored + held])
        end = None if limit < 0 else offset + limit
        if not self.partial:  # sorted as snapshots: only the page is made into rollouts
            if sort_by is not None:
                held.sort(key=lambda s: sort_value(sort_by, getattr(s, sort_by)), reverse=descending)
            return len(held), [rollout_from_snapshot(s) for s in held[offset:end]]
        return await asyncio.to_thread(self._page_with_table, f, held, sort_by, descending, offset, end)

    def _let_go(self) -> LetGo:
        r = self.replica
        with r.changed:
            until = r.let_go_until_ns
            near = {rid for rid, s in r.snapshots.items() if s.status in FINISHED and s.updated_ns <= until}
            return LetGo(until, frozenset(near | r.recalled))

    def _page_with_table(self, f: RolloutFilter, held: list[RolloutSnapshot], sort_by: str | None,
                         descending: bool, offset: int, end: int | None) -> Page:
        stored_total, keys = self.archive.first_keys(f, self._let_go(), sort_by, descending, end)
        stored: list[tuple[SortKey, RolloutSnapshot | None]] = [(k, None) for k in keys]
        mine: list[tuple[SortKey, RolloutSnapshot | None]] = [
            ((sort_value(sort_by, getattr(s, sort_by or "start_time")), s.start_time, s.rollout_id), s) for s in held]
        if sort_by is None:
            order = stored + mine
        else:  # by start time, then (stable) by the field: ties keep the order they began in, either way
            order = sorted(sorted(stored + mine, key=lambda item: item[0][1:]), key=lambda item: item[0][0],
                           reverse=descending)
        chosen = order[offset:end]
        read = self.archive.snapshots(k[2] for k, s in chosen if s is None)
        page = [s if s is not None else read.get(k[2]) for k, s in chosen]
        return stored_total + len(held), [rollout_from_snapshot(s) for s in page if s is not None]
