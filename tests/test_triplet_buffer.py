"""The triplet processor's bookkeeping without Kafka: caps, late and replayed spans, readiness, commit points."""

from __future__ import annotations

from litstream.schemas.events import AttemptSnapshot, EventMeta, RolloutSnapshot, SpanRecorded
from litstream.schemas.policy_versions import UNATTRIBUTED
from litstream.streams.triplet_buffer import Collector, Limits


def span(rid: str, aid: str, n: int) -> SpanRecorded:
    meta = EventMeta(event_id=f"e{n}", rollout_id=rid, producer_id="p", producer_seq=n, timestamp_ns=1)
    return SpanRecorded(meta=meta, attempt_id=aid, sequence_id=n + 1, trace_id="0" * 32, span_id=f"{n:016x}",
                        name="s", start_time_ns=n)


def ended(rid: str, aid: str, status: str = "succeeded") -> RolloutSnapshot:
    return RolloutSnapshot(rollout_id=rid, version=2, input=None, start_time=0.0, status="running", updated_ns=0,
                           attempts=[AttemptSnapshot(attempt_id=aid, sequence_id=1, start_time=0.0, status=status)])


def test_an_attempt_ends_is_finalized_past_its_cut_and_then_its_spans_are_late() -> None:
    c = Collector(Limits(settle_ms=100, fetch_margin_ms=10))
    assert c.add_span(0, 5, 1000, span("r", "a", 1), b"x") == []
    assert c.add_span(0, 6, 1000, span("r", "a", 1), b"x") == [] and c.counts["duplicates"] == 1
    c.add_snapshot(0, 3, 1050, ended("r", "a"))
    assert c.commit_points() == ({0: 5}, {0: 3})  # held at the attempt's first span and its ending snapshot
    assert c.ready(0, now_ms=1100, at_end=True) == []  # the cut (1150) has not passed
    c.add_span(0, 7, 1200, span("r", "a", 2), b"y")  # written after the cut: late, but read before finalizing
    [attempt] = c.ready(0, now_ms=1200, at_end=False)  # a span written after the cut was read
    on_time, late = attempt.split()
    assert [b.offset for b in on_time] == [5] and [b.offset for b in late] == [7]
    c.finalized(attempt)
    assert c.commit_points() == ({0: 8}, {0: 4})
    [notice] = c.add_span(0, 8, 1000, span("r", "a", 3), b"z")
    assert notice.kind == "late_span"


def test_after_a_restart_spans_of_attempts_ended_before_the_commit_are_replayed_or_late() -> None:
    c = Collector(Limits(settle_ms=100))
    c.warm_until[0] = 10  # the committed state offset: snapshots below it only rebuild the map
    c.add_snapshot(0, 4, 1000, ended("r", "a"))
    assert c.pending == {} and c.warming(0)
    assert c.add_span(0, 2, 1050, span("r", "a", 1), b"x") == [] and c.counts["replayed"] == 1
    [notice] = c.add_span(0, 3, 1200, span("r", "a", 2), b"x")
    assert notice.kind == "late_span"
    c.add_snapshot(0, 9, 1300, ended("r2", "b", "timeout"))
    assert not c.warming(0) and c.pending == {}
    c.add_snapshot(0, 10, 1400, ended("r3", "c", "unresponsive"))  # live: pending with no spans yet
    assert set(c.pending) == {("r3", "c")} and c.commit_points()[1] == {0: 10}


def test_caps_let_an_attempt_go_with_one_notice() -> None:
    c = Collector(Limits(max_spans_per_attempt=2, max_buffer_bytes=25))
    assert c.add_span(0, 0, 1, span("r", "a", 0), b"x" * 5) == []
    assert c.add_span(0, 1, 1, span("r", "a", 1), b"x" * 5) == []
    [over] = c.add_span(0, 2, 1, span("r", "a", 2), b"x" * 5)
    assert over.kind == "over_cap" and c.pending[("r", "a")].dropped is not None and c.buffer_bytes == 0
    assert c.add_span(0, 3, 1, span("r", "a", 3), b"x") == [] and c.counts["dropped_spans"] == 4
    assert c.commit_points()[0] == {0: 0}  # still held: a restart must see the attempt whole to report it again
    c.add_span(0, 4, 1, span("r", "b", 4), b"x" * 20)
    [full] = c.add_span(0, 5, 1, span("r", "c", 5), b"x" * 10)
    assert full.kind == "buffer_full" and full.attempt.attempt_id == "b"


def test_spans_no_snapshot_ever_names_are_let_go_as_orphans() -> None:
    c = Collector(Limits(orphan_after_ms=1000))
    c.add_span(0, 0, 100, span("r-ghost", "a", 0), b"x")  # a rollout that never existed
    c.add_span(0, 1, 100, span("r", "a-bogus", 1), b"x")  # a real rollout, an attempt id it never had
    c.add_span(0, 2, 100, span("r", "a", 2), b"x")  # a real, running attempt
    running = RolloutSnapshot(rollout_id="r", version=2, input=None, start_time=0.0, status="running",
                              updated_ns=0, attempts=[AttemptSnapshot(attempt_id="a", sequence_id=1, start_time=0.0,
                                                                      status="running")])
    c.add_snapshot(0, 0, 150, running)
    assert c.orphans(now_ms=1000) == []  # not yet: its snapshot may still be on its way
    assert {a.key for a in c.orphans(now_ms=1200)} == {("r-ghost", "a"), ("r", "a-bogus")}
    for a in c.orphans(now_ms=1200):
        c.finalized(a)
    assert c.commit_points()[0] == {0: 2}  # the running attempt alone holds the commit now


def test_memory_is_bounded_by_counts_and_a_forgotten_attempt_is_not_finalized_twice() -> None:
    c = Collector(Limits(settle_ms=0, fetch_margin_ms=0, remember_rollouts=2, remember_finalized=2,
                         orphan_after_ms=1000))
    for i, rid in enumerate(["r1", "r2", "r3"]):
        c.add_span(0, i, 100, span(rid, "a", i), b"x")
        c.add_snapshot(0, i, 100, ended(rid, "a"))
        for attempt in c.ready(0, now_ms=200, at_end=True):
            c.finalized(attempt)
    assert c.pending == {} and len(c.rollouts) == 2 and len(c.finalized_here) == 2
    assert (0, "r1") not in c.rollouts
    c.add_snapshot(0, 3, 300, ended("r3", "a"))  # a redelivered snapshot: its attempt was finalized
    c.rollouts.pop((0, "r3"))  # forgotten by count, still known as finalized
    c.add_snapshot(0, 4, 300, ended("r3", "a"))
    assert c.pending == {}
    # r1 is forgotten on both counts: a very late span of it ends up an orphan, still reported once
    assert c.add_span(0, 5, 400, span("r1", "a", 5), b"x") == []
    assert [a.key for a in c.orphans(now_ms=1500)] == [("r1", "a")]


def test_partitions_given_back_are_read_again_as_after_a_restart() -> None:
    c = Collector(Limits(settle_ms=0, fetch_margin_ms=0))
    c.add_span(0, 0, 100, span("r", "a", 0), b"x")
    c.add_snapshot(0, 0, 100, ended("r", "a"))
    [attempt] = c.ready(0, now_ms=200, at_end=True)
    c.finalized(attempt)
    c.forget({0})  # revoked before its commit covered the attempt; then assigned to this process again
    assert c.finalized_here == {} and c.rollouts == {}
    c.add_snapshot(0, 0, 100, ended("r", "a"))  # live again: finalized again, with the same triplet ids
    assert c.add_span(0, 0, 100, span("r", "a", 0), b"x") == []  # not a late span
    assert [len(a.spans) for a in c.ready(0, now_ms=200, at_end=True)] == [1]


def test_spans_recorded_outside_any_attempt_are_counted_and_skipped() -> None:
    c = Collector(Limits(orphan_after_ms=1))
    for i in range(3):
        notices = c.add_span(0, i, 1000 + i, span(UNATTRIBUTED, UNATTRIBUTED, i + 1), b"x")
        assert notices == []
    assert c.pending == {} and c.counts["unattributed"] == 3
    assert c.orphans(10_000) == []  # never buffered, so never let go as an orphan either
    assert c.commit_points()[0] == {0: 3}  # and the commit moves past them
