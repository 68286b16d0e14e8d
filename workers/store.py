"""The Store API: Agent Lightning 0.3's ``LightningStore`` methods, on the event log.

Writes are events on Kafka (``log_writer``); a write returns once the broker holds it and this store's replica of
the fold has folded it in log order (``rollout_replica``; one trip through the log), so ``enqueue_rollout``
followed by ``get_rollout_by_id`` finds the rollout. Reads come from the replica (which holds every unfinished
rollout and the newest ``store_keep_finished`` finished ones; older ones are read from ClickHouse:
``rollout_reads``), from live views of the derived topics (``streams/views.py``) and, for spans, from the window
of recent spans (``span_window``) or ClickHouse. Offers are read by ``offers``.

``update_rollout`` and ``update_attempt`` take the reference's contract, a finished rollout included: its own
status again is a no-op, another is taken, and the rollout follows its newest attempt (``streams/fold.py``).
``cancel_rollout`` (``litstream cancel``) is a status event, which keeps terminal states final, as the runners'
outcomes and the processor's timers do. Differences from the reference, on purpose: a span or sequence id for an
unknown rollout is an error; span duplicates are recognised within this store's own writes (any others collapse
in ClickHouse, see docs/sql.md).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any, Literal, TypeVar

from litstream.infra import clickhouse
from litstream.infra.settings import Settings
from litstream.schemas.events import (
    AttemptStarted,
    AttemptUpdated,
    AvroRolloutConfig,
    ResourcesPublished,
    RolloutEnqueued,
    RolloutSnapshot,
    RolloutStatusChanged,
    RolloutUpdated,
    SpanRecorded,
    WorkerObserved,
)
from litstream.schemas.models import (
    FINISHED,
    Attempt,
    AttemptedRollout,
    EnqueueRolloutRequest,
    LlmCallVersion,
    NamedResources,
    PaginatedResult,
    ResourcesUpdate,
    Rollout,
    RolloutConfig,
    RolloutLineage,
    Span,
    TrainedTriplet,
    TripletLineage,
    VersionLineage,
    Worker,
    new_attempt_id,
    new_resources_id,
    new_rollout_id,
)
from litstream.streams.claims import Claims
from litstream.streams.log_writer import LogWriter, StoreError
from litstream.streams.offers import OfferReader
from litstream.streams.resources import to_records
from litstream.streams.rollout_archive import RolloutArchive, RolloutFilter
from litstream.streams.rollout_replica import Folded
from litstream.streams.span_query import SpanQuery, newest_copies
from litstream.streams.span_window import SpanWindow
from litstream.streams.span_writer import SpanWriter
from litstream.streams.state import rollout_from_snapshot
from litstream.streams.views import ResourcesView, WorkersView
from litstream.streams.worker_fold import attempt_observations

from .rollout_reads import RolloutReads

log = logging.getLogger("litstream.store")
T = TypeVar("T")


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()
SortOrder = Literal["asc", "desc"]


class FieldError(ValueError):
    """A value of one named field the store refuses."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _sort_value(item: Any, sort_by: str) -> Any:
    """The reference's sort key: a missing ``*_time`` sorts as infinity (last ascending), any other missing value
    as its type's zero (``""``, 0, 0.0: first ascending)."""
    value = getattr(item, sort_by, None)
    if sort_by.endswith("_time"):
        return float("inf") if value is None else value
    if value is not None:
        return value
    fields = type(item).model_fields
    if sort_by not in fields:
        raise FieldError("sort_by", f"Failed to sort items by '{sort_by}': field does not exist on {type(item).__name__}")
    annotation = str(fields[sort_by].annotation)
    for marker, zero in (("str", ""), ("Literal", ""), ("int", 0), ("float", 0.0)):
        if marker in annotation:
            return zero
    raise FieldError("sort_by", f"Failed to sort items by '{sort_by}': unsupported field type {annotation!r}")


def check_limit(limit: int) -> None:
    if limit == 0 or limit < -1:
        raise FieldError("limit", "Limit must be greater than 0 or -1 for no limit")


def _paginate(items: list[Any], sort_by: str | None, sort_order: SortOrder, limit: int, offset: int) -> PaginatedResult[Any]:
    check_limit(limit)
    if sort_by:
        try:
            items = sorted(items, key=lambda x: _sort_value(x, sort_by), reverse=sort_order == "desc")
        except TypeError:
            raise FieldError("sort_by", f"cannot sort by {sort_by!r}: its values are not comparable (objects or "
                             "mixed types)") from None
    total = len(items)
    page = items[offset:] if limit < 0 else items[offset:offset + limit]
    return PaginatedResult(items=page, limit=limit, offset=offset, total=total)


def _attempt(snap: RolloutSnapshot, a: Any) -> Attempt:
    return Attempt(rollout_id=snap.rollout_id, attempt_id=a.attempt_id, sequence_id=a.sequence_id,
                   start_time=a.start_time, end_time=a.end_time, status=a.status, worker_id=a.worker_id,
                   last_heartbeat_time=a.last_heartbeat_time, metadata=a.metadata)




class LitStore:
    """Async, like the reference; safe to share between tasks of one event loop."""

    def __init__(self, settings: Settings, wait_s: float = 30.0) -> None:
        self.settings = settings
        self.wait_s = wait_s
        self.log = LogWriter(settings, wait_s, keep_finished=settings.store_keep_finished)
        self.events, self.codec = self.log.events, self.log.codec
        self.rollouts = self.log.rollouts  # answers this store's writes after one trip
        self.reads = RolloutReads(self.rollouts, RolloutArchive(settings))
        self.resources = ResourcesView(settings, self.codec)
        self.workers = WorkersView(settings, self.codec)
        # Workers are derived from attempts: every change the replica folds is shown here at once (the processor's
        # own observations of the same changes follow on the workers topic and change nothing).
        self.rollouts.on_fold(self._observe_attempts)
        self.offers = OfferReader(settings, self.codec, self.rollouts, on_undecodable=self.log.dead_letter)
        self.log.on_enqueued = self.offers.enqueued_here
        self.rollouts.on_own_offer(self.offers.offered_here)  # a requeue here is on offer here at once, too
        self.claims = Claims(self.log, self.offers)
        self.spans = SpanWriter(settings, self.log)
        self.span_window = SpanWindow(settings, self.codec, self.rollouts)
        self._started = time.time()

    @property
    def capabilities(self) -> dict[str, bool]:
        return {"thread_safe": True, "async_safe": True, "zero_copy": True, "otlp_traces": False}

    async def close(self) -> None:
        self.spans.flush_beats()
        self.spans.sink.close()
        self.span_window.close()
        self.reads.archive.close()
        for view in (self.resources, self.workers):
            view.close()
        await self.offers.close()
        await self.log.close()

    async def wait_until_ready(self, timeout: float = 30.0) -> None:
        """Let the views read what is already on their topics."""
        for view in (self.rollouts, self.resources, self.workers):
            await asyncio.to_thread(view.caught_up, timeout)

    # -- writing through the log ---------------------------------------------------------------------------

    async def _known(self, rollout_id: str) -> RolloutSnapshot:
        """The rollout's snapshot; an unknown rollout is the caller's error."""
        snap = await self.reads.snapshot(rollout_id)
        if snap is None:
            raise ValueError(f"Rollout {rollout_id} not found")
        return snap

    def _observe_attempts(self, done: Folded) -> None:
        if done.after is not None and done.after.attempts:
            at = done.after.updated_ns / 1e9
            self.workers.observe(attempt_observations(done.before, done.after, at, self.events.factory.stamp))

    @staticmethod
    def _accepted(done: Folded) -> RolloutSnapshot:
        if not done.accepted or done.snapshot is None:
            raise ValueError(done.reason or "rejected")
        return done.snapshot

    def _latest_resources_id(self) -> str | None:
        return self.resources.state.latest_id

    def _enqueue_event(self, input: Any, mode: Any, resources_id: str | None, config: RolloutConfig | None,
                       metadata: dict[str, Any] | None, **start: Any) -> RolloutEnqueued:
        return RolloutEnqueued.new(self.events.factory, new_rollout_id(), input, mode=mode, config=config,
                                   resources_id=resources_id or self._latest_resources_id(),  # the latest, pinned
                                   metadata=metadata, **start)

    # -- rollouts ------------------------------------------------------------------------------------------

    async def enqueue_rollout(self, input: Any, mode: Any = None, resources_id: str | None = None,
                              config: RolloutConfig | None = None, metadata: dict[str, Any] | None = None) -> Rollout:
        (rollout,) = await self._enqueue([self._enqueue_event(input, mode, resources_id, config, metadata)])
        return rollout

    async def enqueue_many_rollouts(self, rollouts: Sequence[EnqueueRolloutRequest]) -> list[Rollout]:
        return await self._enqueue([self._enqueue_event(r.input, r.mode, r.resources_id, r.config, r.metadata)
                                    for r in rollouts])

    async def _enqueue(self, events: list[RolloutEnqueued]) -> list[Rollout]:
        """Enqueue new rollouts; returns once the broker holds them and the replica has folded them (nothing can
        refuse a new id). A processor that is down delays the offer, not the enqueue."""
        futures = self.log.send_lifecycle(events)
        return [rollout_from_snapshot(self._accepted(done)) for done in await self.log.outcomes(futures, events)]

    async def start_rollout(self, input: Any, mode: Any = None, resources_id: str | None = None,
                            config: RolloutConfig | None = None, metadata: dict[str, Any] | None = None,
                            worker_id: str | None = None) -> AttemptedRollout:
        event = self._enqueue_event(input, mode, resources_id, config, metadata, start_attempt_id=new_attempt_id(),
                                    worker_id=worker_id)
        result = rollout_from_snapshot(self._accepted(await self.log.write(event)))
        assert isinstance(result, AttemptedRollout)
        return result

    async def start_attempt(self, rollout_id: str, worker_id: str | None = None) -> AttemptedRollout:
        snap = await self._known(rollout_id)
        event = AttemptStarted(meta=self.events.factory.meta(rollout_id), attempt_id=new_attempt_id(),
                               sequence_id=len(snap.attempts) + 1, start_time=time.time(), worker_id=worker_id,
                               force=True)
        result = rollout_from_snapshot(self._accepted(await self.log.write(event)))
        assert isinstance(result, AttemptedRollout)
        return result

    async def dequeue_rollout(self, worker_id: str | None = None) -> AttemptedRollout | None:
        got = await self.dequeue_many_rollouts(limit=1, worker_id=worker_id)
        return got[0] if got else None

    async def dequeue_many_rollouts(self, *, limit: int = 1, worker_id: str | None = None) -> list[AttemptedRollout]:
        """Non-blocking: claim up to ``limit`` rollouts on offer, oldest first (``claims.Claims``); stale offers
        are skipped. Concurrent calls take offers one at a time and their claims travel side by side."""
        out = [rollout_from_snapshot(snap) for snap in await self.claims.claim(limit, worker_id)]
        if not out and worker_id is not None:
            await self._observe_worker(worker_id, "empty_dequeue")
        return [r for r in out if isinstance(r, AttemptedRollout)]

    async def update_rollout(self, rollout_id: str, input: Any = UNSET, mode: Any = UNSET, resources_id: Any = UNSET,
                             status: Any = UNSET, config: Any = UNSET, metadata: Any = UNSET) -> Rollout:
        await self._known(rollout_id)
        given = {"input": input, "mode": mode, "resources_id": resources_id, "status": status, "config": config,
                 "metadata": metadata}
        fields = {k: v for k, v in given.items() if v is not UNSET}
        if "status" in fields and fields["status"] is None:
            raise ValueError("status cannot be null")
        if "config" in fields:
            if fields["config"] is None:
                raise ValueError("config cannot be null")
            cfg = fields["config"]
            fields["config"] = AvroRolloutConfig(**(cfg.model_dump() if isinstance(cfg, RolloutConfig) else cfg))
        event = RolloutUpdated(meta=self.events.factory.meta(rollout_id), time=time.time(), set_fields=list(fields),
                               **fields)
        return rollout_from_snapshot(self._accepted(await self.log.write(event)))

    async def cancel_rollout(self, rollout_id: str) -> Rollout:
        """Cancel a rollout that is not finished (``litstream cancel``). A status event: a finished rollout keeps
        its outcome (ValueError, terminal states are final), where ``update_rollout`` would take the new status."""
        await self._known(rollout_id)
        event = RolloutStatusChanged(meta=self.events.factory.meta(rollout_id), status="cancelled", time=time.time())
        return rollout_from_snapshot(self._accepted(await self.log.write(event)))

    async def update_attempt(self, rollout_id: str, attempt_id: str, status: Any = UNSET, worker_id: Any = UNSET,
                             last_heartbeat_time: Any = UNSET, metadata: Any = UNSET) -> Attempt:
        snap = await self._known(rollout_id)
        if not snap.attempts:
            raise ValueError(f"No attempts found for rollout {rollout_id}")
        target = snap.attempts[-1].attempt_id if attempt_id == "latest" else attempt_id
        if all(a.attempt_id != target for a in snap.attempts):
            raise ValueError(f"Attempt {attempt_id} not found for rollout {rollout_id}")
        given = {"status": status, "worker_id": worker_id, "last_heartbeat_time": last_heartbeat_time,
                 "metadata": metadata}
        fields = {k: v for k, v in given.items() if v is not UNSET}
        if "status" in fields and fields["status"] is None:
            raise ValueError("status cannot be null")
        event = AttemptUpdated(meta=self.events.factory.meta(rollout_id), attempt_id=target, time=time.time(),
                               set_fields=list(fields), **fields)
        after = self._accepted(await self.log.write(event))
        return next(_attempt(after, a) for a in after.attempts if a.attempt_id == target)

    async def query_rollouts(self, *, status_in: Sequence[str] | None = None,
                             rollout_id_in: Sequence[str] | None = None, rollout_id_contains: str | None = None,
                             filter_logic: Literal["and", "or"] = "and", sort_by: str | None = None,
                             sort_order: SortOrder = "asc", limit: int = -1, offset: int = 0,
                             status: Sequence[str] | None = None,
                             rollout_ids: Sequence[str] | None = None) -> PaginatedResult[Any]:
        status_in = status_in if status_in is not None else status  # the reference's deprecated aliases
        rollout_id_in = rollout_id_in if rollout_id_in is not None else rollout_ids
        check_limit(limit)
        f = RolloutFilter.of(status_in, rollout_id_in, rollout_id_contains, filter_logic)

        def paginate(rollouts: list[Rollout]) -> tuple[int, list[Rollout]]:
            page = _paginate(rollouts, sort_by, sort_order, limit, offset)
            return page.total, list(page.items)

        total, items = await self.reads.page(f, sort_by, sort_order == "desc", limit, offset, paginate)
        return PaginatedResult(items=items, limit=limit, offset=offset, total=total)

    async def get_rollout_by_id(self, rollout_id: str) -> Rollout | None:
        snap = await self.reads.snapshot(rollout_id)
        return rollout_from_snapshot(snap) if snap is not None else None

    async def get_latest_attempt(self, rollout_id: str) -> Attempt | None:
        snap = await self.reads.snapshot(rollout_id)
        return _attempt(snap, snap.attempts[-1]) if snap is not None and snap.attempts else None

    async def query_attempts(self, rollout_id: str, *, sort_by: str = "sequence_id", sort_order: SortOrder = "asc",
                             limit: int = -1, offset: int = 0) -> PaginatedResult[Attempt]:
        snap = await self.reads.snapshot(rollout_id)
        attempts = [_attempt(snap, a) for a in snap.attempts] if snap is not None else []
        return _paginate(attempts, sort_by, sort_order, limit, offset)

    async def wait_for_rollouts(self, *, rollout_ids: list[str], timeout: float | None = None) -> list[Rollout]:
        """The rollouts among ``rollout_ids`` that are finished when they all are or the time is up."""
        stored = await self.reads.stored(rollout_ids)  # finished long ago: the replica let go of them

        def snapshot(rid: str) -> RolloutSnapshot | None:
            return self.rollouts.snapshots.get(rid) or stored.get(rid)

        def done() -> list[Rollout]:
            return [rollout_from_snapshot(s) for rid in rollout_ids
                    if (s := snapshot(rid)) is not None and s.status in FINISHED]

        def finished() -> list[Rollout] | None:
            ended, known = done(), [rid for rid in rollout_ids if snapshot(rid) is not None]
            return ended if len(ended) == len(known) and known else None

        if timeout is not None and timeout <= 0:
            return done()
        result = await self.log.until(self.rollouts, finished, timeout if timeout is not None else 1e9)
        return result if result is not None else done()

    # -- spans (streams/span_writer.py) ------------------------------------------------------------------

    async def add_span(self, span: Span) -> Span | None:
        return await self.spans.add_span(span)

    async def add_many_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Record spans; each counts as a heartbeat of its attempt. Returns those not already added."""
        return await self.spans.add_many_spans(spans)

    async def add_span_records(self, records: Sequence[dict[str, Any]]) -> int:
        """:meth:`SpanWriter.add_span_records`: spans an ingest edge (OTLP) built as Avro records itself."""
        return await self.spans.add_span_records(records)

    # -- span sequence ids ------------------------------------------------------------------------

    async def get_next_span_sequence_id(self, rollout_id: str, attempt_id: str) -> int:
        return (await self.get_many_span_sequence_ids([(rollout_id, attempt_id)]))[0]

    async def get_many_span_sequence_ids(self, rollout_attempt_ids: Sequence[tuple[str, str]]) -> list[int]:
        """Ids are reserved through the rollout's partition, so they are strictly increasing per rollout in the
        order they are handed out, whichever process asks. A run of requests for one rollout is one reservation."""
        runs: list[tuple[str, str, int]] = []
        for rid, aid in rollout_attempt_ids:
            await self._known(rid)
            if runs and runs[-1][0] == rid:
                runs[-1] = (rid, runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((rid, aid, 1))
        self.spans.before_reserving([(rid, aid) for rid, aid, _ in runs])
        ids: list[int] = []
        for first, (_, _, n) in zip(await self.log.reserve(runs), runs):
            ids.extend(range(first, first + n))
        return ids

    async def query_spans(self, rollout_id: str, attempt_id: str | None = None, *, trace_id: str | None = None,
                          trace_id_contains: str | None = None, span_id: str | None = None,
                          span_id_contains: str | None = None, parent_id: str | None = None,
                          parent_id_contains: str | None = None, name: str | None = None,
                          name_contains: str | None = None, filter_logic: Literal["and", "or"] = "and",
                          limit: int = -1, offset: int = 0, sort_by: str = "sequence_id",
                          sort_order: SortOrder = "asc") -> PaginatedResult[Span]:
        """Spans of a rollout (and attempt, or ``"latest"``), with this store's writes: from the window of recent
        spans for a rollout begun while the store runs (``span_window``), else from ClickHouse once the sink has
        them. The rollout and attempt always apply; the other filters combine with ``filter_logic``."""
        if attempt_id == "latest":
            latest = await self.get_latest_attempt(rollout_id)
            if latest is None:
                return PaginatedResult(items=[], limit=limit, offset=offset, total=0)
            attempt_id = latest.attempt_id
        q = SpanQuery.of(rollout_id, attempt_id, filter_logic, TraceId=(trace_id, trace_id_contains),
                         SpanId=(span_id, span_id_contains), ParentSpanId=(parent_id, parent_id_contains),
                         SpanName=(name, name_contains))

        def read() -> list[Span]:  # one trip off the event loop: the window, or the sink's table
            recent = self.span_window.spans(q, self.spans.sink.wanted(rollout_id))
            if recent is not None:
                return [span_from_record(s) for s in recent]
            self.spans.wait_for_sink(rollout_id)
            sql, parameters = q.sql()
            # Through the chDB owner (the span sink), never by opening the directory from this process.
            res = clickhouse.query(self.settings.resolved_clickhouse_dsn, sql, may_open=False, wait_s=10.0,
                                   parameters=parameters)
            return [span_from_record(SpanRecorded.model_validate_json(raw)) for raw in newest_copies(res.rows)]

        return _paginate(await asyncio.to_thread(read), sort_by, sort_order, limit, offset)

    # -- lineage (ClickHouse's views, docs/history.md) -------------------------------------------------------

    async def version_lineage(self, version: int) -> VersionLineage:
        """What trained policy ``version``: its triplets by task, each with the version that generated it."""
        rows = await self._lineage_sql(
            "SELECT group_id, rollout_id, attempt_id, `index`, generated_by, staleness, reward FROM version_data "
            "WHERE version = {version:UInt32} ORDER BY group_id, rollout_id, attempt_id, `index`", {"version": version})
        tasks: dict[str, list[TrainedTriplet]] = {}
        for group, rid, aid, index, generated_by, staleness, reward in rows:
            tasks.setdefault(str(group), []).append(TrainedTriplet(
                rollout_id=rid, attempt_id=aid, index=index, generated_by=generated_by, staleness=staleness,
                reward=reward))
        return VersionLineage(version=version, triplets=len(rows), tasks=tasks)

    async def rollout_lineage(self, rollout_id: str) -> RolloutLineage:
        """The version that served each LLM call of ``rollout_id``, and the versions its triplets went into."""
        calls = await self._lineage_sql(
            "SELECT attempt_id, sequence_id, span_name, served_by FROM llm_call_versions "
            "WHERE rollout_id = {rollout_id:String} ORDER BY sequence_id", {"rollout_id": rollout_id})
        triplets = await self._lineage_sql(
            "SELECT attempt_id, `index`, generated_by, reward, trained_into FROM triplet_versions "
            "WHERE rollout_id = {rollout_id:String} ORDER BY attempt_id, `index`", {"rollout_id": rollout_id})
        return RolloutLineage(
            rollout_id=rollout_id,
            calls=[LlmCallVersion(attempt_id=a, sequence_id=s, span_name=n, served_by=v) for a, s, n, v in calls],
            triplets=[TripletLineage(attempt_id=a, index=i, generated_by=g, reward=r, trained_into=list(t))
                      for a, i, g, r, t in triplets])

    async def _lineage_sql(self, sql: str, parameters: clickhouse.Parameters) -> list[list[Any]]:
        res = await asyncio.to_thread(clickhouse.query, self.settings.resolved_clickhouse_dsn, sql, may_open=False,
                                      wait_s=10.0, parameters=parameters)
        return [list(r) for r in res.rows]

    # -- resources -----------------------------------------------------------------------------------------

    async def add_resources(self, resources: NamedResources) -> ResourcesUpdate:
        return await self.update_resources(new_resources_id(), resources)

    async def update_resources(self, resources_id: str, resources: NamedResources) -> ResourcesUpdate:
        now = time.time()
        event = ResourcesPublished(**self.events.factory.stamp(), resources_id=resources_id, version=1,
                                   create_time=now, update_time=now, resources=to_records(resources))
        seen = await self.log.until(self.resources, lambda: True if event.event_id in self.resources.seen_events else None,
                                 self.wait_s, sent=(self.events.topics.resources, event))
        if seen is None:
            raise StoreError("the resources topic did not return the update in time")
        return self.resources.state.by_id[resources_id]

    async def get_latest_resources(self) -> ResourcesUpdate | None:
        return self.resources.state.latest

    async def get_resources_by_id(self, resources_id: str) -> ResourcesUpdate | None:
        return self.resources.state.by_id.get(resources_id)

    async def query_resources(self, *, resources_id: str | None = None, resources_id_contains: str | None = None,
                              sort_by: str | None = None, sort_order: SortOrder = "asc", limit: int = -1,
                              offset: int = 0) -> PaginatedResult[ResourcesUpdate]:
        items = [r for r in self.resources.state.by_id.values()
                 if (resources_id is None or r.resources_id == resources_id)
                 and (resources_id_contains is None or resources_id_contains in r.resources_id)]
        return _paginate(items, sort_by, sort_order, limit, offset)

    # -- workers -------------------------------------------------------------------------------------------

    async def _observe_worker(self, worker_id: str, kind: Literal["empty_dequeue", "heartbeat"],
                              stats: dict[str, Any] | None = None) -> WorkerObserved:
        event = WorkerObserved(**self.events.factory.stamp(), worker_id=worker_id, time=time.time(), kind=kind,
                               heartbeat_stats=stats)
        acked, report = self.log.acks(1)
        self.events.send(self.events.topics.workers, event, on_delivery=report)
        await self.log.acknowledged(acked, "the worker's record")
        self.workers.observe([event], written=True)  # stored: shown at once, not after reading it back
        return event

    async def update_worker(self, worker_id: str, heartbeat_stats: Any = UNSET) -> Worker:
        await self._observe_worker(worker_id, "heartbeat", None if heartbeat_stats is UNSET else heartbeat_stats)
        return self.workers.workers[worker_id]

    async def get_worker_by_id(self, worker_id: str) -> Worker | None:
        return self.workers.workers.get(worker_id)

    async def query_workers(self, *, status_in: Sequence[str] | None = None, worker_id_contains: str | None = None,
                            filter_logic: Literal["and", "or"] = "and", sort_by: str | None = None,
                            sort_order: SortOrder = "asc", limit: int = -1, offset: int = 0) -> PaginatedResult[Worker]:
        tests = []
        if status_in is not None:
            tests.append(lambda w: w.status in status_in)
        if worker_id_contains is not None:
            tests.append(lambda w: worker_id_contains in w.worker_id)
        combine = all if filter_logic == "and" else any
        items = [w for w in self.workers.workers.values() if not tests or combine(t(w) for t in tests)]
        return _paginate(items, sort_by, sort_order, limit, offset)

    async def statistics(self) -> dict[str, Any]:
        """The reference's statistics; ``total_spans`` and ``total_span_bytes`` count the spans ClickHouse holds
        (each once, however often it was delivered), ``None`` while the span sink does not answer."""
        rollouts, attempts = self.reads.totals()
        spans, span_bytes = await self._span_totals()
        return {"name": "LitStore", "total_rollouts": rollouts, "total_attempts": attempts,
                "total_spans": spans, "total_span_bytes": span_bytes,
                "total_resources": len(self.resources.state.by_id), "total_workers": len(self.workers.workers),
                "uptime": time.time() - self._started}

    async def _span_totals(self) -> tuple[int | None, int | None]:
        sql = "SELECT count(), sum(length(raw_json)) FROM spans FINAL"

        def stored() -> clickhouse.QueryResult:  # with this store's spans, as query_spans sees them
            self.spans.sink.wait_past(self.spans.sink.wanted_all(), "this store's spans", timeout=10.0)
            return clickhouse.query(self.settings.resolved_clickhouse_dsn, sql, may_open=False, wait_s=2.0)

        try:
            res = await asyncio.to_thread(stored)
        except Exception as exc:  # noqa: BLE001 (the sink restarting or a server away: say so, do not fail)
            log.warning("statistics: no span totals from ClickHouse: %s", str(exc).splitlines()[0][:300])
            return None, None
        count, size = res.rows[0]
        return int(count), int(size)


def span_from_record(s: SpanRecorded) -> Span:
    """A recorded span in the reference's shape (times in seconds)."""
    from litstream.schemas.models import Event as SpanEvent
    from litstream.schemas.models import Link, OtelResource, SpanContext, TraceStatus

    return Span(
        rollout_id=s.rollout_id, attempt_id=s.attempt_id, sequence_id=s.sequence_id, trace_id=s.trace_id,
        span_id=s.span_id, parent_id=s.parent_id, name=s.name,
        status=TraceStatus(status_code=s.status_code, description=s.status_message),
        attributes=dict(s.attributes),
        events=[SpanEvent(name=e.name, attributes=dict(e.attributes),
                          timestamp=None if e.timestamp_ns is None else e.timestamp_ns / 1e9) for e in s.events],
        links=[Link(context=SpanContext(trace_id=ln.trace_id, span_id=ln.span_id), attributes=dict(ln.attributes))
               for ln in s.links],
        start_time=s.start_time_ns / 1e9, end_time=None if s.end_time_ns is None else s.end_time_ns / 1e9,
        context=SpanContext(trace_id=s.trace_id, span_id=s.span_id), parent=None,
        resource=OtelResource(attributes=dict(s.resource.attributes), schema_url=s.resource.schema_url),
    )


__all__ = ["FieldError", "LitStore", "UNSET", "StoreError", "span_from_record"]
