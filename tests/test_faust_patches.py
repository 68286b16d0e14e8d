"""The corrections to Faust (streams/faust_patches.py): a commit's flush drains the changelog buffer and the
processors' own producers, the seek to the committed offsets takes a partition with none back to its start, a
recovery resumes the source partitions after its seek, a fetch whose set of active partitions empties fetches
nothing, and Faust's producer is idempotent."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import NewTopic

from litstream.infra.kafka import admin
from litstream.infra.settings import Settings
from litstream.streams import faust_patches


class _SlowChannel:
    """A channel whose sends take longer than Faust's 0.1 s flush patience."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def publish_message(self, fut: Any, wait: bool = False) -> None:
        await asyncio.sleep(0.25)
        self.sent.append(fut)


def test_a_flush_returns_only_when_every_buffered_message_is_sent() -> None:
    from faust.transport.producer import ProducerBuffer

    faust_patches.apply()

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

    faust_patches.apply()
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


def test_the_seek_to_committed_offsets_takes_a_partition_with_none_back_to_its_start(settings: Settings) -> None:
    """A consumer fetched records and dropped them (as Faust does around a recovery): partitions with a committed
    offset go back to it, those with none (or 0) to their start, and the ones it is told to leave stay put."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as TP

    topic = f"{settings.topic_prefix}.seek"
    client = admin(settings)
    client.create_topics([NewTopic(topic, num_partitions=4, replication_factor=-1)])[topic].result()
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    for p in range(4):
        for i in range(6):
            producer.produce(topic, f"v{i}".encode(), partition=p)
    producer.flush()
    tps = [TP(topic, p) for p in range(4)]

    async def scenario() -> tuple[list[int], dict[Any, int | None]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, group_id=f"{topic}-group",
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign(tps)
            await consumer.commit({tps[0]: 4, tps[1]: 0})  # partition 0 read up to 4, partition 1 "up to 0"
            consumer.seek(tps[0], 4)
            for tp in tps[1:]:
                await consumer.seek_to_beginning(tp)
            read = 0
            while read < 2 + 6 * 3:  # everything fetched, as if handed on and dropped
                batches = await consumer.getmany(timeout_ms=2000)
                read += sum(len(records) for records in batches.values())
            committed = await faust_patches.seek_to_committed_or_start(consumer, lambda tp: tp.partition == 3)
            return [await consumer.position(tp) for tp in tps], committed
        finally:
            await consumer.stop()

    positions, committed = asyncio.run(scenario())
    assert committed == {tps[0]: 4, tps[1]: 0, tps[2]: 0, tps[3]: None}  # the start stands in for a commit
    assert positions == [4, 0, 0, 6]  # committed; 0 committed; none committed: the start; left alone


def test_fausts_seek_to_committed_goes_through_the_correction_and_leaves_changelogs_alone() -> None:
    from aiokafka import TopicPartition as TP
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    faust_patches.apply()
    sought: list[Any] = []

    class _Consumer:  # what the correction asks of aiokafka's consumer, recorded
        async def seek_to_committed(self) -> dict[Any, int | None]:
            return {TP("events", 0): None, TP("events", 1): 7, TP("rollouts-changelog", 0): None}

        async def beginning_offsets(self, tps: list[Any]) -> dict[Any, int]:
            return {tp: 3 for tp in tps}

        def seek(self, tp: Any, offset: int) -> None:
            sought.append((tp, offset))

    async def call_thread(fn: Any, *args: Any) -> Any:
        return await fn(*args)

    thread = SimpleNamespace(consumer=SimpleNamespace(app=SimpleNamespace(tables=SimpleNamespace(
        changelog_topics={"rollouts-changelog"}))), _ensure_consumer=_Consumer, call_thread=call_thread)
    committed = asyncio.run(AIOKafkaConsumerThread.seek_to_committed(thread))  # type: ignore[arg-type]
    assert committed == {TP("events", 0): 3, TP("events", 1): 7, TP("rollouts-changelog", 0): None}
    assert sought == [(TP("events", 0), 3)]


def test_a_recovery_step_resumes_the_stream_partitions_only_after_its_seek() -> None:
    """Faust's last recovery step resumed the source partitions, then sought them, then resumed the flow (which
    clears what the agent had queued); records fetched between were lost. The partitions now resume after it."""
    order: list[str] = []

    class _Consumer:
        def resume_partitions(self, tps: Any) -> None:
            order.append(f"resume {sorted(tps)}")

    app = SimpleNamespace(consumer=_Consumer(), consumer_generation_id=3)

    async def faust_step(self: Any, generation_id: int = 0) -> None:
        self.app.consumer.resume_partitions({"events-0", "events-1"})
        order.append("seek")
        order.append("flow resumed")

    recovery = SimpleNamespace(app=app)
    asyncio.run(faust_patches.resumed_last(faust_step)(recovery, 3))
    assert order == ["seek", "flow resumed", "resume ['events-0', 'events-1']"]

    order.clear()
    asyncio.run(faust_patches.resumed_last(faust_step)(recovery, 2))  # a rebalance came meanwhile: left to it
    assert order == ["seek", "flow resumed"]
    assert "resume_partitions" not in vars(app.consumer)  # the method is the class's again


def test_fausts_recovery_steps_go_through_the_correction() -> None:
    """Both of Faust's last recovery steps (``faust/tables/recovery.py``) seek and resume the flow before they
    resume the source partitions; the changelog partitions are never resumed there."""
    from faust.tables.recovery import Recovery

    faust_patches.apply()
    order: list[str] = []

    class _Consumer:
        def assignment(self) -> set[str]:
            return {"events-0", "table-changelog-0"}

        def resume_partitions(self, tps: Any) -> None:
            order.append(f"resume {sorted(tps)}")

        async def perform_seek(self) -> None:
            order.append("seek")

        def resume_flow(self) -> None:
            order.append("flow resumed")

    async def nothing(*_args: Any, **_kwargs: Any) -> None:
        return None

    async def wait(coro: Any, timeout: float) -> None:
        await coro

    def quiet(*_args: Any) -> None:
        return None

    for step in (Recovery._resume_streams, Recovery.on_recovery_completed):
        order.clear()
        app = SimpleNamespace(consumer=_Consumer(), consumer_generation_id=1, conf=SimpleNamespace(
            broker_request_timeout=1.0), on_rebalance_complete=SimpleNamespace(send=nothing),
            flow_control=SimpleNamespace(resume=lambda: None), _fetcher=SimpleNamespace(maybe_start=nothing),
            tables=SimpleNamespace(values=lambda: [], on_actives_ready=lambda: None,
                                   on_standbys_ready=lambda: None),
            assignor=SimpleNamespace(assigned_standbys=lambda: set()), on_rebalance_end=lambda: None)
        recovery: Any = SimpleNamespace(app=app, log=SimpleNamespace(info=quiet, dev=quiet, warning=quiet),
                                        _is_changelog_tp=lambda tp: "changelog" in tp, _wait=wait,
                                        completed=asyncio.Event(), _set_recovery_ended=lambda: None,
                                        tables=app.tables)
        asyncio.run(step(recovery, 1))
        assert order == ["seek", "flow resumed", "resume ['events-0']"], step


def test_a_fetch_whose_active_set_empties_returns_nothing_and_follows_a_partition_resumed_meanwhile(
        settings: Settings) -> None:
    """Faust passes its live set of active partitions to a fetch, and aiokafka reads an empty set as "every
    partition". At the end of a recovery the set empties while a fetch waits (changelogs paused, source partitions
    not resumed yet): the fetch handed over the source partitions' buffered records, which Faust dropped, their
    positions moved past them for good. Now an emptied set fetches nothing, and a partition resumed while the fetch
    waits is still fetched in that same call."""
    from functools import partial

    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as TP
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    faust_patches.apply()
    topic = f"{settings.topic_prefix}.fetch"
    client = admin(settings)
    client.create_topics([NewTopic(topic, num_partitions=4, replication_factor=-1)])[topic].result()
    producer = Producer({"bootstrap.servers": settings.bootstrap_servers})
    for p in (0, 1):
        for i in range(3):
            producer.produce(topic, f"v{i}".encode(), partition=p)
    producer.flush()
    tps = [TP(topic, p) for p in range(4)]

    def wake_the_fetch(partition: int) -> None:  # a record on an empty partition completes a fetch, which wakes
        producer.produce(topic, b"late", partition=partition)  # the waiting call
        producer.flush()

    async def call_thread(fn: Any, *args: Any, **kwargs: Any) -> Any:
        return await fn(*args, **kwargs)

    async def scenario() -> tuple[dict[Any, int], list[int]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign(tps)
            for tp in tps:
                await consumer.seek_to_beginning(tp)
            await asyncio.sleep(1.0)  # aiokafka's background fetch buffers partitions 0 and 1 meanwhile
            thread = SimpleNamespace(consumer=SimpleNamespace(flow_active=True), _ensure_consumer=lambda: consumer,
                                     call_thread=call_thread)
            fetch_records: Any = AIOKafkaConsumerThread._fetch_records
            thread._fetch_records = partial(fetch_records, thread)
            active = {tps[2]}  # Faust's live set
            fetch = asyncio.ensure_future(AIOKafkaConsumerThread.getmany(thread, active, 10.0))  # type: ignore[arg-type]
            await asyncio.sleep(0.3)
            active.clear()  # paused while the fetch waits
            wake_the_fetch(2)
            await asyncio.sleep(0.5)
            assert not fetch.done()  # nothing handed over: the set is empty
            active.add(tps[1])  # resumed while the fetch still waits
            wake_the_fetch(3)
            got = await asyncio.wait_for(fetch, 5.0)
            return {tp: len(records) for tp, records in got.items()}, [await consumer.position(tp) for tp in tps[:2]]
        finally:
            await consumer.stop()

    fetched, positions = asyncio.run(scenario())
    assert fetched == {tps[1]: 3}
    assert positions == [0, 3]  # partition 0 is still to be read


def test_fausts_producer_is_idempotent_with_acks_all() -> None:
    """Faust turns aiokafka's idempotence on only for exactly_once; every producer it builds now has it."""
    from faust.transport.drivers.aiokafka import Producer

    faust_patches.apply()
    producer: Any = SimpleNamespace(app=SimpleNamespace(in_transaction=False))
    extra = Producer._settings_extra(producer)
    assert extra["enable_idempotence"] is True and extra["acks"] == "all"
