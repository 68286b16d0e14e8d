"""The offers side of a claimant: a member of the runners' consumer group on ``rollout-offers`` that hands
offers out oldest first, keeps which of them are handled and commits only those. A store's member leaves the
group when no dequeue comes; a runner's stays while its slots are busy, its partitions paused. The claims are
``claims.Claims``'s."""

from __future__ import annotations

import asyncio
import heapq
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from confluent_kafka import TopicPartition

from litstream.infra.kafka import Backpressure, PartitionEnds, consumer
from litstream.infra.settings import Settings
from litstream.infra.topics import Topics
from litstream.schemas.codec import Codec, DecodeError
from litstream.schemas.events import Event, RolloutEnqueued, RolloutOffered, RolloutSnapshot

from . import fold
from .deadletter import DeadLetter
from .rollout_replica import RolloutReplica
from .state import RolloutState

log = logging.getLogger("litstream.offers")
# Offers read ahead of the claims at most; how long a dequeue waits for one while none is at hand, and, with
# offers at hand, for partitions just assigned to answer (one may hold an older offer).
OFFER_READ_AHEAD = 4096
OFFER_WAIT_S = 2.0
OFFER_ORDER_WAIT_S = 0.5
OFFER_WAIT_SLICE_S = 0.25  # a waiting claimant's fetches: other work on the offers thread waits at most this long
OFFER_IDLE_S = 10.0  # a store that served no dequeue for this long leaves the runners' group
OFFER_COMMIT_EVERY_S = 0.2  # handled offers are committed together, at most this late
OFFER_HOLD_POLL_S = 0.1  # how long one poll of a member with every partition paused waits

T = TypeVar("T")
Taken = tuple[RolloutOffered, tuple[int, int]]  # an offer and its (partition, offset)


class OfferLedger:
    """The offers one store has taken, per partition, and which of them are handled (their claim's outcome is
    known): the offset to commit is the first one not handled, so an offer whose claim is still travelling is
    read again after a restart rather than lost. Thread-safe: rebalances are told on the consumer's thread."""

    def __init__(self) -> None:
        self._pending: dict[int, set[int]] = {}
        self._next: dict[int, int] = {}  # partition -> one past the highest offset handled
        self._committed: dict[int, int] = {}
        self._lock = threading.Lock()

    def taken(self, offers: Iterable[tuple[int, int]]) -> None:
        with self._lock:
            for partition, offset in offers:
                self._pending.setdefault(partition, set()).add(offset)

    def handled(self, offers: Iterable[tuple[int, int]]) -> dict[int, int]:
        """Mark offers handled; the new commit position of each partition that moved forward. A negative offset
        marks an offer this store made itself (``LitStore._offer_own_enqueues``)."""
        moved: dict[int, int] = {}
        with self._lock:
            touched = set()
            for partition, offset in offers:
                if offset < 0:
                    continue  # an offer made here, not read from the topic: nothing to commit
                self._pending.get(partition, set()).discard(offset)
                self._next[partition] = max(self._next.get(partition, 0), offset + 1)
                touched.add(partition)
            for partition in touched:
                pending = self._pending.get(partition)
                position = min(pending) if pending else self._next[partition]
                if position > self._committed.get(partition, -1):
                    self._committed[partition] = moved[partition] = position
        return moved

    def forget(self, partitions: Iterable[int]) -> None:
        with self._lock:
            for p in partitions:
                self._pending.pop(p, None)
                self._next.pop(p, None)
                self._committed.pop(p, None)


def offer_queue_time(offer: RolloutOffered, snap: RolloutSnapshot | None) -> float:
    """When a rollout joined the queue, the order Agent Lightning's single queue keeps (pure): a first offer
    counts from the rollout's enqueue (its ``start_time``, stamped where it was enqueued, so rollouts folded on
    different partitions still compare in the order they were enqueued); a retry from when it went back on offer.
    A rollout this store has not seen yet counts from its offer."""
    if offer.attempt_sequence == 1 and snap is not None:
        return snap.start_time
    return offer.meta.timestamp_ns / 1e9


class OfferQueue:
    """Offers read from the consumer and not handed out yet, handed out oldest first (:func:`offer_queue_time`)
    whatever partition they came from. Used on the offers thread only."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, tuple[int, int], RolloutOffered]] = []

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, at: float, offer: RolloutOffered, where: tuple[int, int]) -> None:
        heapq.heappush(self._heap, (at, where, offer))  # (partition, offset) is unique: offers never compared

    def pop(self, n: int) -> list[tuple[RolloutOffered, tuple[int, int]]]:
        out: list[tuple[RolloutOffered, tuple[int, int]]] = []
        while self._heap and len(out) < n:
            _, where, offer = heapq.heappop(self._heap)
            out.append((offer, where))
        return out

    def forget(self, partitions: Iterable[int]) -> None:
        """Partitions this consumer no longer owns: their offers go to the next owner, from the committed offset."""
        gone = set(partitions)
        if gone:
            self._heap = [item for item in self._heap if item[1][0] not in gone]
            heapq.heapify(self._heap)


class OfferReader:
    """One store's offers. ``rollouts`` (the store's replica) orders first offers by enqueue time and tells
    stale offers. Safe for the tasks of one event loop; the consumer lives on a thread of its own (a consumer is
    not for several threads at once), so a dequeue never waits for a thread of a shared pool."""

    def __init__(self, settings: Settings, codec: Codec, rollouts: RolloutReplica, *,
                 read_ahead: int = OFFER_READ_AHEAD, leave_when_idle: bool = True, role: str = "store",
                 on_undecodable: Callable[[DeadLetter], None] = lambda _letter: None) -> None:
        self._settings = settings
        self.codec = codec
        self.rollouts = rollouts
        self.topic = Topics(settings.topic_prefix).offers
        self.read_ahead = read_ahead
        self.leave_when_idle = leave_when_idle  # a runner's member stays: the group is how runners share offers
        self.role = role  # names the reader in its dead letters
        self.on_undecodable = on_undecodable
        self._consumer: Any = None
        self._gate: Backpressure | None = None  # pauses the assignment while the claimant is busy (``hold``)
        self._held_once = False
        self._ends = PartitionEnds()  # offer partitions read to their end: the queue is empty there
        self._ledger = OfferLedger()
        self._queue = OfferQueue()  # read ahead, handed out in enqueue order
        self._assigned: set[int] = set()  # this member's offer partitions, as the rebalance callbacks tell them
        self._heard: set[int] = set()  # offer partitions that delivered a record since they were assigned
        self._all_heard = False  # every assigned one has, since the last rebalance
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="offers")
        # Held while the consumer, the queue or the ledger's positions are in use: by the offers thread's work,
        # and by a take answered on the caller's thread when the thread is idle (``_ready``).
        self._using = threading.RLock()
        self._lock = asyncio.Lock()
        self._in_use = 0  # dequeue calls in progress
        self._last_use = 0.0  # when the last one ended (monotonic)
        # Rollouts enqueued or requeued here, with their partition, once the broker holds them: put on offer at once
        # when the partition is this consumer's (``_offer_own_enqueues``), without waiting for the processor's offer.
        self._enqueued_here: deque[tuple[RolloutEnqueued | RolloutOffered, int]] = deque(maxlen=OFFER_READ_AHEAD)
        self._own = 0
        self._to_commit: dict[int, int] = {}  # partition -> position, committed together (``_commit``)
        self._commit_due = False
        self._commit_lock = threading.Lock()

    def enqueued_here(self, event: RolloutEnqueued, partition: int) -> None:
        """The broker holds a rollout this store enqueued (any thread)."""
        self._enqueued_here.append((event, partition))

    def offered_here(self, event: Event, state: RolloutState, attempt_sequence: int, partition: int) -> None:
        """An update written here put its rollout back on offer for attempt ``attempt_sequence`` (told by the
        replica as it folds it, before the writer's answer): a dequeue after it finds the rollout here, as the
        reference's queue has it, without waiting for the processor's offer (any thread)."""
        self._enqueued_here.append((RolloutOffered.rebuilt(
            meta=event.meta, attempt_sequence=attempt_sequence, input=state.input, mode=state.mode,
            resources_id=state.resources_id, config=state.config, metadata=state.metadata), partition))

    @asynccontextmanager
    async def in_use(self) -> AsyncIterator[None]:
        """Around a dequeue: the group is left ``OFFER_IDLE_S`` after the last one ends."""
        self._in_use += 1
        try:
            yield
        finally:
            self._in_use -= 1
            self._last_use = time.monotonic()
            asyncio.get_running_loop().call_later(OFFER_IDLE_S, self._leave_if_idle)

    async def take(self, limit: int) -> list[Taken]:
        """Up to ``limit`` offers whose claim could still win, oldest first; empty when none is on offer here.
        Only taking offers is serialised; the claims of concurrent calls travel side by side."""
        async with self._lock:
            ready = self._ready(limit)
            if ready is not None:
                return ready
            return await self._on_thread(self._next, limit)

    async def _on_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._holding, fn, *args)

    def _holding(self, fn: Callable[..., T], *args: Any) -> T:
        with self._using:
            return fn(*args)

    def _ready(self, limit: int) -> list[Taken] | None:
        """The offers a take can have at once, on the caller's thread (no hand-over to the offers thread and
        back: a third of a dequeue); None when the offers thread is busy, or the take would have to wait."""
        if self._consumer is None or not self._using.acquire(blocking=False):
            return None
        try:
            return self._at_hand(limit) or None
        finally:
            self._using.release()

    def handled(self, offers: Iterable[Taken]) -> None:
        """Their claims' outcomes are known, whoever won: commit what that allows."""
        self._commit(self._ledger.handled(where for _, where in offers))

    def retry(self, offers: Iterable[Taken]) -> None:
        """Offers whose claims are not known to be durable: back in the queue, claimed again by a later take
        (an offer whose first claim did land is stale by then, and handled without a claim)."""
        again = list(offers)

        def put_back() -> None:
            for offer, where in again:
                self._queue.push(offer_queue_time(offer, self.rollouts.snapshots.get(offer.rollout_id)), offer, where)

        self._thread.submit(self._holding, put_back)

    async def wait(self, timeout: float) -> None:
        """Until an offer reaches this consumer or ``timeout`` passes: a claimant that found nothing to take waits
        here (a fetch that returns as soon as a record comes) instead of asking again at once."""
        await self._on_thread(self._wait, timeout)

    def _wait(self, timeout: float) -> None:
        if self._consumer is None:
            self._join()
        assert self._consumer is not None and self._gate is not None
        self._gate.release()
        deadline = time.monotonic() + timeout
        while not len(self._queue) and (left := deadline - time.monotonic()) > 0:
            msg = self._consumer.poll(min(left, OFFER_WAIT_SLICE_S))
            if msg is not None:
                self._read([msg])

    async def hold(self) -> None:
        """While the claimant can take nothing (every slot busy): stay in the group, fetching nothing. Call it
        again within ``max.poll.interval.ms``; the next :meth:`take` resumes fetching."""
        await self._on_thread(self._hold)

    def _hold(self) -> None:
        if self._consumer is None or self._gate is None:
            return
        self._gate.hold()
        self._held_once = True
        msg = self._consumer.poll(OFFER_HOLD_POLL_S)
        if msg is not None:
            self._gate.put_back(msg)

    async def close(self) -> None:
        if self._consumer is not None:
            await self._on_thread(self._commit_now)
            await self._on_thread(self._consumer.close)
        self._thread.shutdown(wait=False)

    def _pop_fresh(self, limit: int) -> list[Taken]:
        """Up to ``limit`` of the oldest offers at hand whose claim could still win (on the offers thread)."""
        fresh: list[Taken] = []
        while len(fresh) < limit and len(self._queue):
            fresh += self._drop_stale(self._queue.pop(limit - len(fresh)))
        return fresh

    def _drop_stale(self, offers: list[tuple[RolloutOffered, tuple[int, int]]]
                    ) -> list[tuple[RolloutOffered, tuple[int, int]]]:
        """The offers whose claim could still win, as this store's replica knows the rollout: one whose attempt it
        shows already claimed (by a runner, or through the other offer of a rollout enqueued or requeued here) is
        handled without a claim. The replica may lag the offer (a retry offered before the replica folds the
        failure behind it, a finished rollout an update put back on the queue): that offer is claimed, and the
        claim, appended after the requeue, is folded after it."""
        fresh: list[tuple[RolloutOffered, tuple[int, int]]] = []
        stale: list[tuple[RolloutOffered, tuple[int, int]]] = []
        for offer, where in offers:
            state = self.rollouts.states.get(offer.rollout_id)
            (stale if state is not None and fold.offer_outdated(state, offer.attempt_sequence) else fresh).append((offer, where))
        if stale:
            self.handled(stale)
        return fresh

    def _leave_if_idle(self) -> None:
        """Leave the runners' group once no dequeue came for ``OFFER_IDLE_S``: a member that stops polling keeps
        its partitions (and stalls the group's rebalances) until the broker evicts it minutes later, so offers
        there would reach no runner. Offers read ahead but not claimed were never committed: the partitions' next
        owners read them again. The next dequeue joins again."""
        if (not self.leave_when_idle or self._consumer is None or self._in_use
                or time.monotonic() - self._last_use < OFFER_IDLE_S - 0.01):
            return
        self._thread.submit(self._holding, self._leave)

    def _leave(self) -> None:
        if self._consumer is None or self._in_use:
            return
        self._commit_now()
        leaving, self._consumer, self._gate = self._consumer, None, None
        try:
            leaving.close()  # commits nothing of its own (auto commit is off) and leaves the group at once
        except Exception as exc:  # noqa: BLE001 - the broker is gone: the group evicts this member in time
            log.warning("leaving the runners' group failed: %s", exc)
        self._ends, self._ledger, self._queue = PartitionEnds(), OfferLedger(), OfferQueue()
        self._heard, self._all_heard, self._assigned, self._held_once = set(), False, set(), False

    def _commit(self, positions: dict[int, int]) -> None:
        """Commit the offers consumer's positions within ``OFFER_COMMIT_EVERY_S``, not waited for, several
        dequeues' at once (a commit is a write on the broker): a commit lost or late only means an offer read
        again by the partition's next owner, who drops it as stale or whose claim the fold refuses."""
        if not positions:
            return
        with self._commit_lock:
            self._to_commit.update(positions)
            if self._commit_due:
                return
            self._commit_due = True
        timer = threading.Timer(OFFER_COMMIT_EVERY_S, self._commit_soon)
        timer.daemon = True
        timer.start()

    def _commit_soon(self) -> None:
        try:
            self._thread.submit(self._holding, self._commit_now)
        except RuntimeError:  # closed meanwhile: close() committed what was due
            pass

    def _commit_now(self, partitions: Iterable[int] | None = None) -> None:
        """Commit what is due (of ``partitions`` only, when given), on the offers thread."""
        with self._commit_lock:
            chosen = set(self._to_commit) if partitions is None else set(partitions) & set(self._to_commit)
            positions = {p: self._to_commit.pop(p) for p in chosen}
            if partitions is None:
                self._commit_due = False
        if not positions or self._consumer is None:
            return
        try:
            self._consumer.commit(offsets=[TopicPartition(self.topic, p, o) for p, o in positions.items()],
                                  asynchronous=True)
        except Exception as exc:  # noqa: BLE001 - see above
            log.warning("committing offers %s failed: %s", positions, exc)

    def _next(self, limit: int) -> list[tuple[RolloutOffered, tuple[int, int]]]:
        """Up to ``limit`` offers with their (partition, offset), the oldest first across every partition this
        consumer owns, as the reference's one queue hands them out (docs/api.md, "Queue order"). Reads what the
        consumer has fetched (up to ``OFFER_READ_AHEAD`` waiting here). With offers waiting, it first waits (at
        most ``OFFER_ORDER_WAIT_S``) until every partition has delivered a record or its end since it was
        assigned; with none, until one comes, every partition is known to be at its end (the queue is empty: no
        offers) or ``OFFER_WAIT_S`` passes. Stale offers are dropped on the way. Offers read count as taken (the ledger keeps their offsets from being
        committed) until their claims are answered."""
        if self._consumer is None:
            self._join()
        start = time.monotonic()
        while True:
            if fresh := self._at_hand(limit):
                return fresh
            assigned = self._assigned
            waited = time.monotonic() - start
            if len(self._queue):
                # Just assigned, a partition may not have answered yet: an older offer may be on its way there.
                self._all_heard = assigned <= self._ends.at_end | self._heard
                if (self._all_heard or waited >= OFFER_ORDER_WAIT_S) and (fresh := self._pop_fresh(limit)):
                    return fresh
            elif self._ends.covers(assigned) or waited >= OFFER_WAIT_S:
                return []
            msg = self._consumer.poll(0.02)
            if msg is not None:
                self._read([msg])

    def _at_hand(self, limit: int) -> list[Taken]:
        """What the consumer has fetched and this store enqueued, read into the queue; up to ``limit`` fresh
        offers from it when every partition has answered since it was assigned (else none: see :meth:`_next`)."""
        assert self._gate is not None
        if self._held_once:  # partitions paused once may come back paused from a rebalance: resume them
            self._gate.release()
        while len(self._queue) < self.read_ahead:
            wanted = self.read_ahead - len(self._queue)
            msgs = self._consumer.consume(wanted, timeout=0)
            self._read(msgs)
            if len(msgs) < wanted:  # all that was fetched (each call into the client costs a hand-over of the GIL)
                break
        self._offer_own_enqueues(self._assigned)
        if len(self._queue) and self._all_heard:
            return self._pop_fresh(limit)
        return []

    def _offer_own_enqueues(self, assigned: set[int]) -> None:
        """Put rollouts enqueued (or requeued: :meth:`offered_here`) here on offer at once when their partition is
        this consumer's: the processor's offer would bring the same rollout one trip through the log later (a
        dequeue right after an enqueue finds it, as in the reference). The processor's offer still comes; whichever
        is claimed first wins (the fold takes one claim per attempt) and the other is stale (:meth:`_drop_stale`)."""
        while self._enqueued_here:
            told, partition = self._enqueued_here.popleft()
            if partition not in assigned:
                continue  # that partition's consumer hands it out, from the processor's offer
            offer = told if isinstance(told, RolloutOffered) else RolloutOffered.rebuilt(
                meta=told.meta, attempt_sequence=1, input=told.input, mode=told.mode, resources_id=told.resources_id,
                config=told.config, metadata=told.metadata)
            self._own += 1
            self._queue.push(offer_queue_time(offer, self.rollouts.snapshots.get(offer.rollout_id)), offer,
                             (partition, -self._own))  # no offset: nothing to commit

    def _join(self) -> None:
        self._consumer = consumer(self._settings, group_id=f"{self._settings.topic_prefix}-runners",
                                **{"enable.partition.eof": True})
        self._consumer.subscribe([self.topic], on_assign=self._partitions_assigned,
                                 on_revoke=self._partitions_revoked, on_lost=self._partitions_revoked)
        self._gate = Backpressure(self._consumer)
        # Joining the group takes a few seconds; only the first dequeue waits for it.
        joined_by = time.monotonic() + 15.0
        while not self._consumer.assignment() and time.monotonic() < joined_by:
            msg = self._consumer.poll(0.1)
            if msg is not None:
                self._read([msg])

    def _read(self, msgs: list[Any]) -> None:
        taken = []
        for msg in msgs:
            if not self._ends.record(msg):
                continue
            where = (int(msg.partition() or 0), int(msg.offset() or 0))
            self._heard.add(where[0])
            offer = self._decode(msg, where)
            if offer is None:
                continue
            self._queue.push(offer_queue_time(offer, self.rollouts.snapshots.get(offer.rollout_id)), offer, where)
            taken.append(where)
        self._ledger.taken(taken)

    def _partitions_assigned(self, c: Any, partitions: list[TopicPartition]) -> None:
        self._assigned = self._assigned | {tp.partition for tp in partitions}
        self._partitions_moved(c, partitions)

    def _partitions_revoked(self, c: Any, partitions: list[TopicPartition]) -> None:
        self._assigned = self._assigned - {tp.partition for tp in partitions}
        self._partitions_moved(c, partitions)

    def _partitions_moved(self, _c: Any, partitions: list[TopicPartition]) -> None:
        self._commit_now(tp.partition for tp in partitions)  # revoked: their next owner starts from here
        self._ends.forget(tp.partition for tp in partitions)
        self._ledger.forget(tp.partition for tp in partitions)
        self._queue.forget(tp.partition for tp in partitions)
        self._heard.difference_update(tp.partition for tp in partitions)
        self._all_heard = False

    def _decode(self, msg: Any, where: tuple[int, int]) -> RolloutOffered | None:
        """The offer, or None for bytes that are not one: those go to the dead letters (and are never taken, so
        the commit passes over them once a later offer is handled)."""
        try:
            return self.codec.decode_as(msg.value(), RolloutOffered)
        except DecodeError as exc:
            self.on_undecodable(DeadLetter(self.topic, where[0], where[1], msg.key(), msg.value(), exc.reason,
                                           self.role, "decode"))
            return None
