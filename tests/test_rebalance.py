"""Consumers across a rebalance, on the real broker: a second member joins the group and leaves, so the first one's
partitions are revoked and assigned again. Under load that happens on its own (a broker stalled past the session
timeout); two things went wrong then and are checked here."""

from __future__ import annotations

import time
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from litstream.infra.kafka import Backpressure, consumer, producer
from litstream.infra.settings import Settings
from litstream.streams.triplet_processor import TripletProcessor


def rebalance_through(a: Consumer, settings: Settings, group: str, topics: list[str],
                      serve_a: Callable[[], None], **config: object) -> None:
    """A second member joins ``group`` and leaves again; ``serve_a`` polls the first member meanwhile. Returns once
    the first member owns every partition again."""
    full = {(tp.topic, tp.partition) for tp in a.assignment()}
    assert full
    b = consumer(settings, group_id=group, **config)
    b.subscribe(topics)
    deadline = time.monotonic() + 60
    try:
        while not b.assignment():
            assert time.monotonic() < deadline, "the second member got no partition"
            b.poll(0.1)
            serve_a()
    finally:
        b.close()
    while {(tp.topic, tp.partition) for tp in a.assignment()} != full:
        assert time.monotonic() < deadline, "the first member did not get its partitions back"
        serve_a()


def test_a_held_consumer_takes_records_again_after_its_partitions_came_back(settings: Settings) -> None:
    """librdkafka keeps a partition paused when it is revoked and assigned again: the runners' back-pressure once
    resumed an empty assignment mid-rebalance and never took an offer again."""
    topic = f"{settings.topic_prefix}.rollout-offers"
    group = f"{settings.topic_prefix}-held"
    a = consumer(settings, group_id=group)
    a.subscribe([topic])
    gate = Backpressure(a)
    out = producer(settings)
    got: list[Message] = []

    def serve_a() -> None:
        gate.hold()  # every slot busy: fetch nothing, keep the membership
        msg = a.poll(0.1)
        if msg is not None:
            gate.put_back(msg)

    try:
        deadline = time.monotonic() + 60
        while not a.assignment():
            assert time.monotonic() < deadline
            serve_a()
        rebalance_through(a, settings, group, [topic], serve_a)
        for p in range(settings.partitions):
            out.produce(topic, key=b"k", value=f"offer {p}".encode(), partition=p)
        out.flush(10)
        time.sleep(1.0)
        serve_a()
        assert a.poll(0.5) is None  # still held
        gate.release()
        deadline = time.monotonic() + 30
        while len(got) < settings.partitions and time.monotonic() < deadline:
            msg = a.poll(0.2)
            if msg is not None and msg.error() is None:
                got.append(msg)
        assert sorted((m.value() or b"") for m in got) == [f"offer {p}".encode() for p in range(settings.partitions)]
    finally:
        a.close()


def test_a_spans_partition_assigned_again_is_not_read_to_the_end_before_it_is_fetched(settings: Settings) -> None:
    """The triplet processor finalizes an ended attempt once its spans partition is read to the end. An end reached
    before a lost session said so after the partition came back at its committed offset, before any span was
    fetched again: attempts were finalized with no spans and their spans dead-lettered as late."""
    processor = TripletProcessor(settings, poll_s=0.05)
    spans = processor.topics.spans
    topics = [spans, processor.topics.state]
    group = f"{settings.topic_prefix}-triplets"
    raw = producer(settings)
    c = processor.loop.consumer
    at_end_when_assigned: list[bool] = []

    def on_assign(cons: Consumer, partitions: list[TopicPartition]) -> None:
        processor.loop.on_assign(cons, partitions)
        if TopicPartition(spans, 0) in partitions:  # assigned, nothing fetched yet
            at_end_when_assigned.append(processor._spans_read_to_end(0))

    def serve(until_eof: bool = False) -> bool:
        for msg in c.consume(100, 0.1):
            processor.loop.ends[str(msg.topic())].record(msg)
            err = msg.error()
            if (until_eof and msg.topic() == spans and msg.partition() == 0 and err is not None
                    and err.code() == KafkaError._PARTITION_EOF):
                return True
        return False

    try:
        raw.produce(spans, key=b"k", value=b"a span", partition=0)
        raw.flush(10)
        c.subscribe(topics, on_assign=on_assign, on_revoke=processor.loop.on_revoke)
        deadline = time.monotonic() + 60
        while not serve(until_eof=True):
            assert time.monotonic() < deadline, "no end-of-partition event"
        assert processor._spans_read_to_end(0)
        rebalance_through(c, settings, group, topics, serve, **{"partition.assignment.strategy": "range"})
        assert len(at_end_when_assigned) >= 2  # first assignment, and the one after the second member left
        assert at_end_when_assigned[-1] is False
        deadline = time.monotonic() + 60
        while not processor._spans_read_to_end(0):  # once the span is fetched again and the end reached
            assert time.monotonic() < deadline, "not read to the end after the rebalance"
            serve()
    finally:
        c.close()
        processor.close()
