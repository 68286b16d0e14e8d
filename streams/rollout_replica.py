"""The store's replica of the fold: ``rollout-events`` folded in log order in this process, so a writer learns what
its own event did as soon as the broker has acknowledged it — one trip through the log instead of two.

The lifecycle processor folds the same log with the same pure fold; it stays the one that writes the table, the
snapshots, the offers and the timers. The replica answers its own writers and serves reads:

* A follower thread reads every partition from the beginning and folds each record (``log_records`` decides which
  records the fold sees, as it does for the processor and replay). ``_folded[p]`` is the last offset folded.
* When the broker acknowledges an event this process wrote at offset ``o`` of partition ``p`` and the replica has
  folded exactly up to ``o - 1`` there, nothing else can come before it: the event is folded at once, from the
  object that was written, and ``_folded[p]`` becomes ``o``; the follower skips it later. That is the usual case
  when this process writes a partition alone.
* Otherwise (another writer's records came between, or the follower has not reached them yet) the answer waits
  for the follower to fold up to ``o``, in order.

Either way every event is folded once, in the log's order, so the replica's state is what replay computes, and a
writer's answer (a claim won or lost, the sequence ids reserved) is the one the processor reaches.

A replica given ``keep_finished`` (the runner's, the store's, the policy server's) keeps only the
``keep_finished`` finished rollouts (succeeded, failed, cancelled) changed last, besides every unfinished one, so
its memory is bounded by the work in hand; the store reads the others from ClickHouse (``rollout_archive``). It
counts what it let go of (``let_go``, ``let_go_attempts``), so totals stay exact. A finished rollout can be reopened (the reference's
``update_rollout``, ``update_attempt`` and ``start_attempt``, through the Store API or ``/v1/agl``) and so be on
offer again: a later event of a rollout it let go of makes the replica fold that rollout again from its partition,
up to the event (:meth:`RolloutReplica._recall`), so its answer to a claim is the processor's.

When an event a writer here waits for puts its rollout back on offer (a requeue by an update), the listeners of
:meth:`RolloutReplica.on_own_offer` are told, so the writer's process can hand it out at once.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any, NamedTuple

from confluent_kafka import OFFSET_BEGINNING, KafkaException, TopicPartition

from litstream.infra.kafka import PartitionEnds, consumer
from litstream.infra.settings import Settings
from litstream.schemas.codec import Codec
from litstream.schemas.events import Event, RolloutEnqueued, RolloutSnapshot, SequenceRequested
from litstream.schemas.models import FINISHED

from . import fold
from .log_records import Unfoldable, lifecycle_event
from .state import RolloutState
from .views import TopicFollower

log = logging.getLogger("litstream.replica")
RECALL_WAIT_S = 30.0  # how long reading a partition again may wait for the broker
ABSENT_IDS = 10_000  # rollout ids a recall did not find (events of no rollout), not read for again
OwnOffer = Callable[[Event, RolloutState, int, int], None]  # (event, state after it, attempt number, partition)


class Folded(NamedTuple):
    """What one event did: the rollout before and after it (None: unknown rollout), and the snapshot a reader
    of ``rollout-state`` gets for it (None when the processor writes none: an unknown rollout)."""

    before: RolloutState | None
    after: RolloutState | None
    snapshot: RolloutSnapshot | None
    accepted: bool
    reason: str | None


class NewestFinished:
    """Which finished rollouts a bounded replica holds: the ``keep`` changed last, by their last event's time
    (``updated_ns``, what the archive's ``LetGo`` reads), then id. A min-heap over (time, id), so the held set is
    the same whatever order the partitions are read in (a replica catching up reads them one after another)."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._held: dict[str, int] = {}  # rollout id -> finish time
        self._order: list[tuple[int, str]] = []  # (finish time, id); entries of reopened rollouts go stale

    def hold(self, rollout_id: str, finished_ns: int | None) -> list[str]:
        """Note a rollout's last change (``finished_ns`` None: not finished, any more); the ids to let go of."""
        if finished_ns is None:
            self._held.pop(rollout_id, None)
            return []
        self._held[rollout_id] = finished_ns
        heapq.heappush(self._order, (finished_ns, rollout_id))
        gone: list[str] = []
        while len(self._held) > self.keep:
            ns, oldest = heapq.heappop(self._order)
            if self._held.get(oldest) == ns:
                del self._held[oldest]
                gone.append(oldest)
        if len(self._order) > 2 * len(self._held) + 64:  # drop the stale entries
            self._order = [(ns, rid) for ns, rid in self._order if self._held.get(rid) == ns]
            heapq.heapify(self._order)
        return gone


class RolloutReplica(TopicFollower):
    """Every rollout's state and snapshot, folded from ``rollout-events``; answers the events this process
    writes (:meth:`expect`, then :meth:`acknowledged` from the delivery report)."""

    def __init__(self, settings: Settings, codec: Codec, keep_finished: int | None = None) -> None:
        self.states: dict[str, RolloutState] = {}
        self.keep_finished = keep_finished
        self._finished = NewestFinished(keep_finished or 0)
        self._absent: OrderedDict[str, None] = OrderedDict()  # recalled in vain (``_recall``)
        self.let_go = 0  # rollouts let go of (finished, beyond ``keep_finished``), their attempts and statuses
        self.let_go_attempts = 0
        self.let_go_statuses: dict[str, int] = {}
        self.let_go_retried = 0  # their attempts beyond each one's first
        self.let_go_until_ns = 0  # the newest ``updated_ns`` let go of: every rollout let go of is at or before it
        self.recalled: set[str] = set()  # rollouts held again after they were let go of
        self._settings = settings
        self.snapshots: dict[str, RolloutSnapshot] = {}
        self._folded: dict[int, int] = {}  # partition -> the last offset folded
        # An answer goes out once the event is both folded and acknowledged (the writer's delivery report may come
        # after the follower has folded the record): whichever comes first waits here for the other.
        self._folded_first: dict[str, Folded] = {}
        self._acked_first: set[str] = set()
        self._on_fold: list[Callable[[Folded], None]] = []
        self._on_own_offer: list[OwnOffer] = []
        self._on_enqueued: list[Callable[[str, int, int], None]] = []
        super().__init__(settings, f"{settings.topic_prefix}.rollout-events", codec)

    def on_fold(self, listener: Callable[[Folded], None]) -> None:
        """Call ``listener`` (under the replica's lock) with what every accepted event did."""
        self._on_fold.append(listener)

    def on_enqueued(self, listener: Callable[[str, int, int], None]) -> None:
        """Call ``listener(rollout_id, partition, offset)`` (under the replica's lock) for each rollout's accepted
        enqueue, where it lies in the log."""
        self._on_enqueued.append(listener)

    def on_own_offer(self, listener: OwnOffer) -> None:
        """Call ``listener(event, state, attempt_sequence, partition)`` (under the replica's lock) when an event a
        writer of this process waits for puts its rollout on offer: a requeue by ``update_rollout`` or
        ``update_attempt``. (Enqueues are told by the writer itself, before they are folded.)"""
        self._on_own_offer.append(listener)

    def known(self, rollout_id: str) -> RolloutSnapshot:
        """The rollout's snapshot; an unknown rollout is the caller's error."""
        snap = self.snapshots.get(rollout_id)
        if snap is None:
            held = f" among the unfinished and the newest {self.keep_finished} finished" if self.let_go else ""
            raise ValueError(f"Rollout {rollout_id} not found{held}")
        return snap

    def expect(self, event_id: str) -> Future[Folded]:
        """Register before producing the event: the future gets what it did."""
        return super().expect(event_id)

    def forget(self, event_id: str) -> None:
        with self.changed:
            super().forget(event_id)  # the same lock, taken again (a condition's lock is reentrant)
            self._folded_first.pop(event_id, None)
            self._acked_first.discard(event_id)

    def acknowledged(self, partition: int, offset: int, event: Event) -> None:
        """The broker stored ``event`` at ``offset``: fold it now if it is the next record of its partition. Its
        answer goes out once it is folded, now or when the follower reaches it."""
        with self.changed:
            if self._folded.get(partition) == offset - 1:
                self._folded[partition] = offset
                self._fold(event, partition, offset)
                self._check_watchers()
            event_id = event.meta.event_id
            if event_id in self._waiters:
                done = self._folded_first.pop(event_id, None)
                if done is None:
                    self._acked_first.add(event_id)
                else:
                    _settle(self._waiters.pop(event_id), done)

    def _take(self, msg: Any) -> None:
        partition, offset = int(msg.partition() or 0), int(msg.offset() or 0)
        if not self._ends.record(msg):
            if partition not in self._folded and partition in self._ends.at_end:
                self._folded[partition] = offset - 1  # an end before any record: where the partition starts
            return
        if offset <= self._folded.get(partition, -1):
            return  # folded when its writer here was acknowledged
        self._folded[partition] = offset
        event = lifecycle_event(self.codec, self.topic, msg.key(), msg.value())
        if isinstance(event, Unfoldable):
            self.undecodable += 1
            return
        self._fold(event, partition, offset)

    def _fold(self, event: Event, partition: int, offset: int) -> None:
        rid = event.rollout_id
        before = self.states.get(rid)
        if before is None and self.keep_finished is not None and not isinstance(event, RolloutEnqueued):
            before = self._recall(rid, partition, offset)  # a rollout let go of, reopened: rare
        try:
            out = fold.apply(before, event)
        except Exception as exc:  # noqa: BLE001 - the processor dead-letters it; the replica must not stop either
            log.exception("fold failed for %s", rid)
            self._answer(event, Folded(before, before, None, False, f"{type(exc).__name__}: {exc}"))
            return
        if out.duplicate:
            self._answer(event, _duplicate(before, event))
            return
        snap = None
        if out.state is not None:
            self.states[rid] = out.state
            snap = out.state.snapshot(event.meta, out.accepted, out.reason, out.reserved)
            self.snapshots[rid] = snap
            if self.keep_finished is not None:
                self._keep(rid, out.state.updated_ns if out.state.status in FINISHED else None)
        done = Folded(before, out.state, snap, out.accepted, out.reason)
        if out.accepted:
            for listener in self._on_fold:
                listener(done)
            if before is None and isinstance(event, RolloutEnqueued):
                for enqueued in self._on_enqueued:
                    enqueued(rid, partition, offset)
            if (out.offer is not None and out.state is not None and event.meta.event_id in self._waiters
                    and not isinstance(event, RolloutEnqueued)):  # an enqueue's writer tells of it itself
                for tell in self._on_own_offer:
                    tell(event, out.state, out.offer.attempt_sequence, partition)
        self._answer(event, done)

    def _keep(self, rollout_id: str, finished_ns: int | None) -> None:
        """Keep at most ``keep_finished`` finished rollouts (:class:`NewestFinished`); the others are let go of
        (recalled if an event comes for one later)."""
        for old in self._finished.hold(rollout_id, finished_ns):
            gone = self.states.pop(old, None)
            self.snapshots.pop(old, None)
            if gone is not None:
                self._count_let_go(gone, 1)
                self.let_go_until_ns = max(self.let_go_until_ns, gone.updated_ns)
                self.recalled.discard(old)

    def _count_let_go(self, state: RolloutState, sign: int) -> None:
        self.let_go += sign
        self.let_go_attempts += sign * len(state.attempts)
        self.let_go_statuses[state.status] = self.let_go_statuses.get(state.status, 0) + sign
        self.let_go_retried += sign * max(0, len(state.attempts) - 1)

    def _recall(self, rollout_id: str, partition: int, offset: int) -> RolloutState | None:
        """The state of a rollout this replica let go of, folded again from its partition's records before
        ``offset`` (the follower has folded all of them): what a replica that kept it holds; None for an id with
        no rollout. Rare (a finished rollout reopened by an update, an event for a rollout long finished): one read
        of the partition, on the thread that folds."""
        if rollout_id in self._absent:
            return None
        try:
            state = self._fold_partition(rollout_id, partition, offset)
        except (KafkaException, TimeoutError) as exc:  # the broker away: folded as an event of an unknown rollout
            log.warning("could not read %s[%d] again for rollout %s: %s", self.topic, partition, rollout_id, exc)
            return None
        if state is None:
            self._absent[rollout_id] = None
            while len(self._absent) > ABSENT_IDS:
                self._absent.popitem(last=False)
        else:  # held again: no longer counted as let go of
            self._count_let_go(state, -1)
            self.recalled.add(rollout_id)
        return state

    def _fold_partition(self, rollout_id: str, partition: int, offset: int) -> RolloutState | None:
        """The fold of ``rollout_id``'s records in ``partition`` before ``offset``."""
        key = rollout_id.encode()
        reader = consumer(self._settings, group_id=f"recall-{rollout_id}", **{"enable.partition.eof": True})
        state: RolloutState | None = None
        try:
            reader.assign([TopicPartition(self.topic, partition, OFFSET_BEGINNING)])
            ends, give_up = PartitionEnds(), time.monotonic() + RECALL_WAIT_S
            while partition not in ends.at_end:
                if time.monotonic() > give_up:
                    raise TimeoutError(f"not read to offset {offset} in {RECALL_WAIT_S:.0f}s")
                msg = reader.poll(0.5)
                if msg is None or not ends.record(msg):
                    continue
                if int(msg.offset() or 0) >= offset:
                    break
                event = lifecycle_event(self.codec, self.topic, msg.key(), msg.value()) if msg.key() == key else None
                if event is not None and not isinstance(event, Unfoldable):
                    state = fold.apply(state, event).state or state
        finally:
            reader.close()
        return state

    def _answer(self, event: Event, done: Folded) -> None:
        event_id = event.meta.event_id
        if event_id not in self._waiters:
            return
        if event_id in self._acked_first:
            self._acked_first.discard(event_id)
            _settle(self._waiters.pop(event_id), done)
        else:
            self._folded_first[event_id] = done


def _settle(fut: Future[Folded], done: Folded) -> None:
    try:
        fut.set_result(done)
    except InvalidStateError:  # given up on meanwhile
        pass


def _duplicate(state: RolloutState | None, event: Event) -> Folded:
    """A redelivered event: applied before if the state's last change carries its time (the processor sends that
    snapshot again, so its writer gets the answer it missed), otherwise ignored."""
    if state is not None and state.updated_ns == event.meta.timestamp_ns:
        reserved = state.next_sequence_id - event.count if isinstance(event, SequenceRequested) else None
        return Folded(state, state, state.snapshot(event.meta, True, None, reserved), True, None)
    return Folded(state, state, None, False, "duplicate")
