"""Kafka clients (confluent-kafka) built from the settings, and the few patterns every process shares."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator
from typing import Any

from confluent_kafka import Consumer as _Consumer
from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from . import metrics
from .client_config import group_config, security_config
from .settings import Settings
from .topics import physical_topics

log = logging.getLogger(__name__)

# Record headers as the client takes them (a list is invariant: the element type must be the client's own).
Headers = list[tuple[str, str | bytes | None]]


# Extra config of every client this process makes; see quiet_clients().
_CLIENT_EXTRAS: dict[str, Any] = {}


def quiet_clients() -> None:
    """For short commands a person runs: drop librdkafka's own log lines and error callbacks (hundreds of them
    while a broker is down); the command says what went wrong in one line instead."""
    sink = logging.getLogger("litstream.librdkafka")
    sink.addHandler(logging.NullHandler())
    sink.propagate = False
    _CLIENT_EXTRAS.update({"logger": sink, "error_cb": lambda _err: None})


def admin(settings: Settings) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.bootstrap_servers, **security_config(settings),
                        **_CLIENT_EXTRAS})


def producer(settings: Settings, **overrides: Any) -> Producer:
    """The producer every librdkafka writer uses: idempotent with ``acks=all``, whatever ``overrides`` say."""
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "client.id": "litstream",  # the name the broker's request log and quotas know it by (EventProducer: its role)
        "linger.ms": 5,
        # The Java client's key hash, which Faust (aiokafka) uses too: without it librdkafka's CRC32 default puts
        # a rollout's spans and events on other partition numbers than the snapshots the lifecycle writes.
        "partitioner": "murmur2_random",
        "log.connection.close": False,  # idle disconnects are routine, not news
        **security_config(settings),
        **_CLIENT_EXTRAS,
        **overrides,
        # Idempotent, every replica in sync acknowledging: retries never duplicate or reorder within a partition,
        # and an acknowledged record survives the loss of its leader.
        "enable.idempotence": True,
        "acks": "all",
    }
    return Producer(conf)


def consumer(settings: Settings, group_id: str, **overrides: Any) -> _Consumer:
    conf: dict[str, Any] = {
        "bootstrap.servers": settings.bootstrap_servers,
        "group.id": group_id,
        "client.id": group_id,  # the broker's request log and quotas name a consumer by its group
        "auto.offset.reset": "earliest",
        # Offsets are committed by hand, after the work a message caused is durable (at-least-once).
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "log.connection.close": False,
        **group_config(settings),
        **security_config(settings),
        **metrics.kafka_stats_config(group_id),  # lag for /metrics, when this process serves it
        **_CLIENT_EXTRAS,
        **overrides,
    }
    return _Consumer(conf)


def create_topics(settings: Settings, timeout: float = 30.0) -> list[str]:
    """Create every catalogue topic that does not exist yet; returns the names created."""
    client = admin(settings)
    wanted = physical_topics(settings)
    existing = set(client.list_topics(timeout=timeout).topics)
    new = [NewTopic(t.name, num_partitions=t.partitions, replication_factor=-1, config=t.config)
           for t in wanted if t.name not in existing]
    created: list[str] = []
    if not new:
        return created
    for name, fut in client.create_topics(new, request_timeout=timeout).items():
        try:
            fut.result()
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    _wait_for_leaders(client, [t.topic for t in new], timeout)
    return created


def _wait_for_leaders(client: AdminClient, names: list[str], timeout: float) -> None:
    """Until every partition of ``names`` has a leader in the broker's metadata: Kafka answers CreateTopics once
    the controller has the topic, and its brokers learn of it a moment later, so a client asking at once could
    find the topic missing."""
    deadline = time.monotonic() + timeout
    pending = set(names)
    while pending:
        topics = client.list_topics(timeout=max(0.5, deadline - time.monotonic())).topics
        pending = {n for n in pending if n not in topics or topics[n].error is not None
                   or any(p.leader < 0 for p in topics[n].partitions.values())}
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics without a leader {timeout:.0f}s after their creation: {sorted(pending)}")
        time.sleep(0.05)


def missing_topics(settings: Settings, timeout: float = 10.0) -> list[str]:
    existing = set(admin(settings).list_topics(timeout=timeout).topics)
    return [t.name for t in physical_topics(settings) if t.name not in existing]


def wait_for_broker(settings: Settings, timeout: float = 30.0) -> None:
    """Block until the broker answers a metadata request, or raise with what to check."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            admin(settings).list_topics(timeout=max(0.2, min(2.0, deadline - time.monotonic())))
            return
        except KafkaException as exc:
            last = exc
            time.sleep(0.2)
    reason = last.args[0].str() if last is not None and isinstance(last.args[0], KafkaError) else last
    raise ConnectionError(
        f"no Kafka broker answered at {settings.bootstrap_servers} within {timeout:.0f}s ({reason}): start the stack "
        "here with `litstream up`, or point LITSTREAM_BOOTSTRAP_SERVERS at your broker"
    )


class PartitionEnds:
    """Which partitions a consumer has read to their end, from the end-of-partition events it gets while fetching
    (``enable.partition.eof``): the end as this consumer saw it, with no extra request."""

    def __init__(self) -> None:
        self.at_end: set[int] = set()
        self.eof_offset: dict[int, int] = {}  # partition -> offset of its latest end-of-partition event

    def record(self, msg: Message) -> bool:
        """True for a data record; False for anything else (an end of partition is noted)."""
        partition = int(msg.partition() or 0)
        err = msg.error()
        if err is None:
            self.at_end.discard(partition)
            return True
        if err.code() == KafkaError._PARTITION_EOF:
            self.at_end.add(partition)
            self.eof_offset[partition] = int(msg.offset() or 0)
        return False

    def covers(self, partitions: Iterable[int]) -> bool:
        return set(partitions) <= self.at_end

    def forget(self, partitions: Iterable[int]) -> None:
        """Partitions revoked or assigned anew: an end reached under an earlier assignment says nothing now (the
        new one starts from the committed offset, and the flag would stay raised until a record came)."""
        for p in partitions:
            self.at_end.discard(p)
            self.eof_offset.pop(p, None)


class Backpressure:
    """Pauses and resumes a group consumer's whole assignment.

    Across a rebalance librdkafka keeps a partition's pause flag or drops it, depending on where the partition
    went: a consumer that paused or resumed once could find partitions that came back paused for good (seen under
    load: after lost group sessions, every runner stopped taking offers) or fetching while it meant to hold. So the
    wanted state is applied again whenever the assignment changes; call :meth:`hold` or :meth:`release` before each
    poll."""

    def __init__(self, c: _Consumer) -> None:
        self._c = c
        self.paused = False
        self._applied: frozenset[tuple[str, int]] = frozenset()

    def hold(self) -> None:
        self._apply(True)

    def release(self) -> None:
        self._apply(False)

    def _apply(self, paused: bool) -> None:
        assignment = self._c.assignment()
        current = frozenset((tp.topic, tp.partition) for tp in assignment)
        if paused == self.paused and current == self._applied:
            return
        if assignment:
            (self._c.pause if paused else self._c.resume)(assignment)
        self.paused, self._applied = paused, current

    def put_back(self, msg: Message) -> None:
        """A record that came while held (fetched just before a rebalance handed its partition over unpaused):
        rewind to it, so it is delivered again once released rather than skipped by a later commit."""
        if msg.error() is not None:
            return
        tp = TopicPartition(str(msg.topic()), int(msg.partition() or 0), int(msg.offset() or 0))
        try:
            self._c.seek(tp)
        except KafkaException as exc:  # not assigned any more: its new owner reads it from the committed offset
            log.warning("could not rewind to %s[%d]@%d (%s)", tp.topic, tp.partition, tp.offset, exc)


def commit_sync(c: _Consumer, offsets: list[TopicPartition]) -> bool:
    """Commit ``offsets`` and wait; False when the group moved on (a rebalance, a lost session, a coordinator
    change). That is routine under load: the partitions' new owner takes over from the last committed offsets and
    the records in between are delivered again, which every consumer here tolerates (at-least-once). A fatal
    client error still raises."""
    try:
        c.commit(offsets=offsets, asynchronous=False)
        return True
    except KafkaException as exc:
        err = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
        if err is not None and err.fatal():
            raise
        log.warning("offset commit not taken (%s); the records since the last commit will be delivered again", exc)
        return False


def poll_batch(c: _Consumer, timeout: float, max_records: int = 1000) -> list[Message]:
    """Wait up to ``timeout`` for one record, then take whatever else is already fetched. (A bare
    ``consume(n, timeout)`` waits out its whole timeout whenever fewer than n records come.)"""
    first = c.poll(timeout)
    return [first, *c.consume(num_messages=max_records - 1, timeout=0)] if first is not None else []


def read_to_end(settings: Settings, topic: str, timeout: float = 30.0) -> Iterator[Message]:
    """Every record of ``topic`` from the beginning to the current end (see :class:`PartitionEnds`).
    No group is joined and nothing is committed."""
    return read_log(settings, topic, None, timeout)


def read_log(settings: Settings, topic: str, until: dict[int, int] | None = None,
             timeout: float = 30.0) -> Iterator[Message]:
    """The records of ``topic`` from the beginning, in each partition's order: to the current end, or with
    ``until`` (partition -> offset) those before that offset (a partition not named: none). No group is joined
    and nothing is committed."""
    partitions = topic_partitions(settings, topic)
    stops = {p: until.get(p, 0) for p in partitions} if until is not None else None
    wanted = [p for p in partitions if stops is None or stops[p] > 0]
    if not wanted:
        return
    c = consumer(settings, group_id=f"reader-{os.getpid()}-{time.monotonic_ns()}", **{"enable.partition.eof": True})
    ends, passed = PartitionEnds(), set[int]()
    try:
        c.assign([TopicPartition(topic, p, 0) for p in wanted])  # offset 0 = the beginning
        deadline = time.monotonic() + timeout
        while not (ends.at_end | passed).issuperset(wanted):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} to its end took over {timeout:.0f}s")
            for msg in poll_batch(c, 0.05):
                err = msg.error()
                if err is not None and err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                if not ends.record(msg):
                    continue
                partition = int(msg.partition() or 0)
                if stops is not None and int(msg.offset() or 0) >= stops[partition]:
                    if partition not in passed:
                        passed.add(partition)
                        c.pause([TopicPartition(topic, partition)])
                    continue
                yield msg
    finally:
        c.close()


def topic_partitions(settings: Settings, topic: str) -> list[int]:
    """The partitions of ``topic``; LookupError if it does not exist."""
    meta = admin(settings).list_topics(topic=topic, timeout=10.0)
    tmeta = meta.topics.get(topic)
    if tmeta is None or tmeta.error is not None:
        raise LookupError(f"topic {topic!r} does not exist; run `litstream topics create`")
    return sorted(tmeta.partitions)


def offsets_at(settings: Settings, topic: str, when: float) -> dict[int, int]:
    """Per partition, the offset of its first record written after ``when`` (seconds since the epoch; a record's
    timestamp is when its producer sent it), or its end when none is: the log as it stood at that time."""
    partitions = topic_partitions(settings, topic)
    after_ms = int(when * 1000) + 1  # records at or before ``when``, to the millisecond, are in
    c = consumer(settings, group_id=f"{topic}-times")
    try:
        found = c.offsets_for_times([TopicPartition(topic, p, after_ms) for p in partitions], timeout=30)
        return {tp.partition: (tp.offset if tp.offset >= 0 else high_watermark(c, tp)) for tp in found}
    finally:
        c.close()


def headers_dict(msg: Message) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    raw = msg.headers() or []
    for k, v in raw.items() if isinstance(raw, dict) else raw:
        out[k] = v.encode() if isinstance(v, str) else (v or b"")
    return out


PATIENT_FLUSH_WARN_S = 30.0


def flush_or_raise(p: Producer, timeout: float | None = 30.0) -> None:
    """Wait for every queued message's acknowledgement; after ``timeout`` seconds raise :class:`TimeoutError`.

    ``timeout=None`` waits as long as the producer itself keeps a message (``message.timeout.ms``, 5 minutes by
    default, after which it fails the message and its delivery report says why), warning every 30 s: what a
    processor wants, whose slow broker (an overloaded machine) must cost time, not a crash and a rebalance."""
    if timeout is not None:
        left = p.flush(timeout)
        if left:
            raise TimeoutError(f"{left} messages were not delivered within {timeout:.0f}s; is the broker up?")
        return
    waited = 0.0
    while left := p.flush(PATIENT_FLUSH_WARN_S):
        waited += PATIENT_FLUSH_WARN_S
        log.warning("%d messages still waiting for the broker's acknowledgement after %.0f s; waiting on (each "
                    "fails after message.timeout.ms)", left, waited)


def topic_ends(settings: Settings, topic: str) -> dict[int, int]:
    """:func:`end_offsets` of every partition of ``topic``."""
    return end_offsets(settings, topic, topic_partitions(settings, topic))


def end_offsets(settings: Settings, topic: str, partitions: list[int]) -> dict[int, int]:
    """The next offset each partition will be written at (its high-water mark)."""
    c = consumer(settings, group_id=f"{topic}-ends")
    try:
        return {p: high_watermark(c, TopicPartition(topic, p)) for p in partitions}
    finally:
        c.close()


# Errors a metadata read meets while a partition's leadership moves: asked again, not raised.
LEADERSHIP_MOVING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                               KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._TRANSPORT})


def high_watermark(c: _Consumer, tp: TopicPartition, timeout: float = 30.0) -> int:
    """The partition's high-water mark. A retriable error (a topic just made, whose leader is still being elected;
    a broker failing over) is asked again until ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return int(c.get_watermark_offsets(tp, timeout=max(0.1, deadline - time.monotonic()))[1])
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            moving = isinstance(err, KafkaError) and (err.retriable() or err.code() in LEADERSHIP_MOVING)
            if not moving or time.monotonic() >= deadline:
                raise
            time.sleep(0.1)
