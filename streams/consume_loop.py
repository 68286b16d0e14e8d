"""The one consume loop of the group consumers that make something durable from what they read (the span sink, the
triplet processor, the trainer): poll, decode, apply, dead-letter, commit once the work is durable, and pause the
partitions the work cannot take now.

A processor supplies a :class:`Work`: how a record decodes (:class:`Rejected` makes it a dead letter, with the
reason), what a turn's records do, and which offsets its output makes safe to commit. The loop owns the rest, the
same for every processor:

* **at-least-once**: dead letters are flushed and :meth:`Work.durable` is asked before each commit; only offsets
  it names are committed, so a process killed anywhere reads again from where its output ends. Reading a record
  twice must be harmless (tables collapse repeats, triplets have derived ids, the trainer seeks to its checkpoint);
* **pauses**: :meth:`Work.holding` names the partitions not to fetch now (all of them under backpressure, some
  while a state partition is rebuilt), applied again after every rebalance, whose pause flags librdkafka keeps or
  drops depending on where a partition went; a record that still comes from a held partition is put back;
* **rebalances**: before partitions go, what is durable is committed; each new assignment starts where
  :meth:`Work.assigned` says (by default the committed offsets), and ends of partitions seen under an earlier
  assignment are forgotten;
* **ends of partitions** (``enable.partition.eof``, ``track_ends``) are kept per topic in :attr:`ConsumeLoop.ends`.

Why one librdkafka loop rather than Faust agents: docs/architecture.md, "One consume loop".
"""

from __future__ import annotations

import logging
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from litstream.infra.health import Heartbeat
from litstream.infra.kafka import PartitionEnds, commit_sync, poll_batch

from .deadletter import DeadLetter, DeadLetters, Rejected

log = logging.getLogger("litstream.consume_loop")
T = TypeVar("T")
Partition = tuple[str, int]  # (topic, partition)
Offsets = dict[Partition, int]  # the next offset to read, per partition


@dataclass(slots=True)  # not frozen: a frozen dataclass is built ~4x slower, and one is built per record
class Record(Generic[T]):
    """A record as read, with what it decoded to."""

    topic: str
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes
    decoded: T


@dataclass(frozen=True)
class Fetch:
    """How a turn reads. ``fill``: wait up to ``wait_s`` for ``max_records`` (batches for a bulk insert); else wait
    up to ``wait_s`` for one record and take what else is already fetched (the least latency)."""

    max_records: int = 1000
    wait_s: float = 0.2
    fill: bool = False

    def __call__(self, c: Consumer) -> list[Message]:
        if self.fill:
            return c.consume(num_messages=self.max_records, timeout=self.wait_s)
        return poll_batch(c, self.wait_s, self.max_records)


class Work(ABC, Generic[T]):
    """What one processor adds to the loop. ``decode``, ``apply`` and ``durable`` are its own; the rest default
    to a consumer that starts from the committed offsets and never holds back."""

    @abstractmethod
    def decode(self, msg: Message) -> T:
        """The record's value as the processor works with it; raise :class:`Rejected` to dead-letter it."""

    @abstractmethod
    def apply(self, records: list[Record[T]], read: Offsets) -> None:
        """One turn's decoded records, in the order read; called every turn, with none when nothing came, so
        that work due by time (a timeout, an idle flush) happens too. ``read``: each partition's next offset past
        every record of the turn, the dead-lettered ones included (what a commit may cover once they are done)."""

    @abstractmethod
    def durable(self, wait: bool) -> Offsets:
        """Make what was applied durable (flush its output) and return the offsets safe to commit: past every record
        whose effect is stored. ``wait``: partitions are going or the loop stops, so finish what is in hand."""

    def holding(self, assignment: frozenset[Partition]) -> frozenset[Partition]:
        """The assigned partitions not to fetch now (backpressure: all of them)."""
        return frozenset()

    def assigned(self, c: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions about to be assigned: set a ``tp.offset`` to start elsewhere than the committed offset."""

    def revoked(self, partitions: list[TopicPartition]) -> None:
        """Partitions gone (their durable offsets already committed): drop what is held for them."""


class ConsumeLoop(Generic[T]):
    """Runs a :class:`Work` on a group consumer subscribed to ``topics`` until :meth:`stop`; closes the consumer."""

    def __init__(self, consumer: Consumer, topics: Sequence[str], work: Work[T], letters: DeadLetters,
                 heartbeat: Heartbeat | None = None, fetch: Fetch | None = None, track_ends: bool = False) -> None:
        self.consumer = consumer
        self.topics = list(topics)
        self.work = work
        self.letters = letters
        self.heartbeat = heartbeat
        self.fetch = fetch or Fetch()
        self.stop_event = threading.Event()
        # Ends of partitions: only for a consumer made with enable.partition.eof (else no end is ever seen).
        self.ends = {t: PartitionEnds() for t in self.topics} if track_ends else {}
        self.assigned_once = False  # beats say the partitions are being read
        self.commits = 0
        self._owned: set[Partition] = set()
        self._committed: Offsets = {}
        self._applied: tuple[frozenset[Partition], frozenset[Partition]] = (frozenset(), frozenset())

    def stop(self) -> None:
        self.stop_event.set()

    def run(self) -> None:
        self.consumer.subscribe(self.topics, on_assign=self.on_assign, on_revoke=self.on_revoke)
        try:
            while not self.stop_event.is_set():
                self.turn()
        finally:
            try:
                self.commit(wait=True)
            finally:
                self.consumer.close()

    def turn(self) -> None:
        self._gate()
        records, read = self._records(self.fetch(self.consumer))
        self.work.apply(records, read)
        self.commit(wait=False)
        if self.heartbeat is not None and self.assigned_once:
            self.heartbeat.tick()

    def _records(self, msgs: list[Message]) -> tuple[list[Record[T]], Offsets]:
        out: list[Record[T]] = []
        read: Offsets = {}
        held = self._applied[1]
        put_back: set[Partition] = set()
        for m in msgs:
            topic, partition, offset = str(m.topic()), int(m.partition() or 0), int(m.offset() or 0)
            if not self._data(m, topic):
                continue
            if (topic, partition) in held:  # fetched before the pause took: read it again once released
                if (topic, partition) not in put_back:
                    put_back.add((topic, partition))
                    self._rewind(TopicPartition(topic, partition, offset))
                continue
            read[(topic, partition)] = offset + 1
            value = m.value() or b""
            try:
                decoded = self.work.decode(m)
            except Rejected as exc:
                self.letters.send(DeadLetter(topic, partition, offset, m.key(), value, exc.reason, self.letters.role,
                                             exc.error_type))
                continue
            out.append(Record(topic, partition, offset, int(m.timestamp()[1]), m.key(), value, decoded))
        return out, read

    def _data(self, m: Message, topic: str) -> bool:
        """True for a record; an end of partition is noted, a consume error logged."""
        ends = self.ends.get(topic)
        if ends is not None and ends.record(m):
            return True
        err = m.error()
        if err is None:
            return True
        if err.code() != KafkaError._PARTITION_EOF:
            log.warning("consume error: %s", err)
        return False

    def _rewind(self, tp: TopicPartition) -> None:
        try:
            self.consumer.seek(tp)
        except KafkaException as exc:  # not assigned any more: its new owner reads it from the committed offset
            log.warning("could not rewind to %s[%d]@%d (%s)", tp.topic, tp.partition, tp.offset, exc)

    def commit(self, wait: bool) -> None:
        """Dead letters and the work's output on Kafka (or stored), then commit the offsets that moved."""
        offsets = self.work.durable(wait)
        self.letters.flush()
        changed = [TopicPartition(t, p, o) for (t, p), o in offsets.items()
                   if (t, p) in self._owned and self._committed.get((t, p)) != o]
        if changed and commit_sync(self.consumer, changed):
            self._committed.update({(tp.topic, tp.partition): tp.offset for tp in changed})
            self.commits += 1

    def _gate(self, force: bool = False) -> None:
        """Pause what the work holds and resume the rest, whenever either changed (or the assignment did)."""
        assignment = frozenset((tp.topic, tp.partition) for tp in self.consumer.assignment())
        held = self.work.holding(assignment) & assignment
        if not force and (assignment, held) == self._applied:
            return
        if held:
            self.consumer.pause([TopicPartition(t, p) for t, p in held])
        if assignment - held:
            self.consumer.resume([TopicPartition(t, p) for t, p in assignment - held])
        self._applied = (assignment, held)

    def on_assign(self, c: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget(partitions)
        self.work.assigned(c, partitions)
        c.assign(partitions)
        self._owned = {(tp.topic, tp.partition) for tp in partitions}
        self._gate(force=True)  # before the first fetch: a held partition must not start reading
        self.assigned_once = True
        log.info("assigned %s", sorted((tp.topic.rsplit(".", 1)[-1], tp.partition) for tp in partitions))

    def on_revoke(self, c: Consumer, partitions: list[TopicPartition]) -> None:
        self.commit(wait=True)
        self.work.revoked(partitions)
        self._forget(partitions)
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self._owned -= gone
        self._committed = {k: v for k, v in self._committed.items() if k not in gone}

    def _forget(self, partitions: list[TopicPartition]) -> None:
        """An end reached under an earlier assignment says nothing about this one: the partition starts again at
        its committed offset, and the flag would stay raised until a record came."""
        for topic, ends in self.ends.items():
            ends.forget(tp.partition for tp in partitions if tp.topic == topic)
