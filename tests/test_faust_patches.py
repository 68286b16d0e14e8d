"""The corrections to Faust (streams/faust_patches.py): a commit's flush drains the changelog buffer and the
processors' own producers, and the
changelog end is read, not taken from the embedded broker's ListOffsets."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from litstream.infra.kafka import admin, read_partition_ends
from litstream.infra.settings import Settings
from litstream.streams import faust_patches


def test_the_changelog_end_is_read_past_the_last_batch_start(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.ends"
    client = admin(settings)
    client.create_topics([NewTopic(topic, num_partitions=2, replication_factor=-1)])[topic].result()
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers, "linger.ms": 50})
    for _ in range(3):  # three batches of five records each on partition 0; partition 1 stays empty
        for i in range(5):
            producer.produce(topic, f"v{i}".encode(), partition=0)
        producer.flush()
    probe = Consumer({"bootstrap.servers": settings.bootstrap_servers, "group.id": "ends-probe"})
    try:
        reported = [probe.get_watermark_offsets(TopicPartition(topic, p), timeout=10.0)[1] for p in (0, 1)]
    finally:
        probe.close()

    ends = read_partition_ends(
        settings, [(TopicPartition(topic, 0), reported[0]), (TopicPartition(topic, 1), reported[1])])

    assert ends == {(topic, 0): 15, (topic, 1): 0}
    assert reported[0] <= 15  # the broker's answer is a lower bound (on the embedded broker: 11, not 15)


class _SlowChannel:
    """A channel whose sends take longer than Faust's 0.1 s flush patience."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def publish_message(self, fut: Any, wait: bool = False) -> None:
        await asyncio.sleep(0.25)
        self.sent.append(fut)


def test_a_flush_returns_only_when_every_buffered_message_is_sent() -> None:
    from faust.transport.producer import ProducerBuffer

    faust_patches.apply(Settings(profile="production"))

    async def scenario() -> tuple[int, int]:
        buffer = ProducerBuffer()
        buffer.app = SimpleNamespace(conf=SimpleNamespace(producer_threaded=False))  # type: ignore[assignment]
        channel = _SlowChannel()
        await buffer.start()
        try:
            for i in range(3):
                buffer.put(SimpleNamespace(message=SimpleNamespace(channel=channel), i=i))  # type: ignore[arg-type]
            await buffer.flush()
            return len(channel.sent), buffer.size
        finally:
            await buffer.stop()

    sent, left = asyncio.run(scenario())
    assert (sent, left) == (3, 0)


def test_a_flush_of_fausts_producer_flushes_the_registered_producers_after_it() -> None:
    from faust.transport.drivers.aiokafka import Producer

    faust_patches.apply(Settings(profile="production"))
    order: list[str] = []

    class _Buffer:
        async def flush(self) -> None:
            order.append("faust")

    async def side() -> None:
        order.append("side")

    faust_patches.flush_with_faust(side)
    try:
        faust_producer = SimpleNamespace(buffer=_Buffer(), _producer=None, _transaction_producers={})
        asyncio.run(Producer.flush(faust_producer))  # type: ignore[arg-type]
    finally:
        faust_patches._side_flushes.remove(side)
    assert order == ["faust", "side"]  # before every commit: the outputs are sent before the offsets move
