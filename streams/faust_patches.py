"""Corrections to faust-streaming 0.15.3 and aiokafka 0.14, applied before the lifecycle processor starts.

1, 3 and 4 correct defects in the libraries' own code (named with file and function), whatever the broker;
2 and 5 add what Faust does not offer. Each has a test in ``tests/test_faust_patches.py`` that fails without
it. The defects show only in races (a worker killed or restarted under load), which the restart tests of
``tests/test_lifecycle.py`` rarely meet.

1. **A commit waits for every changelog write.** ``ProducerBuffer.flush`` (``faust/transport/producer.py``,
   through ``flush_atmost``) returns as soon as 0.1 s pass without a send, with messages still queued; Faust
   flushes that buffer and then commits source offsets (``Consumer.commit`` in
   ``faust/transport/consumer.py``). A worker killed after such a commit comes back with a table that misses
   changes whose events are committed, so they are never applied again (seen: claims lost after a SIGKILL
   under load). Patched: the flush returns only when the buffer is empty and no message is in the middle of
   its send.

2. **Other producers are flushed with Faust's.** Not a defect: Faust's ``Producer.flush``
   (``faust/transport/drivers/aiokafka.py``), awaited before every offset commit and when partitions are
   revoked, knows only its own producer. A processor that sends its outputs through a producer of its own
   (librdkafka: the sending happens off the event loop) registers it with :func:`flush_with_faust`, and it is
   flushed after Faust's, so no offset is committed ahead of the outputs its events caused.

3. **A partition with no committed offset is read from its start, and the source partitions resume after the
   seek.** At the end of a rebalance or a recovery Faust seeks its source partitions "to the committed
   offsets" (``Consumer.perform_seek``) and counts on that seek to undo records fetched and not handed on
   meanwhile (its fetcher runs through the recovery, and it drops a fetched batch on a pause, a stopped flow
   or a new generation). But ``AIOKafkaConsumer.seek_to_committed`` (``aiokafka/consumer/consumer.py``) seeks
   only a partition whose committed offset is above 0 and leaves the others where they are, so such records
   were skipped for good (seen: a worker killed before its first commit was replaced, and the new one's
   position stood at the log's end before the seek, past the events written while none ran). Patched: those
   partitions are sought to their beginning, where Faust's ``consumer_auto_offset_reset="earliest"`` starts a
   new group anyway, exactly as to a commit there; changelog partitions are left alone (recovery seeks them
   itself).
   And ``Recovery.on_recovery_completed`` and ``Recovery._resume_streams`` (``faust/tables/recovery.py``)
   resume the source partitions before that seek: records fetched meanwhile went to the agent's queue, which
   resuming the flow clears, while the fetcher had already marked them read past the seek (seen: one claim
   skipped in the middle of a partition). Patched: the partitions are resumed once the seek is done and the
   flow runs again.

4. **An emptied set of active partitions fetches none.** Faust's ``AIOKafkaConsumerThread.getmany``
   (``faust/transport/drivers/aiokafka.py``) hands aiokafka its live set of active partitions, and aiokafka's
   ``Fetcher.fetched_records`` (``aiokafka/consumer/fetcher.py``: ``if partitions and tp not in partitions``)
   reads an empty set as "every partition". When the set emptied during a fetch (the changelogs paused at the
   end of a recovery, the source partitions not yet resumed), the fetch returned the source partitions'
   buffered records; Faust dropped them as not active, past the seek that should have brought them back (seen:
   a claim written while no worker ran, never folded). Patched: the fetch sees the set through
   :class:`ActivePartitions`, which follows it as it changes (a partition resumed while the fetch waits is
   taken when the fetch next wakes, as before) but is never "every partition".

5. **Faust's producer is idempotent.** A setting Faust does not offer: its ``Producer._settings_extra``
   (``faust/transport/drivers/aiokafka.py``) turns on aiokafka's ``enable_idempotence`` only for
   ``processing_guarantee="exactly_once"``. Patched: always on, with ``acks="all"`` (which idempotence
   requires), so a retried send of a changelog write, a dead letter or a timer event is neither duplicated nor
   reordered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Set
from typing import Any

log = logging.getLogger("litstream.lifecycle")
_applied: set[str] = set()
_side_flushes: list[Callable[[], Awaitable[None]]] = []


def apply() -> None:
    """Apply the corrections (each once per process)."""
    _complete_buffer_flush()
    _side_producers_flushed()
    _uncommitted_read_from_start()
    _streams_resumed_after_the_seek()
    _emptied_set_fetches_none()
    _idempotent_producer()


def _complete_buffer_flush() -> None:
    if "flush" in _applied:
        return
    from faust.transport.producer import ProducerBuffer

    send_pending = ProducerBuffer._send_pending

    async def counted_send(self: Any, fut: Any) -> None:
        self._litstream_sending = getattr(self, "_litstream_sending", 0) + 1
        try:
            await send_pending(self, fut)
        finally:
            self._litstream_sending -= 1
            self.message_sent.set()  # also wakes a flush when the send failed

    async def flush_all(self: Any) -> None:
        while self.size or getattr(self, "_litstream_sending", 0):
            if self.state != "running":
                raise RuntimeError("Cannot flush: Producer not Running")
            self.message_sent.clear()
            try:
                await asyncio.wait_for(self.message_sent.wait(), timeout=1.0)
            except TimeoutError:
                continue  # still sending (a slow broker): keep waiting; a dead producer stops the loop above

    ProducerBuffer._send_pending = counted_send  # type: ignore[method-assign]
    ProducerBuffer.flush = flush_all  # type: ignore[method-assign]
    _applied.add("flush")


def flush_with_faust(flush: Callable[[], Awaitable[None]]) -> None:
    """Await ``flush()`` whenever Faust's producer flushes (before each offset commit; see 2. above)."""
    _side_flushes.append(flush)


def _side_producers_flushed() -> None:
    if "side-flush" in _applied:
        return
    from faust.transport.drivers.aiokafka import Producer

    flush = Producer.flush

    async def flush_all_producers(self: Any) -> None:
        await flush(self)
        for side in list(_side_flushes):
            await side()

    Producer.flush = flush_all_producers  # type: ignore[method-assign]
    _applied.add("side-flush")


async def seek_to_committed_or_start(consumer: Any, leave: Callable[[Any], bool]) -> dict[Any, int | None]:
    """Seek ``consumer`` (an aiokafka consumer) to its committed offsets, and each assigned partition that has none
    (or 0) to its beginning, except those ``leave`` names (see 3. above). Returns the offsets sought, the
    beginnings standing in for the missing commits, so that the caller treats both alike. The seeks are
    immediate, as aiokafka's own seek to a committed offset is: no reset is left pending while Faust's fetcher
    runs."""
    committed: dict[Any, int | None] = dict(await consumer.seek_to_committed())
    from_start = [tp for tp, offset in committed.items() if not offset and not leave(tp)]
    if from_start:
        starts = await consumer.beginning_offsets(from_start)
        for tp in from_start:
            consumer.seek(tp, starts[tp])
            committed[tp] = starts[tp]
    sought = {f"{tp.topic}[{tp.partition}]": (offset, "start" if tp in from_start else "committed")
              for tp, offset in committed.items() if not leave(tp)}
    log.info("reading on from %s", ", ".join(f"{k} at {o} ({why})" for k, (o, why) in sorted(sought.items())))
    return committed


def _uncommitted_read_from_start() -> None:
    if "seek-start" in _applied:
        return
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    async def seek(self: Any) -> Mapping[Any, int | None]:
        changelogs = self.consumer.app.tables.changelog_topics
        return await self.call_thread(seek_to_committed_or_start, self._ensure_consumer(),
                                      lambda tp: tp.topic in changelogs)

    AIOKafkaConsumerThread.seek_to_committed = seek  # type: ignore[method-assign,assignment]
    _applied.add("seek-start")


def resumed_last(original: Callable[..., Awaitable[None]]) -> Callable[..., Awaitable[None]]:
    """``original`` (a recovery step that resumes the stream partitions, seeks them and resumes the flow) with the
    partitions it resumes held back until it is done, and then resumed if no rebalance came meanwhile."""

    async def step(self: Any, generation_id: int = 0) -> None:
        consumer = self.app.consumer
        held: list[set[Any]] = []
        consumer.resume_partitions = lambda tps: held.append(set(tps))  # shadows the method for the step
        try:
            await original(self, generation_id)
        finally:
            del consumer.resume_partitions
        if self.app.consumer_generation_id == generation_id:
            for tps in held:
                consumer.resume_partitions(tps)

    return step


def _streams_resumed_after_the_seek() -> None:
    if "resume-last" in _applied:
        return
    from faust.tables.recovery import Recovery

    Recovery.on_recovery_completed = resumed_last(Recovery.on_recovery_completed)  # type: ignore[method-assign,assignment]
    Recovery._resume_streams = resumed_last(Recovery._resume_streams)  # type: ignore[method-assign,assignment]
    _applied.add("resume-last")


class ActivePartitions:
    """Faust's live set of active partitions as aiokafka's fetch reads it (``partitions and tp not in partitions``):
    membership follows the set while the fetch waits, and the view is never empty, so an emptied set means no
    partition rather than aiokafka's "every partition"."""

    __slots__ = ("_live",)

    def __init__(self, live: Set[Any]) -> None:
        self._live = live

    def __bool__(self) -> bool:
        return True

    def __contains__(self, tp: object) -> bool:
        return tp in self._live


def _emptied_set_fetches_none() -> None:
    if "fetch-active" in _applied:
        return
    from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread

    getmany = AIOKafkaConsumerThread.getmany

    async def getmany_of_the_active(self: Any, active_partitions: Any, timeout: float) -> Any:
        if active_partitions is None:  # client-only mode: every partition
            return await getmany(self, None, timeout)
        return await getmany(self, ActivePartitions(active_partitions), timeout)  # type: ignore[arg-type]

    AIOKafkaConsumerThread.getmany = getmany_of_the_active  # type: ignore[method-assign]
    _applied.add("fetch-active")


def _idempotent_producer() -> None:
    if "idempotent" in _applied:
        return
    from faust.transport.drivers.aiokafka import Producer

    extra = Producer._settings_extra

    def idempotent_extra(self: Any) -> Mapping[str, Any]:
        return {**extra(self), "acks": "all", "enable_idempotence": True}

    Producer._settings_extra = idempotent_extra  # type: ignore[method-assign]
    _applied.add("idempotent")
