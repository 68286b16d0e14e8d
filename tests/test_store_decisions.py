"""The store's pure decisions: which offers may be committed, and when spans need a heartbeat on the log."""

from __future__ import annotations

from litstream.schemas.events import AttemptSnapshot, RolloutSnapshot
from litstream.streams.store import SPAN_HEARTBEAT_EVERY_S, OfferLedger, span_heartbeat_due


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


def _snap(status: str = "running", next_sequence_id: int = 11) -> RolloutSnapshot:
    return RolloutSnapshot(rollout_id="ro-1", version=3, input={}, start_time=0.0, status="running",
                           attempts=[AttemptSnapshot(attempt_id="at-1", sequence_id=1, start_time=0.0, status=status)],
                           updated_ns=0, next_sequence_id=next_sequence_id)


def test_spans_beat_when_the_beat_changes_something_and_at_most_once_a_second_otherwise() -> None:
    now = 1000.0
    assert span_heartbeat_due(_snap(), "at-1", 3, last_sent=None, now=now)  # the first from this store
    assert not span_heartbeat_due(_snap(), "at-1", 3, last_sent=now - 0.2, now=now)  # running, ids reserved
    assert span_heartbeat_due(_snap(), "at-1", 3, last_sent=now - SPAN_HEARTBEAT_EVERY_S, now=now)
    assert span_heartbeat_due(_snap("preparing"), "at-1", 3, last_sent=now - 0.2, now=now)  # it starts the attempt
    assert span_heartbeat_due(_snap("unresponsive"), "at-1", 3, last_sent=now - 0.2, now=now)  # it revives it
    assert span_heartbeat_due(_snap(next_sequence_id=11), "at-1", 11, last_sent=now - 0.2, now=now)  # moves the counter
    assert span_heartbeat_due(_snap(), "at-other", 3, last_sent=now - 0.2, now=now)  # an attempt not seen yet
    assert span_heartbeat_due(None, "at-1", 3, last_sent=now - 0.2, now=now)
