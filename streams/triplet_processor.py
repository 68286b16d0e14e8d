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
import threading
import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, TopicPartition

from litstream.infra import health, metrics
from litstream.infra.kafka import PartitionEnds, commit_sync, consumer, poll_batch
from litstream.infra.metrics import StatSeries
from litstream.infra.producer import EventProducer
from litstream.infra.service import Service
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import DecodeError
from litstream.schemas.events import EventMeta, RolloutSnapshot, SpanRecorded, TripletEmitted
from litstream.schemas.policy_versions import parse_policy_version

from .deadletter import DeadLetter
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


class TripletProcessor:
    def __init__(self, settings: Settings, adapter: TraceAdapter | None = None, limits: Limits | None = None,
                 poll_s: float = 0.2) -> None:
        self.settings = settings
        self.topics = Topics(settings.topic_prefix)
        # Calls without token ids are dropped before rewards are matched: a reward must land on a call that trains.
        self.adapter = adapter or TracerTraceToTriplet(skip_empty_token_spans=True)
        self.collector = Collector(limits)
        self.poll_s = poll_s
        self.stop_event = threading.Event()
        self.stats: dict[str, Any] = {"triplets": 0, "attempts": 0, "no_triplet": 0, "no_triplet_by_reason": {},
                                      "late_spans": 0, "over_cap": 0, "buffer_full": 0, "orphan": 0,
                                      "decode_errors": 0, "dead_letters": 0, "commits": 0}
        self._orphans_checked_ms = 0
        self.events = EventProducer(settings, role=ROLE)
        self._consumer: Consumer = consumer(settings, group_id=f"{settings.topic_prefix}-{ROLE}", **{
            "enable.partition.eof": True,
            "partition.assignment.strategy": "range",  # co-partitioned topics: same partition numbers together
        })
        self._ends = {self.topics.spans: PartitionEnds(), self.topics.state: PartitionEnds()}
        self._committed: dict[tuple[str, int], int] = {}
        self._dirty = False
        self._assigned = False
        self._paused: set[int] = set()
        self.heartbeat = health.Heartbeat(settings.data_dir, ROLE, self.report, BEAT_EVERY_S)

    # -- partitions -----------------------------------------------------------------------------------------

    def _forget_ends(self, partitions: list[TopicPartition]) -> None:
        """An end reached under an earlier assignment says nothing about this one (see ``_spans_read_to_end``)."""
        for topic, ends in self._ends.items():
            ends.forget(tp.partition for tp in partitions if tp.topic == topic)

    def _on_assign(self, c: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget_ends(partitions)
        state = [tp for tp in partitions if tp.topic == self.topics.state]
        committed = {tp.partition: tp.offset for tp in c.committed(state, timeout=30)} if state else {}
        warm: list[TopicPartition] = []
        for tp in partitions:
            if tp.topic == self.topics.state:
                start = max(committed.get(tp.partition, -1), 0)
                self.collector.warm_until[tp.partition] = start
                if start > 0:  # rebuild the map of ended attempts from the beginning, acting only past `start`
                    tp.offset = OFFSET_BEGINNING
                    warm.append(TopicPartition(self.topics.spans, tp.partition))
        c.assign(partitions)
        if warm:
            c.pause(warm)  # spans wait until their state partition's map is rebuilt
            self._paused |= {tp.partition for tp in warm}
        self._assigned = True
        log.info("assigned %s", sorted((tp.topic.rsplit(".", 1)[-1], tp.partition) for tp in partitions))

    def _on_revoke(self, c: Consumer, partitions: list[TopicPartition]) -> None:
        self._flush_and_commit()
        self.collector.forget({tp.partition for tp in partitions})
        self._forget_ends(partitions)
        self._paused -= {tp.partition for tp in partitions}
        self._committed = {k: v for k, v in self._committed.items() if k[1] not in {tp.partition for tp in partitions}}

    # -- the loop -------------------------------------------------------------------------------------------

    def run(self) -> None:
        self._consumer.subscribe([self.topics.spans, self.topics.state], on_assign=self._on_assign,
                                 on_revoke=self._on_revoke)
        try:
            while not self.stop_event.is_set():
                for msg in poll_batch(self._consumer, self.poll_s):
                    self._handle(msg)
                self._finalize_ready()
                if self._dirty:
                    self._flush_and_commit()
                if self._assigned:  # beats say the partitions are being read
                    self.heartbeat.tick()
        finally:
            try:
                self._flush_and_commit()
            finally:
                self._consumer.close()

    def stop(self) -> None:
        self.stop_event.set()

    def report(self) -> Mapping[str, Any]:
        c = self.collector
        return {**self.stats, **c.counts, "buffered_attempts": len(c.pending), "buffered_spans": c.buffered_spans,
                "buffered_bytes": c.buffer_bytes}

    def _handle(self, msg: Message) -> None:
        topic, partition = str(msg.topic()), int(msg.partition() or 0)
        err = msg.error()
        if err is not None and err.code() != KafkaError._PARTITION_EOF:
            log.warning("consume error: %s", err)
            return
        if not self._ends[topic].record(msg):
            if topic == self.topics.state and not self.collector.warming(partition):
                self._resume_spans(partition)
            return
        offset, value = int(msg.offset() or 0), msg.value() or b""
        ts_ms = int(msg.timestamp()[1])
        self._dirty = True
        try:
            record = self.events.codec.decode(value)
        except DecodeError as exc:
            self._letter(DeadLetter(topic, partition, offset, msg.key(), value, exc.reason, ROLE, "decode"))
            self.stats["decode_errors"] += 1
            return
        if topic == self.topics.spans and isinstance(record, SpanRecorded):
            for notice in self.collector.add_span(partition, offset, ts_ms, record, value):
                self._notice(notice)
        elif topic == self.topics.state and isinstance(record, RolloutSnapshot):
            self.collector.add_snapshot(partition, offset, ts_ms, record)
            if not self.collector.warming(partition):
                self._resume_spans(partition)
        else:
            self._letter(DeadLetter(topic, partition, offset, msg.key(), value,
                                    f"{type(record).__name__} does not belong on {topic}", ROLE, "invalid"))

    def _resume_spans(self, partition: int) -> None:
        if partition in self._paused:
            self._paused.discard(partition)
            self._consumer.resume([TopicPartition(self.topics.spans, partition)])

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
        ends = self._ends[self.topics.spans]
        if partition not in ends.at_end:
            return False
        tp = TopicPartition(self.topics.spans, partition)
        _, high = self._consumer.get_watermark_offsets(tp, cached=True)
        if high < 0:  # no fetch response seen for it yet: only the end-of-partition event to go by
            return True
        [pos] = self._consumer.position([tp])
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
                    self.events.send(self.topics.triplets, self._triplet(attempt, index, triplet))
                self.stats["triplets"] += len(result.usable)
        self.collector.finalized(attempt)

    def _triplet(self, attempt: Attempt, index: int, t: Triplet) -> TripletEmitted:
        snap = attempt.snapshot
        resources_id = t.resources_id or (snap.resources_id if snap is not None else None)
        generated_by = t.metadata.get("policy_version")
        version = generated_by if isinstance(generated_by, int) else parse_policy_version(resources_id)
        status = next((a.status for a in snap.attempts if a.attempt_id == attempt.attempt_id), None) if snap else None
        metadata: dict[str, Any] = {**t.metadata, "span_id": t.span_id, "sequence_id": t.sequence_id,
                                    "attempt_status": status, "prompt_messages": t.prompt_raw,
                                    "response_messages": t.response_raw}
        if t.image_urls:
            metadata["image_urls"] = t.image_urls
        meta = EventMeta(event_id=triplet_event_id(attempt.rollout_id, attempt.attempt_id, index),
                         rollout_id=attempt.rollout_id, producer_id=self.events.producer_id,
                         producer_seq=self.events.factory.next_seq(), timestamp_ns=time.time_ns())
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

    def _letter(self, letter: DeadLetter, attempt: Attempt | None = None) -> None:
        self.stats["dead_letters"] += 1
        metrics.record_dead_letter(ROLE, letter.source_topic, letter.error_type)
        log.warning("dead letter (%s) %s[%d]@%d: %s", letter.error_type, letter.source_topic, letter.partition,
                    letter.offset, letter.reason)
        headers = letter.headers()
        if attempt is not None:
            headers += [("litstream.rollout_id", attempt.rollout_id.encode()),
                        ("litstream.attempt_id", attempt.attempt_id.encode())]
        self.events.produce_raw(self.topics.dlq(ROLE), letter.key, letter.value, headers=headers)

    # -- commits --------------------------------------------------------------------------------------------

    def _flush_and_commit(self) -> None:
        self.events.flush()  # triplets and dead letters are on Kafka before any offset moves
        spans, state = self.collector.commit_points()
        offsets = [TopicPartition(self.topics.spans, p, o) for p, o in spans.items()]
        offsets += [TopicPartition(self.topics.state, p, o) for p, o in state.items()]
        changed = [tp for tp in offsets if self._committed.get((tp.topic, tp.partition)) != tp.offset]
        if changed and commit_sync(self._consumer, changed):
            self._committed.update({(tp.topic, tp.partition): tp.offset for tp in changed})
            self.stats["commits"] += 1
        self._dirty = False


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
