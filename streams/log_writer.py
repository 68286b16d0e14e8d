"""The store's writes: one idempotent producer, its delivery reports served by a thread of its own, and the
replica of the fold (``rollout_replica``) that answers each lifecycle event after one trip through the log."""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any, TypeVar

from litstream.infra import metrics
from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.events import Event, RolloutEnqueued, SequenceRequested

from .deadletter import DeadLetter
from .rollout_replica import Folded, RolloutReplica
from .views import TopicFollower

T = TypeVar("T")
# The store's producer: a call waits for its records, so any linger is pure latency (measured on the embedded
# broker: acknowledged in 0.26 ms at linger 0, 1.4 ms at 1, 5.7 ms at 5); under load the records of concurrent
# calls still share batches, queued while earlier requests are in flight.
STORE_LINGER_MS = 0


class StoreError(RuntimeError):
    """The pipeline did not answer in time (a processor is down or far behind), or the broker refused a write."""


def fail_on_error(fut: Future[Any]) -> Callable[[Any, Any], None]:
    """A delivery callback that fails ``fut`` when the broker refused the record."""
    def report(err: Any, msg: Any) -> None:
        if err is not None and not fut.done():
            try:
                fut.set_exception(StoreError(f"the event was not written to {msg.topic()}: {err}"))
            except InvalidStateError:  # answered meanwhile
                pass

    return report


def also(first: Callable[[Any, Any], None], second: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    """One delivery callback that calls two."""
    def report(err: Any, msg: Any) -> None:
        first(err, msg)
        second(err, msg)

    return report


def _serve_deliveries(events: weakref.ref[EventProducer], closing: threading.Event) -> None:
    """Serve a store's delivery reports until it closes, or is dropped unclosed (a weak reference, so an
    unclosed store's producer is still freed and stops calling its broker)."""
    while not closing.is_set():
        producer = events()
        if producer is None:
            return
        producer.poll(0.05)
        del producer


class LogWriter:
    """``wait_s`` bounds every wait for the broker or the replica. ``on_enqueued(event, partition)`` is told of
    every new rollout the broker acknowledged (from the delivery thread). ``role`` names the writer in event
    metadata and metrics; ``keep_finished`` bounds the replica (``RolloutReplica``)."""

    def __init__(self, settings: Settings, wait_s: float, role: str = "store",
                 keep_finished: int | None = None) -> None:
        self.wait_s = wait_s
        self.role = role
        self.events = EventProducer(settings, role, None, **{"linger.ms": STORE_LINGER_MS})
        self.codec = self.events.codec
        self.rollouts = RolloutReplica(settings, self.codec, keep_finished)
        self.on_enqueued: Callable[[RolloutEnqueued, int], None] = lambda _event, _partition: None
        # Delivery reports are served by a thread of their own, so a call waits for its acknowledgement (or its
        # failure) as an asyncio future, not by flushing the producer from a thread of the pool.
        self._closing = threading.Event()
        self._deliveries = threading.Thread(target=_serve_deliveries, args=(weakref.ref(self.events), self._closing),
                                            name="store-deliveries", daemon=True)
        self._deliveries.start()

    async def close(self) -> None:
        await asyncio.to_thread(self.events.flush)
        self._closing.set()
        self._deliveries.join(timeout=5)
        self.rollouts.close()
        await asyncio.to_thread(self.events.close)  # let go of the producer: none left retrying a gone broker

    def dead_letter(self, letter: DeadLetter) -> None:
        """A record that cannot be used, to its topic's dead letters (sent with the next batch)."""
        self.events.produce_raw(letter.topic, letter.key, letter.value, headers=letter.headers())
        metrics.record_dead_letter(self.role, letter.source_topic, letter.error_type)

    async def write(self, event: Event) -> Folded:
        """Produce a lifecycle event and return what it did (accepted or not), folded in log order."""
        (fut,) = self.send_lifecycle([event])
        return await self.outcome(fut, event)

    def send_lifecycle(self, events: Sequence[Event]) -> list[Future[Folded]]:
        """Produce lifecycle events; a future per event gets what it did, or the delivery's failure. The replica
        folds an event as soon as the broker acknowledges it, if nothing else came before it (module docstring of
        ``rollout_replica``)."""
        futures = []
        for event in events:
            fut = self.rollouts.expect(event.meta.event_id)
            self.events.send(self.events.topics.rollout_events, event, on_delivery=self.lifecycle_report(event, fut))
            futures.append(fut)
        return futures

    def lifecycle_report(self, event: Event, fut: Future[Folded] | None) -> Callable[[Any, Any], None]:
        """The delivery callback of every lifecycle event this store writes (``fut``: the waiter of its answer, if
        any): each acknowledgement lets the replica fold it at once, and keeps that possible for the next."""
        def report(err: Any, msg: Any) -> None:
            if err is not None:
                if fut is not None:
                    self.rollouts.forget(event.meta.event_id)
                    fail_on_error(fut)(err, msg)
                return
            partition = int(msg.partition() or 0)
            if isinstance(event, RolloutEnqueued) and event.start_attempt_id is None:
                self.on_enqueued(event, partition)
            self.rollouts.acknowledged(partition, int(msg.offset() or 0), event)

        return report

    def acks(self, n: int) -> tuple[asyncio.Future[None], Callable[[Any, Any], None]]:
        """A future resolved once ``n`` records are acknowledged (or failed at the first failure), and the
        delivery callback to produce them with."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        left = [n]

        def settle(err: Any) -> None:
            if done.done():
                return
            if err is not None:
                done.set_exception(StoreError(f"a record was not written to Kafka: {err}"))
            elif left[0] <= 0:
                done.set_result(None)

        def report(err: Any, _msg: Any) -> None:
            left[0] -= 1
            if err is not None or left[0] <= 0:
                loop.call_soon_threadsafe(settle, err)

        if n <= 0:
            done.set_result(None)
        return done, report

    async def acknowledged(self, acked: asyncio.Future[None], what: str) -> None:
        try:
            await asyncio.wait_for(acked, timeout=self.wait_s)
        except TimeoutError:
            raise StoreError(f"the broker did not acknowledge {what} within {self.wait_s:.0f}s; is it up? "
                             "(litstream status)") from None

    async def until(self, view: TopicFollower, predicate: Callable[[], T | None], timeout: float,
                     sent: tuple[str, Any] | None = None) -> T | None:
        """``predicate()`` once it has an answer after a batch of ``view``, or None when the time is up. With
        ``sent`` (topic, record), the record is produced first, and its refusal by the broker ends the wait."""
        fut = view.until(predicate)
        if sent is not None:
            self.events.send(sent[0], sent[1], on_delivery=fail_on_error(fut))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(fut), timeout)
        except TimeoutError:
            return None

    async def outcome(self, fut: Future[Folded], event: Event) -> Folded:
        (done,) = await self.outcomes([fut], [event])
        return done

    async def outcomes(self, futures: Sequence[Future[Folded]], events: Sequence[Event]) -> list[Folded]:
        """What each event did, once all are answered: one wake-up of the event loop for the batch, not one
        future, timer and thread hand-over per event (a third of an enqueue's cost in ``enqueue_many``)."""
        if not futures:
            return []
        loop = asyncio.get_running_loop()
        all_answered: asyncio.Future[None] = loop.create_future()
        left = [len(futures)]
        lock = threading.Lock()

        def settle() -> None:
            if not all_answered.done():
                all_answered.set_result(None)

        def answered(_fut: Future[Folded]) -> None:
            with lock:
                left[0] -= 1
                last = left[0] == 0
            if last:
                loop.call_soon_threadsafe(settle)

        for fut in futures:
            fut.add_done_callback(answered)
        try:
            await asyncio.wait_for(all_answered, timeout=self.wait_s)
        except TimeoutError:
            for event in events:
                self.rollouts.forget(event.meta.event_id)
            late = next((e for f, e in zip(futures, events) if not f.done()), events[0])
            raise StoreError(f"no answer within {self.wait_s:.0f}s for {type(late).__name__} of {late.rollout_id}: "
                             "the log was not read back to it; is the broker up? (litstream status)") from None
        return [fut.result() for fut in futures]  # a write the broker refused raises its StoreError here

    async def reserve(self, runs: Sequence[tuple[str, str, int]]) -> list[int]:
        """The first of ``count`` span sequence ids for each (rollout id, attempt id, count), reserved through the
        rollout's partition, so they are strictly increasing per rollout in the order they are handed out,
        whichever process asks (the store's ``get_next_span_sequence_id``, the policy endpoint's calls)."""
        events = [SequenceRequested(meta=self.events.factory.meta(rid), attempt_id=aid, count=n) for rid, aid, n in runs]
        firsts = []
        for done in await self.outcomes(self.send_lifecycle(events), events):
            if not done.accepted or done.snapshot is None or done.snapshot.last_reserved is None:
                raise ValueError(done.reason or "rejected")
            firsts.append(done.snapshot.last_reserved)
        return firsts
