"""The triplet processor: spans + rollout state -> ``triplets``, one batch of Kafka messages at a time.

It reads ``spans`` and ``rollout-state`` in one consumer group (``<prefix>-triplets``); both are keyed by rollout
id with the same partition count, and the range assignor gives one member the same partition numbers of both, so
a rollout's spans and snapshots meet in one process. When an attempt ends (rules in ``triplet_buffer.py``), its
spans go through the adapter (``triplet_adapter.py``) and each usable triplet becomes a ``TripletEmitted`` keyed
by its group id. Everything else is reported on ``triplets.dlq`` and counted in the health beat (role
``triplets``): attempts with no usable triplet (with the reason), late spans, attempts over the buffer caps,
undecodable or misplaced messages.

At-least-once: offsets are committed after the triplets and dead letters are on Kafka, and never past what a
buffered attempt still needs (see ``Collector.commit_points``). A triplet's ``event_id`` is derived from
``(rollout_id, attempt_id, index)``, so a triplet produced again after a restart is recognisably the same.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from typing import Any, TypeAlias

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from litstream.infra import health
from litstream.infra.kafka import consumer
from litstream.infra.metrics import StatSeries
from litstream.infra.producer import EventProducer
from litstream.infra.service import Service
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import DecodeError
from litstream.schemas.events import EventMeta, RolloutSnapshot, SpanRecorded, TripletEmitted
from litstream.schemas.policy_versions import parse_policy_version

from .consume_loop import ConsumeLoop, Fetch, Offsets, Partition, Record, Work
from .deadletter import DeadLetter, DeadLetters, Rejected
from .triplet_adapter import AdaptResult, TraceAdapter, TracerTraceToTriplet, Triplet, trace_spans
from .triplet_buffer import Attempt, Collector, Limits, Notice

log = logging.getLogger("litstream.triplets")
ROLE = "triplets"
BEAT_EVERY_S = 1.0


def triplet_event_id(rollout_id: str, attempt_id: str, index: int) -> str:
    return hashlib.sha256(f"triplet\0{rollout_id}\0{attempt_id}\0{index}".encode()).hexdigest()[:32]


def group_id_of(snapshot: RolloutSnapshot | None, rollout_id: str) -> str:
    """The rollout's ``metadata["group_id"]``, else a hash of its input: rollouts of one task group together."""
    if snapshot is None:
        return f"rollout-{rollout_id}"
    explicit = snapshot.metadata.get("group_id")
    if explicit not in (None, ""):
        return str(explicit)
    canonical = json.dumps(snapshot.input, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return "task-" + hashlib.sha256(canonical.encode()).hexdigest()[:32]


def _reason_kind(reason: str) -> str:
    return reason.split(":")[0].split(" among")[0].strip().replace(" ", "_")


Incoming: TypeAlias = SpanRecorded | RolloutSnapshot


class TripletProcessor(Work[Incoming]):
    """The processor's part of the consume loop (``consume_loop.py``): spans and snapshots fold into the
    collector, ended attempts become triplets, and the collector's commit points are what is durable."""

    def __init__(self, settings: Settings, adapter: TraceAdapter | None = None, limits: Limits | None = None,
                 poll_s: float = 0.2) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        # Calls without token ids are dropped before rewards are matched: a reward must land on a call that trains.
        self.adapter = adapter or TracerTraceToTriplet(skip_empty_token_spans=True)
        self.collector = Collector(limits)
        self.stats: dict[str, Any] = {"triplets": 0, "attempts": 0, "no_triplet": 0, "no_triplet_by_reason": {},
                                      "late_spans": 0, "over_cap": 0, "buffer_full": 0, "orphan": 0}
        self._orphans_checked_ms = 0
        self.events = EventProducer(settings, role=ROLE)
        c = consumer(settings, group_id=f"{settings.topic_prefix}-{ROLE}", **{
            "enable.partition.eof": True,
            "partition.assignment.strategy": "range",  # co-partitioned topics: same partition numbers together
        })
        dlq = self.topics.dlq(ROLE)
        self._dirty = False
        self._points: Offsets = {}
        self._warming: set[int] = set()  # spans partitions held until their state partition's map is rebuilt
        self.heartbeat = health.Heartbeat(settings.data_dir, ROLE, self.report, BEAT_EVERY_S)
        self.loop = ConsumeLoop(c, [self.topics.spans, self.topics.state], self,
                                DeadLetters(self.events, ROLE, route=lambda _: dlq), self.heartbeat,
                                Fetch(wait_s=poll_s), track_ends=True)
        self.stop_event = self.loop.stop_event

    def run(self) -> None:
        self.loop.run()

    def stop(self) -> None:
        self.loop.stop()

    def close(self) -> None:
        """After :meth:`run`: let the producer go (one kept past its broker retries it for ever)."""
        self.events.close()

    def report(self) -> Mapping[str, Any]:
        c, letters = self.collector, self.loop.letters
        return {**self.stats, **c.counts, "dead_letters": letters.seen, "decode_errors": letters.kinds["decode"],
                "commits": self.loop.commits, "buffered_attempts": len(c.pending), "buffered_spans": c.buffered_spans,
                "buffered_bytes": c.buffer_bytes}

    # -- the loop's Work --------------------------------------------------------------------------------------

    def assigned(self, c: Consumer, partitions: list[TopicPartition]) -> None:
        state = [tp for tp in partitions if tp.topic == self.topics.state]
        committed = {tp.partition: tp.offset for tp in c.committed(state, timeout=30)} if state else {}
        for tp in state:
            start = max(committed.get(tp.partition, -1), 0)
            self.collector.warm_until[tp.partition] = start
            if start > 0:  # rebuild the map of ended attempts from the beginning, acting only past `start`
                tp.offset = OFFSET_BEGINNING
                self._warming.add(tp.partition)

    def holding(self, assignment: frozenset[Partition]) -> frozenset[Partition]:
        self._warming = {p for p in self._warming if self.collector.warming(p)}
        return frozenset((self.topics.spans, p) for p in self._warming)

    def revoked(self, partitions: list[TopicPartition]) -> None:
        gone = {tp.partition for tp in partitions}
        self.collector.forget(gone)
        self._warming -= gone
        self._points = {k: v for k, v in self._points.items() if k[1] not in gone}

    def decode(self, msg: Message) -> Incoming:
        topic = str(msg.topic())
        try:
            record = self.events.codec.decode(msg.value() or b"")
        except DecodeError as exc:
            raise Rejected(exc.reason, "decode") from exc
        wanted = SpanRecorded if topic == self.topics.spans else RolloutSnapshot
        if not isinstance(record, wanted):
            raise Rejected(f"{type(record).__name__} does not belong on {topic}", "invalid")
        return record

    def apply(self, records: list[Record[Incoming]], read: Offsets) -> None:
        self._dirty |= bool(read)
        for r in records:
            if isinstance(r.decoded, SpanRecorded):
                for notice in self.collector.add_span(r.partition, r.offset, r.timestamp_ms, r.decoded, r.value):
                    self._notice(notice)
            else:
                self.collector.add_snapshot(r.partition, r.offset, r.timestamp_ms, r.decoded)
        self._finalize_ready()

    def durable(self, wait: bool) -> Offsets:
        """Triplets and dead letters on Kafka, then never past what a buffered attempt still needs."""
        if self._dirty:
            self.events.flush()
            spans, state = self.collector.commit_points()
            self._points = {**{(self.topics.spans, p): o for p, o in spans.items()},
                            **{(self.topics.state, p): o for p, o in state.items()}}
            self._dirty = False
        return self._points

    # -- finalizing -----------------------------------------------------------------------------------------

    def _finalize_ready(self) -> None:
        now_ms = int(time.time() * 1000)
        for partition in sorted({a.partition for a in self.collector.pending.values()}):
            for attempt in self.collector.ready(partition, now_ms, self._spans_read_to_end(partition)):
                self._finalize(attempt)
                self._dirty = True
        if now_ms - self._orphans_checked_ms >= 5000:
            self._orphans_checked_ms = now_ms
            for attempt in self.collector.orphans(now_ms):
                limit_s = self.collector.limits.orphan_after_ms / 1000
                self._notice(Notice("orphan", f"spans of an attempt no rollout snapshot named within {limit_s:.0f}s "
                                              "(unknown rollout or attempt id): let go", attempt))
                self.collector.finalized(attempt)
                self._dirty = True

    def _spans_read_to_end(self, partition: int) -> bool:
        """Whether every span the broker held at the latest fetch has been handled. The end-of-partition event
        comes once, when the end is reached, and the flag stays raised while nothing new is delivered: spans
        appended since (before a snapshot this process has already read) may still sit unfetched or in the
        client's queue behind other partitions. So the flag is checked against the high-water mark of the latest
        fetch response, which for a partition fetched with that snapshot counts those spans. The flags are dropped
        with every revoke and assign: after a lost session the partition comes back at its committed offset, and a
        flag from before would finalize attempts whose spans are not fetched yet (seen under load)."""
        ends = self.loop.ends[self.topics.spans]
        if partition not in ends.at_end:
            return False
        tp = TopicPartition(self.topics.spans, partition)
        _, high = self.loop.consumer.get_watermark_offsets(tp, cached=True)
        if high < 0:  # no fetch response seen for it yet: only the end-of-partition event to go by
            return True
        [pos] = self.loop.consumer.position([tp])
        # No record consumed under this assignment yet: the end-of-partition event's offset is the position.
        position = pos.offset if pos.offset >= 0 else ends.eof_offset.get(partition, -1)
        return position >= high

    def _finalize(self, attempt: Attempt) -> None:
        on_time, late = attempt.split()
        for b in late:
            self._notice(Notice("late_span", "late span: written after its attempt ended", attempt, b))
        self.stats["attempts"] += 1
        if attempt.dropped is None:
            result = self.adapter.adapt(trace_spans([b.span for b in on_time]))
            if result.reason is not None:
                self._no_triplet(attempt, result, len(on_time))
            else:
                for index, triplet in enumerate(result.usable):
                    self.events.send(self.topics.triplets, self._triplet(attempt, index, triplet,
                                                                         len(result.usable)))
                self.stats["triplets"] += len(result.usable)
        self.collector.finalized(attempt)

    def _triplet(self, attempt: Attempt, index: int, t: Triplet, calls: int) -> TripletEmitted:
        """The ``index``-th of the attempt's ``calls`` usable triplets (a trainer joining turns waits for all)."""
        snap = attempt.snapshot
        resources_id = t.resources_id or (snap.resources_id if snap is not None else None)
        generated_by = t.metadata.get("policy_version")
        version = generated_by if isinstance(generated_by, int) else parse_policy_version(resources_id)
        status = next((a.status for a in snap.attempts if a.attempt_id == attempt.attempt_id), None) if snap else None
        metadata: dict[str, Any] = {**t.metadata, "span_id": t.span_id, "sequence_id": t.sequence_id,
                                    "attempt_status": status, "prompt_messages": t.prompt_raw,
                                    "response_messages": t.response_raw, "calls": calls}
        if t.image_urls:
            metadata["image_urls"] = t.image_urls
        meta = EventMeta(event_id=triplet_event_id(attempt.rollout_id, attempt.attempt_id, index),
                         rollout_id=attempt.rollout_id, producer_id=self.events.producer_id,
                         producer_seq=self.events.factory.next_seq(), timestamp_ns=time.time_ns(),
                         run_id=self.events.factory.run_id)
        return TripletEmitted(meta=meta, attempt_id=attempt.attempt_id, group_id=group_id_of(snap, attempt.rollout_id),
                              index=index, policy_version=str(version) if version is not None else None,
                              resources_id=resources_id, prompt_token_ids=t.prompt_token_ids,
                              response_token_ids=t.response_token_ids, response_logprobs=t.response_logprobs,
                              prompt_text=t.prompt_text, response_text=t.response_text, reward=t.reward,
                              metadata=metadata)

    # -- reports --------------------------------------------------------------------------------------------

    def _no_triplet(self, attempt: Attempt, result: AdaptResult, spans: int) -> None:
        reason = result.reason or "no usable triplet"
        kind = _reason_kind(reason)
        self.stats["no_triplet"] += 1
        self.stats["no_triplet_by_reason"][kind] = self.stats["no_triplet_by_reason"].get(kind, 0) + 1
        body = {"rollout_id": attempt.rollout_id, "attempt_id": attempt.attempt_id, "reason": reason, "spans": spans,
                "llm_calls": result.llm_calls, "reward_spans": result.reward_spans}
        self._attempt_letter(attempt, f"no usable triplet: {reason}", "no_triplet", json.dumps(body).encode())

    def _notice(self, n: Notice) -> None:
        self.stats["late_spans" if n.kind == "late_span" else n.kind] += 1
        if n.span is not None:
            a = n.attempt
            letter = DeadLetter(self.topics.spans, a.partition, n.span.offset, a.rollout_id.encode(), n.span.raw,
                                n.reason, ROLE, n.kind)
            self._letter(letter, n.attempt)
            return
        body = {"rollout_id": n.attempt.rollout_id, "attempt_id": n.attempt.attempt_id, "reason": n.reason}
        self._attempt_letter(n.attempt, n.reason, n.kind, json.dumps(body).encode())

    def _attempt_letter(self, a: Attempt, reason: str, kind: str, value: bytes) -> None:
        offset = a.first_offset if a.first_offset is not None else -1
        self._letter(DeadLetter(self.topics.spans, a.partition, offset, a.rollout_id.encode(), value, reason, ROLE,
                                kind), a)

    def _letter(self, letter: DeadLetter, attempt: Attempt) -> None:
        self.loop.letters.send(letter, [("litstream.rollout_id", attempt.rollout_id.encode()),
                                        ("litstream.attempt_id", attempt.attempt_id.encode())])


TRIPLET_SERIES = {
    "triplets": StatSeries("litstream_triplets", "Triplets emitted"),
    "attempts": StatSeries("litstream_triplet_attempts", "Finished attempts turned into triplets (or not)"),
    "no_triplet": StatSeries("litstream_triplet_attempts_empty", "Finished attempts that gave no usable triplet"),
    "late_spans": StatSeries("litstream_triplet_late_spans", "Spans that arrived after their attempt was finalized"),
}


def run(settings: Settings) -> None:
    """Run the processor in the foreground until SIGINT/SIGTERM."""
    Service(settings, ROLE, TRIPLET_SERIES).run(start_triplets)


def start_triplets(settings: Settings) -> TripletProcessor:
    processor = TripletProcessor(settings)
    log.info("triplet processor: %s + %s -> %s", processor.topics.spans, processor.topics.state,
             processor.topics.triplets)
    return processor
