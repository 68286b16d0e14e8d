"""The store's spans: checked and encoded at the call, produced with the heartbeat their attempt needs
(``span_beats``; a beat that starts or revives the attempt is waited for, as the reference's ``add_span`` returns
with the attempt running), and read-your-writes through the span sink's committed offsets."""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from litstream.infra.settings import Settings
from litstream.schemas.events import (
    AttemptHeartbeat,
    ResourceRecord,
    RolloutSnapshot,
    SpanEventRecord,
    SpanLinkRecord,
    SpanRecorded,
)
from litstream.schemas.models import Span

from .log_writer import LogWriter, StoreError, also
from .rollout_replica import Folded
from .sink_progress import SinkNotCaughtUp, SinkProgress
from .span_beats import SPAN_HEARTBEAT_EVERY_S, SpanBeats

_SpanKey = tuple[str, str, str]  # rollout id, attempt id, span id
MAX_OWN_SPAN_KEYS = 50_000  # spans written here, remembered to recognise their duplicates (a client's retries)


def span_beat_urgent(snap: RolloutSnapshot | None, attempt_id: str) -> bool:
    """Whether spans just written need their ``AttemptHeartbeat`` now rather than within the throttle's second
    (``span_beats``), because it changes what readers see (pure): the attempt is not running yet (the beat starts
    or revives it). A beat that only moves the counter past ids the spans chose themselves waits: it goes out
    before this store's next reservation of ids for the attempt when the counter is not past them
    (:meth:`SpanWriter.before_reserving`), or within the second."""
    attempt = None if snap is None else next((a for a in snap.attempts if a.attempt_id == attempt_id), None)
    return attempt is None or attempt.status != "running"


def span_heartbeat_shows(snap: RolloutSnapshot | None, attempt_id: str) -> bool:
    """Whether a span's heartbeat changes what readers see of its attempt (pure): it starts a preparing attempt,
    revives an unresponsive one (see the fold), or records the attempt's first heartbeat. The span call then
    returns once that is folded, so the attempt reads as the reference's does right after ``add_span``; other
    beats only keep the timers off and are not waited for."""
    attempt = None if snap is None else next((a for a in snap.attempts if a.attempt_id == attempt_id), None)
    return (attempt is None or attempt.status in ("preparing", "unresponsive")
            or attempt.last_heartbeat_time is None)


class SpanWriter:
    def __init__(self, settings: Settings, log: LogWriter) -> None:
        self.settings = settings
        self.log = log
        self.events, self.codec, self.rollouts = log.events, log.codec, log.rollouts
        self._span_keys: OrderedDict[_SpanKey, None] = OrderedDict()  # own writes, bounded
        self.sink = SinkProgress(settings, log.events.topics.spans)  # where this store's spans are, stored or not
        self._span_beats = SpanBeats()
        self._flush_scheduled = False

    def _span_event(self, span: Span) -> SpanRecorded:
        def ns(t: float | None) -> int | None:
            return None if t is None else int(round(t * 1e9))

        return SpanRecorded(
            meta=self.events.factory.meta(span.rollout_id), attempt_id=span.attempt_id,
            sequence_id=span.sequence_id, trace_id=span.trace_id, span_id=span.span_id, parent_id=span.parent_id,
            name=span.name, status_code=span.status.status_code, status_message=span.status.description,
            start_time_ns=ns(span.start_time) or 0, end_time_ns=ns(span.end_time),
            attributes=dict(span.attributes),  # type: ignore[arg-type]
            events=[SpanEventRecord(name=e.name, timestamp_ns=ns(e.timestamp), attributes=dict(e.attributes))  # type: ignore[arg-type]
                    for e in span.events],
            links=[SpanLinkRecord(trace_id=ln.context.trace_id, span_id=ln.context.span_id,
                                  attributes=dict(ln.attributes or {})) for ln in span.links],  # type: ignore[arg-type]
            resource=ResourceRecord(attributes=dict(span.resource.attributes),  # type: ignore[arg-type]
                                    schema_url=span.resource.schema_url),
            resources_id=(self.rollouts.snapshots[span.rollout_id].resources_id
                          if span.rollout_id in self.rollouts.snapshots else None),
        )

    def _on_span_delivered(self, err: Any, msg: Any) -> None:
        if err is None:
            self.sink.written(msg.key().decode(), int(msg.partition()), int(msg.offset()))

    async def add_span(self, span: Span) -> Span | None:
        added = await self.add_many_spans([span])
        return added[0] if added else None

    async def add_many_spans(self, spans: Sequence[Span]) -> list[Span]:
        """Record spans; each counts as a heartbeat of its attempt. Returns those not already added."""
        batch: list[tuple[_SpanKey, int, bytes, Span]] = []
        seen: set[_SpanKey] = set()
        for span in spans:  # check and encode the whole batch first: a bad span must not leave it half written
            key = self._new_span(span.rollout_id, span.attempt_id, span.span_id, seen)
            if key is not None:
                batch.append((key, span.sequence_id, self.codec.encode(self._span_event(span)), span))
        await self._write_spans([(key, seq, value) for key, seq, value, _ in batch])
        return [span for *_, span in batch]

    async def add_span_records(self, records: Sequence[dict[str, Any]]) -> int:
        """:meth:`add_many_spans` for an ingest edge that builds SpanRecorded Avro records itself (OTLP), checked
        there: each record without ``meta`` (added here), its rollout id in ``rollout_id``. Returns how many were
        new."""
        batch: list[tuple[_SpanKey, int, bytes]] = []
        seen: set[_SpanKey] = set()
        for rec in records:
            rid = rec.pop("rollout_id")
            key = self._new_span(rid, rec["attempt_id"], rec["span_id"], seen)
            if key is None:
                continue
            batch.append((key, rec["sequence_id"], self.codec.encode_record(SpanRecorded.avro_name,
                                                                             self._span_wire_record(rid, rec))))
        await self._write_spans(batch)
        return len(batch)

    def _span_wire_record(self, rollout_id: str, rec: dict[str, Any]) -> dict[str, Any]:
        """The record with this store's meta and the rollout's resources (a new dict: the caller's parts, e.g. one
        resource shared by every span of a request, are only read)."""
        snap = self.rollouts.snapshots.get(rollout_id)
        return {"meta": self.events.factory.meta_record(rollout_id), **rec,
                "resources_id": snap.resources_id if snap is not None else None}

    def _new_span(self, rollout_id: str, attempt_id: str, span_id: str, seen: set[_SpanKey]) -> _SpanKey | None:
        """The span's key, or None for a duplicate of one this store wrote; an unknown attempt is an error."""
        snap = self.rollouts.known(rollout_id)
        if all(a.attempt_id != attempt_id for a in snap.attempts):
            raise ValueError(f"Attempt {attempt_id} not found for rollout {rollout_id}")
        key = (rollout_id, attempt_id, span_id)
        if key in self._span_keys or key in seen:
            return None
        seen.add(key)
        return key

    async def _write_spans(self, batch: list[tuple[_SpanKey, int, bytes]]) -> None:
        """Produce encoded spans, and a heartbeat (carrying the counter) for each attempt whose beat is due;
        returns once the broker acknowledged them all."""
        top: dict[tuple[str, str], int] = {}
        for (rid, aid, _), seq, _value in batch:
            top[(rid, aid)] = max(top.get((rid, aid), 0), seq)
        beats: dict[tuple[str, str], int | None] = {}
        for (rid, aid), seq in top.items():
            self._span_beats.spans(rid, aid, seq)
            urgent = span_beat_urgent(self.rollouts.snapshots.get(rid), aid)
            if (due := self._span_beats.due_for(rid, aid, urgent)) is not None:
                beats[(rid, aid)] = due.max_sequence_id
        acked, report = self.log.acks(len(batch) + len(beats))

        def span_report(err: Any, msg: Any) -> None:
            self._on_span_delivered(err, msg)
            report(err, msg)

        for (rid, _, _), _seq, value in batch:
            self.events.produce_raw(self.events.topics.spans, rid.encode(), value, on_delivery=span_report)
        shown: list[tuple[AttemptHeartbeat, Future[Folded]]] = []
        for (rid, aid), max_seq in beats.items():
            beat = AttemptHeartbeat(meta=self.events.factory.meta(rid), attempt_id=aid, time=time.time(),
                                    max_sequence_id=max_seq)
            fut = None
            if span_heartbeat_shows(self.rollouts.snapshots.get(rid), aid):
                fut = self.rollouts.expect(beat.meta.event_id)
                shown.append((beat, fut))
            self.events.send(self.events.topics.rollout_events, beat,
                             on_delivery=also(report, self.log.lifecycle_report(beat, fut)))
        if len(beats) < len(top):
            self._flush_held_later()
        await self.log.acknowledged(acked, "the spans")
        for beat, fut in shown:  # read-your-writes of the attempt a span started or revived
            await self.log.outcome(fut, beat)
        for key, _, _ in batch:  # only spans on Kafka count as added: a failed call can be retried
            self._span_keys[key] = None
        while len(self._span_keys) > MAX_OWN_SPAN_KEYS:
            self._span_keys.popitem(last=False)

    def before_reserving(self, attempts: Sequence[tuple[str, str]]) -> None:
        """Send the beats held back for these attempts whose spans used ids the rollout's counter is not past (ids
        the spans chose themselves) before ids are reserved for them: produced first to the same partition, they
        are folded first, so the reservation starts past every id their spans used. Spans that used reserved ids
        leave the counter past them already (this store's replica folded those reservations): their beat keeps its
        throttle, so an agent that reserves an id per span adds no event per span."""
        for rid, aid in attempts:
            snap = self.rollouts.snapshots.get(rid)
            due = self._span_beats.due_before_reserving(rid, aid, None if snap is None else snap.next_sequence_id)
            if due is not None:
                self._send_beat(rid, aid, due.max_sequence_id)

    def _flush_held_later(self) -> None:
        """A held-back beat goes out within the throttle's second even when no span follows it."""
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(SPAN_HEARTBEAT_EVERY_S, self._flush_held)

    def _flush_held(self) -> None:
        self._flush_scheduled = False
        for due in self._span_beats.due():
            self._send_beat(due.rollout_id, due.attempt_id, due.max_sequence_id)
        if self._span_beats.pending():
            self._flush_held_later()

    def flush_beats(self) -> None:
        """Send every beat still held back (the store is closing; its producer is flushed next)."""
        for due in self._span_beats.due(force=True):
            self._send_beat(due.rollout_id, due.attempt_id, due.max_sequence_id)

    def _send_beat(self, rid: str, aid: str, max_sequence_id: int | None) -> None:
        beat = AttemptHeartbeat(meta=self.events.factory.meta(rid), attempt_id=aid, time=time.time(),
                                max_sequence_id=max_sequence_id)
        self.events.send(self.events.topics.rollout_events, beat, on_delivery=self.log.lifecycle_report(beat, None))

    def wait_for_sink(self, rollout_id: str, timeout: float = 30.0) -> None:
        """Read-your-writes for spans: wait until the sink has stored this store's spans of ``rollout_id``."""
        try:
            self.sink.wait(rollout_id, timeout)
        except SinkNotCaughtUp as exc:
            raise StoreError(f"{exc}; is it running? (litstream status)") from None
