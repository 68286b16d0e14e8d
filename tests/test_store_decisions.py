"""The store's pure decisions: which offers may be committed and in which order they are handed out, and when
spans need a heartbeat on the log (and when the call waits for it)."""

from __future__ import annotations

from litstream.schemas.events import AttemptSnapshot, EventFactory, RolloutOffered, RolloutSnapshot
from litstream.streams.offers import OfferLedger, OfferQueue, offer_queue_time
from litstream.streams.span_beats import SPAN_HEARTBEAT_EVERY_S, SpanBeats
from litstream.streams.span_writer import span_beat_urgent, span_heartbeat_shows


def test_an_offer_whose_claim_is_travelling_holds_the_commit_back() -> None:
    ledger = OfferLedger()
    ledger.taken([(0, 5), (0, 6), (1, 2)])
    ledger.taken([(0, 7)])
    assert ledger.handled([(0, 6)]) == {0: 5}  # offer 5 is still out: commit no further than it
    assert ledger.handled([(0, 7), (1, 2)]) == {1: 3}  # partition 0 does not move while 5 is out
    assert ledger.handled([(0, 5)]) == {0: 8}  # all handled: one past the highest
    assert ledger.handled([(0, 5)]) == {}  # nothing moved


def test_a_rebalance_forgets_what_the_partition_held() -> None:
    ledger = OfferLedger()
    ledger.taken([(0, 5), (0, 6)])
    ledger.forget([0])
    ledger.taken([(0, 9)])
    assert ledger.handled([(0, 9)]) == {0: 10}


def _offer(rid: str, attempt_sequence: int = 1, at_ns: int = 0) -> RolloutOffered:
    meta = EventFactory(role="test").meta(rid).model_copy(update={"timestamp_ns": at_ns})
    return RolloutOffered(meta=meta, attempt_sequence=attempt_sequence, input={})


def test_offers_leave_in_the_order_their_rollouts_joined_the_queue_whatever_their_partition() -> None:
    enqueued = {"ro-a": 1.0, "ro-b": 2.0, "ro-c": 3.0, "ro-d": 4.0}
    snaps = {rid: RolloutSnapshot(rollout_id=rid, version=1, input={}, start_time=t, status="queuing", updated_ns=0)
             for rid, t in enqueued.items()}
    queue = OfferQueue()
    # as a consumer reads them: partition 1 first, and its offers folded after a later rollout's
    read = [(_offer("ro-d", at_ns=9_000_000_000), (1, 0)), (_offer("ro-b", at_ns=8_000_000_000), (1, 1)),
            (_offer("ro-c", at_ns=5_000_000_000), (0, 0)), (_offer("ro-a", at_ns=7_000_000_000), (0, 1))]
    for offer, where in read:
        queue.push(offer_queue_time(offer, snaps[offer.rollout_id]), offer, where)
    assert len(queue) == 4
    assert [o.rollout_id for o, _ in queue.pop(3)] == ["ro-a", "ro-b", "ro-c"]
    retry = _offer("ro-a", attempt_sequence=2, at_ns=3_500_000_000)  # back on offer at 3.5 s: after ro-c
    assert offer_queue_time(retry, snaps["ro-a"]) == 3.5
    queue.push(offer_queue_time(retry, snaps["ro-a"]), retry, (0, 2))
    assert [(o.rollout_id, where) for o, where in queue.pop(5)] == [("ro-a", (0, 2)), ("ro-d", (1, 0))]
    assert offer_queue_time(_offer("ro-x", at_ns=6_000_000_000), None) == 6.0  # not seen here: from its offer


def test_a_rebalance_drops_the_offers_read_ahead_from_the_partitions_that_left() -> None:
    queue = OfferQueue()
    for i, where in enumerate([(0, 0), (1, 0), (0, 1), (2, 0)]):
        queue.push(float(i), _offer(f"ro-{i}"), where)
    queue.forget([0, 2])
    assert [w for _, w in queue.pop(10)] == [(1, 0)] and len(queue) == 0


def _snap(status: str = "running", next_sequence_id: int = 11, beat: float | None = None) -> RolloutSnapshot:
    attempt = AttemptSnapshot(attempt_id="at-1", sequence_id=1, start_time=0.0, status=status,
                              last_heartbeat_time=beat)
    return RolloutSnapshot(rollout_id="ro-1", version=3, input={}, start_time=0.0, status="running",
                           attempts=[attempt], updated_ns=0, next_sequence_id=next_sequence_id)


def test_a_span_call_waits_for_a_beat_that_changes_what_readers_see() -> None:
    assert span_heartbeat_shows(_snap("preparing"), "at-1")  # it starts the attempt
    assert span_heartbeat_shows(_snap("unresponsive", beat=5.0), "at-1")  # it revives it
    assert span_heartbeat_shows(_snap("timeout"), "at-1")  # its first heartbeat is recorded
    assert span_heartbeat_shows(None, "at-1") and span_heartbeat_shows(_snap(), "at-other")  # not seen here yet
    assert not span_heartbeat_shows(_snap("running", beat=5.0), "at-1")  # only keeps the timers off
    assert not span_heartbeat_shows(_snap("timeout", beat=5.0), "at-1")


def test_spans_beat_when_the_beat_changes_something_and_at_most_once_a_second_otherwise() -> None:
    now = [1000.0]
    beats = SpanBeats(clock=lambda: now[0])

    def due(snap: RolloutSnapshot | None, attempt_id: str, seq: int) -> bool:
        beats.spans("ro-1", attempt_id, seq)
        return beats.due_for("ro-1", attempt_id, span_beat_urgent(snap, attempt_id)) is not None

    assert due(_snap(), "at-1", 3)  # the first from this writer
    now[0] += 0.2
    assert not due(_snap(), "at-1", 3)  # running, ids reserved
    now[0] += SPAN_HEARTBEAT_EVERY_S
    assert due(_snap(), "at-1", 3)
    now[0] += 0.2
    assert due(_snap("preparing"), "at-1", 3)  # it starts the attempt
    now[0] += 0.2
    assert due(_snap("unresponsive"), "at-1", 3)  # it revives it
    now[0] += 0.2
    # An id the log has not reserved waits (it goes out before this writer's next reservation, or within the
    # second): a beat per span would make the processor fold every span.
    assert not due(_snap(next_sequence_id=11), "at-1", 11)
    assert beats.pending() and beats.due_for("ro-1", "at-1", urgent=True) is not None
    now[0] += 0.2
    assert due(_snap(), "at-other", 3)  # an attempt not seen yet
    now[0] += 0.2
    assert due(None, "at-1", 3)


def test_a_held_back_beat_carries_every_id_used_since_the_last() -> None:
    now = [0.0]
    beats = SpanBeats(clock=lambda: now[0])
    beats.spans("ro-1", "at-1", 4, worker_id="w")
    assert [b.max_sequence_id for b in beats.due()] == [4]
    beats.spans("ro-1", "at-1", 9)
    beats.spans("ro-1", "at-1", 7)
    assert beats.due() == []  # within the second
    now[0] += SPAN_HEARTBEAT_EVERY_S
    (beat,) = beats.due()
    assert (beat.max_sequence_id, beat.worker_id) == (9, "w")
    assert beats.due(force=True) == []  # nothing new since
    beats.spans("ro-1", "at-1", 10)
    assert [b.max_sequence_id for b in beats.due(force=True)] == [10]  # force: before the attempt ends


def test_a_beat_goes_before_a_reservation_only_for_ids_the_counter_is_not_past() -> None:
    """Spans that used reserved ids leave their beat to its throttle; an id the spans chose themselves at or past
    the folded counter (or a counter not known here) sends the beat first, so the reservation starts past it."""
    beats = SpanBeats(clock=lambda: 1000.0)
    beats.spans("ro-1", "at-1", 4)
    assert beats.due_before_reserving("ro-1", "at-1", next_sequence_id=5) is None  # id 4 was reserved: 5 is next
    assert beats.pending()  # still held, for its throttle
    beats.spans("ro-1", "at-1", 9)
    due = beats.due_before_reserving("ro-1", "at-1", next_sequence_id=5)
    assert due is not None and due.max_sequence_id == 9 and not beats.pending()
    beats.spans("ro-1", "at-2", 2)
    assert beats.due_before_reserving("ro-1", "at-2", next_sequence_id=None) is not None  # the counter not known
    assert beats.due_before_reserving("ro-1", "at-3", next_sequence_id=1) is None  # no spans held
