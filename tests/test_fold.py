"""The pure fold: lifecycle rules, claims, retries, idempotence. No broker needed: this is pure logic."""

from __future__ import annotations

from litstream.schemas.events import (
    AttemptHeartbeat,
    AttemptStarted,
    AttemptStatusChanged,
    AttemptUpdated,
    EventFactory,
    RolloutEnqueued,
    RolloutStatusChanged,
    RolloutUpdated,
    SequenceRequested,
)
from litstream.streams.fold import Offer, apply, offer_outdated
from litstream.streams.state import RolloutState

RID = "ro-fold00000001"


class Log:
    """Builds events from one producer and folds them, as the processor would."""

    def __init__(self) -> None:
        self.f = EventFactory(role="test")
        self.state: RolloutState | None = None

    def fold(self, event):  # type: ignore[no-untyped-def]
        out = apply(self.state, event)
        self.state = out.state
        return out

    def enqueue(self, **config):  # type: ignore[no-untyped-def]
        return RolloutEnqueued(meta=self.f.meta(RID), input={"q": 1}, start_time=1.0, config=config)

    def claim(self, seq: int, attempt_id: str):  # type: ignore[no-untyped-def]
        return AttemptStarted(meta=self.f.meta(RID), attempt_id=attempt_id, sequence_id=seq, start_time=2.0)

    def beat(self, attempt_id: str, t: float = 3.0):  # type: ignore[no-untyped-def]
        return AttemptHeartbeat(meta=self.f.meta(RID), attempt_id=attempt_id, time=t)

    def attempt(self, attempt_id: str, status: str, t: float = 4.0):  # type: ignore[no-untyped-def]
        return AttemptStatusChanged(meta=self.f.meta(RID), attempt_id=attempt_id, status=status, time=t)  # type: ignore[arg-type]

    def rollout(self, status: str, t: float = 5.0):  # type: ignore[no-untyped-def]
        return RolloutStatusChanged(meta=self.f.meta(RID), status=status, time=t)  # type: ignore[arg-type]


def test_happy_path() -> None:
    log = Log()
    out = log.fold(log.enqueue())
    assert out.accepted and out.offer == Offer(1) and log.state.status == "queuing"  # type: ignore[union-attr]
    assert log.fold(log.claim(1, "at-a")).accepted
    assert log.state.status == "preparing"  # type: ignore[union-attr]
    log.fold(log.beat("at-a"))
    assert log.state.status == "running" and log.state.attempts[0].status == "running"  # type: ignore[union-attr]
    assert log.state.attempts[0].last_heartbeat_time == 3.0  # type: ignore[union-attr]
    log.fold(log.attempt("at-a", "succeeded", t=9.0))
    s = log.state
    assert s is not None and s.status == "succeeded" and s.end_time == 9.0 and s.attempts[0].end_time == 9.0
    assert s.version == 4


def test_second_claim_for_the_same_offer_is_rejected() -> None:
    log = Log()
    log.fold(log.enqueue())
    assert log.fold(log.claim(1, "at-a")).accepted
    out = log.fold(log.claim(1, "at-b"))
    assert not out.accepted and "claim rejected" in (out.reason or "")
    assert [a.attempt_id for a in log.state.attempts] == ["at-a"]  # type: ignore[union-attr]


def test_retry_then_fail_after_max_attempts() -> None:
    log = Log()
    log.fold(log.enqueue(max_attempts=2, retry_condition=["failed"]))
    log.fold(log.claim(1, "at-a"))
    out = log.fold(log.attempt("at-a", "failed"))
    assert log.state.status == "requeuing" and out.offer == Offer(2)  # type: ignore[union-attr]
    assert log.state.end_time is None  # type: ignore[union-attr]
    assert not log.fold(log.claim(1, "at-x")).accepted  # stale claim for the first offer
    assert log.fold(log.claim(2, "at-b")).accepted
    log.fold(log.attempt("at-b", "failed", t=7.0))
    assert log.state.status == "failed" and log.state.end_time == 7.0  # type: ignore[union-attr]


def test_an_offer_is_outdated_only_once_its_attempt_exists() -> None:
    """A replica may not have folded the failure behind a retry's offer yet: seen from there the rollout is still
    running its first attempt, and the offer of the second must not be thrown away. Nor may an offer seen against a
    finished rollout: an update later in the log may have put it back on the queue (the fold refuses the claim of
    an offer the rollout outlived)."""
    log = Log()
    log.fold(log.enqueue(max_attempts=2, retry_condition=["failed"]))
    assert not offer_outdated(log.state, 1)  # type: ignore[arg-type]
    log.fold(log.claim(1, "at-a"))
    log.fold(log.beat("at-a"))
    behind = log.state
    assert behind is not None and behind.status == "running"
    assert offer_outdated(behind, 1) and not offer_outdated(behind, 2)
    log.fold(log.attempt("at-a", "failed"))
    assert not offer_outdated(log.state, 2)  # type: ignore[arg-type]
    log.fold(log.claim(2, "at-b"))
    assert offer_outdated(log.state, 2)  # type: ignore[arg-type]
    log.fold(log.rollout("cancelled"))
    assert not offer_outdated(log.state, 3)  # type: ignore[arg-type]
    assert not log.fold(log.claim(3, "at-c")).accepted  # claimed anyway: refused, the rollout is not on offer
    requeued = log.fold(RolloutUpdated(meta=log.f.meta(RID), time=6.0, set_fields=["status"], status="requeuing"))
    assert requeued.offer == Offer(3) and log.fold(log.claim(3, "at-d")).accepted


def test_status_outside_retry_condition_fails() -> None:
    log = Log()
    log.fold(log.enqueue(max_attempts=3, retry_condition=["timeout"]))
    log.fold(log.claim(1, "at-a"))
    log.fold(log.attempt("at-a", "failed"))
    assert log.state.status == "failed"  # type: ignore[union-attr]


def test_terminal_states_are_final() -> None:
    log = Log()
    log.fold(log.enqueue())
    log.fold(log.claim(1, "at-a"))
    log.fold(log.rollout("cancelled"))
    assert log.state.status == "cancelled"  # type: ignore[union-attr]
    out = log.fold(log.attempt("at-a", "succeeded"))
    assert not out.accepted and log.state.status == "cancelled"  # type: ignore[union-attr]
    assert not log.fold(log.rollout("queuing")).accepted


def test_redelivery_changes_nothing() -> None:
    log = Log()
    events = [log.enqueue(), log.claim(1, "at-a"), log.beat("at-a"), log.attempt("at-a", "succeeded")]
    for e in events:
        log.fold(e)
    final = log.state
    for e in events:  # the whole log again, as after a crash before the offsets were committed
        out = log.fold(e)
        assert out.duplicate and not out.accepted
    assert log.state == final


def test_events_for_unknown_rollouts_and_attempts_are_rejected() -> None:
    log = Log()
    out = log.fold(log.beat("at-a"))
    assert not out.accepted and "unknown rollout" in (out.reason or "") and log.state is None
    log.fold(log.enqueue())
    out = log.fold(log.attempt("at-nope", "succeeded"))
    assert not out.accepted and "unknown attempt" in (out.reason or "")


def test_enqueue_twice_is_rejected() -> None:
    log = Log()
    log.fold(log.enqueue())
    out = log.fold(log.enqueue())
    assert not out.accepted and "already exists" in (out.reason or "")


def test_snapshot_carries_the_state() -> None:
    log = Log()
    log.fold(log.enqueue())
    log.fold(log.claim(1, "at-a"))
    snap = log.state.snapshot()  # type: ignore[union-attr]
    assert snap.rollout_id == RID and snap.version == 2 and snap.attempts[0].attempt_id == "at-a"


def test_start_rollout_begins_with_an_attempt_and_no_offer() -> None:
    log = Log()
    ev = RolloutEnqueued(meta=log.f.meta(RID), input=1, start_time=1.0, start_attempt_id="at-s", worker_id="w")
    out = log.fold(ev)
    assert out.accepted and out.offer is None
    s = log.state
    assert s is not None and s.status == "preparing" and s.attempts[0].attempt_id == "at-s"
    assert s.attempts[0].worker_id == "w" and s.attempts[0].sequence_id == 1


def test_forced_attempts_bypass_the_queue_and_max_attempts() -> None:
    log = Log()
    log.fold(log.enqueue())  # max_attempts 1
    log.fold(log.claim(1, "at-a"))
    forced = AttemptStarted(meta=log.f.meta(RID), attempt_id="at-b", sequence_id=99, start_time=3.0, force=True)
    assert log.fold(forced).accepted
    assert [a.sequence_id for a in log.state.attempts] == [1, 2]  # type: ignore[union-attr]


def test_a_forced_attempt_reopens_a_finished_rollout_which_follows_it() -> None:
    """As the reference's start_attempt: the rollout's status follows its newest attempt, whatever it was."""
    log = Log()
    log.fold(log.enqueue())
    log.fold(log.claim(1, "at-a"))
    log.fold(log.attempt("at-a", "succeeded", t=4.0))
    assert log.state.status == "succeeded" and log.state.end_time == 4.0  # type: ignore[union-attr]
    assert not log.fold(log.rollout("queuing")).accepted  # a status set directly: terminal states stay final
    again = AttemptStarted(meta=log.f.meta(RID), attempt_id="at-c", sequence_id=3, start_time=5.0, force=True)
    out = log.fold(again)
    s = log.state
    assert out.accepted and out.offer is None and s is not None
    assert (s.status, s.end_time, [a.status for a in s.attempts]) == ("preparing", None, ["succeeded", "preparing"])
    assert s.attempts[-1].sequence_id == 2
    log.fold(log.beat("at-c", t=6.0))
    assert log.state.status == "running"  # type: ignore[union-attr]
    log.fold(log.attempt("at-c", "failed", t=7.0))  # max_attempts 1: no retry
    assert (log.state.status, log.state.end_time) == ("failed", 7.0)  # type: ignore[union-attr]
    assert not log.fold(log.attempt("at-a", "failed")).accepted  # the old attempt stays as it ended


def test_update_rollout_changes_only_the_named_fields() -> None:
    log = Log()
    log.fold(log.enqueue())
    upd = RolloutUpdated(meta=log.f.meta(RID), time=2.0, set_fields=["metadata", "mode"], metadata={"k": 1},
                         mode="val")
    assert log.fold(upd).accepted
    s = log.state
    assert s is not None and s.metadata == {"k": 1} and s.mode == "val" and s.input == {"q": 1}
    log.fold(log.rollout("cancelled"))
    late_meta = RolloutUpdated(meta=log.f.meta(RID), time=3.0, set_fields=["metadata"], metadata={"k": 2})
    assert log.fold(late_meta).accepted and log.state.status == "cancelled"  # type: ignore[union-attr]


def test_update_rollout_back_to_queuing_offers_it_again() -> None:
    log = Log()
    log.fold(log.enqueue())
    log.fold(log.claim(1, "at-a"))
    out = log.fold(RolloutUpdated(meta=log.f.meta(RID), time=2.0, set_fields=["status"], status="requeuing"))
    assert out.offer == Offer(2)


def _update_rollout(log: Log, status: str, t: float):  # type: ignore[no-untyped-def]
    return log.fold(RolloutUpdated(meta=log.f.meta(RID), time=t, set_fields=["status"], status=status))  # type: ignore[arg-type]


def _update_attempt(log: Log, attempt_id: str, status: str, t: float):  # type: ignore[no-untyped-def]
    return log.fold(AttemptUpdated(meta=log.f.meta(RID), attempt_id=attempt_id, time=t, set_fields=["status"],
                                   status=status))  # type: ignore[arg-type]


def test_updates_of_a_finished_rollout_take_the_references_contract() -> None:
    """update_rollout / update_attempt (the reference's methods) on a finished rollout: its own status again is a
    no-op, another status is taken, and the rollout follows its newest attempt; set back on the queue, it is offered
    for its next attempt."""
    log = Log()
    log.fold(log.enqueue())
    log.fold(log.claim(1, "at-a"))
    assert _update_attempt(log, "latest", "succeeded", 4.0).accepted
    done = log.state
    assert done is not None and (done.status, done.end_time) == ("succeeded", 4.0)
    same = _update_rollout(log, "succeeded", 5.0)  # the stock client's flow: the attempt, then the rollout
    assert same.accepted and same.offer is None
    assert (log.state.status, log.state.end_time) == ("succeeded", 4.0)  # type: ignore[union-attr]
    assert _update_rollout(log, "failed", 6.0).accepted
    assert (log.state.status, log.state.end_time) == ("failed", 6.0)  # type: ignore[union-attr]
    assert _update_attempt(log, "at-a", "succeeded", 7.0).accepted  # the attempt's status is unchanged ...
    s = log.state
    assert s is not None and (s.status, s.end_time) == ("succeeded", 7.0)  # ... yet the rollout follows it
    assert s.attempts[0].end_time == 4.0  # the attempt ended once: its own status again moves nothing
    assert _update_attempt(log, "latest", "running", 8.0).accepted
    s = log.state
    assert s is not None and (s.status, s.end_time, s.attempts[0].status) == ("running", None, "running")
    requeued = _update_rollout(log, "requeuing", 9.0)
    assert requeued.accepted and requeued.offer == Offer(2) and log.state.status == "requeuing"  # type: ignore[union-attr]
    assert not _update_rollout(log, "queuing", 9.5).offer  # on offer already: no second offer
    assert log.fold(log.claim(2, "at-b")).accepted
    assert [a.sequence_id for a in log.state.attempts] == [1, 2] and log.state.status == "preparing"  # type: ignore[union-attr]


def test_status_events_keep_terminal_states_final() -> None:
    """A runner's outcome, a timer or `litstream cancel` never rewrites an outcome: a timer decided before the
    stock client's update_attempt(succeeded) was folded is refused after it."""
    log = Log()
    log.fold(log.enqueue(timeout_seconds=1.0))
    log.fold(log.claim(1, "at-a"))
    assert _update_attempt(log, "at-a", "succeeded", 3.0).accepted
    late_timer = log.fold(log.attempt("at-a", "timeout", t=3.5))
    assert not late_timer.accepted and "already succeeded" in (late_timer.reason or "")
    cancel = log.fold(log.rollout("cancelled", t=4.0))
    assert not cancel.accepted and "terminal states are final" in (cancel.reason or "")
    assert (log.state.status, log.state.end_time) == ("succeeded", 3.0)  # type: ignore[union-attr]


def test_a_heartbeat_revives_an_attempt_marked_unresponsive_while_its_rollout_runs() -> None:
    """update_attempt(unresponsive) fails a rollout without a retry condition; set running again (update_rollout),
    a heartbeat of the attempt brings it back to running and is recorded, as in the reference. An older attempt
    marked unresponsive under a newer one is revived too, the rollout staying with its newest attempt."""
    log = Log()
    log.fold(log.enqueue())
    log.fold(log.claim(1, "at-a"))
    log.fold(log.beat("at-a", t=3.0))
    assert _update_attempt(log, "at-a", "unresponsive", 4.0).accepted
    assert log.state.status == "failed"  # type: ignore[union-attr]
    assert _update_rollout(log, "running", 5.0).accepted
    assert log.fold(log.beat("at-a", t=6.0)).accepted
    s = log.state
    assert s is not None and s.status == "running" and s.end_time is None
    assert (s.attempts[0].status, s.attempts[0].last_heartbeat_time) == ("running", 6.0)
    forced = AttemptStarted(meta=log.f.meta(RID), attempt_id="at-b", sequence_id=2, start_time=7.0, force=True)
    assert log.fold(forced).accepted
    assert _update_attempt(log, "at-a", "unresponsive", 8.0).accepted
    assert log.fold(log.beat("at-a", t=9.0)).accepted
    s = log.state
    assert s is not None and [a.status for a in s.attempts] == ["running", "preparing"] and s.status == "preparing"


def test_update_attempt_latest_drives_the_rollout() -> None:
    log = Log()
    log.fold(log.enqueue())
    log.fold(log.claim(1, "at-a"))
    upd = AttemptUpdated(meta=log.f.meta(RID), attempt_id="latest", time=5.0, set_fields=["status", "metadata"],
                         status="succeeded", metadata={"m": 1})
    assert log.fold(upd).accepted
    s = log.state
    assert s is not None and s.status == "succeeded" and s.attempts[0].metadata == {"m": 1}
    assert s.attempts[0].end_time == 5.0


def test_sequence_ids_are_reserved_in_increasing_blocks_and_move_past_explicit_ids() -> None:
    log = Log()
    log.fold(log.enqueue())
    first = log.fold(SequenceRequested(meta=log.f.meta(RID), count=3))
    second = log.fold(SequenceRequested(meta=log.f.meta(RID), count=1))
    assert (first.reserved, second.reserved) == (1, 4)
    log.fold(log.claim(1, "at-a"))
    log.fold(AttemptHeartbeat(meta=log.f.meta(RID), attempt_id="at-a", time=3.0, max_sequence_id=41))
    assert log.fold(SequenceRequested(meta=log.f.meta(RID))).reserved == 42


def test_a_late_heartbeat_does_not_revive_an_attempt_of_a_finished_rollout() -> None:
    log = Log()
    log.fold(log.enqueue(unresponsive_seconds=1.0))
    log.fold(log.claim(1, "at-a"))
    log.fold(log.attempt("at-a", "unresponsive"))
    assert log.state.status == "failed"  # type: ignore[union-attr]
    assert log.fold(log.beat("at-a", t=9.0)).accepted
    a = log.state.attempts[0]  # type: ignore[union-attr]
    assert a.status == "unresponsive" and a.last_heartbeat_time == 9.0


def test_evolve_is_model_copy() -> None:
    """The fold's copy-with-changes makes what pydantic's model_copy makes, and leaves the original alone."""
    from litstream.streams.fold import _evolve

    state = apply(None, RolloutEnqueued(meta=EventFactory(role="test").meta("ro-e"), input={"q": 1},
                                        start_time=1.0)).state
    assert state is not None
    changes = {"version": state.version + 5, "status": "running"}
    fast, slow = _evolve(state, changes), state.model_copy(update=changes)
    assert fast == slow and fast.model_dump() == slow.model_dump()
    assert fast.model_fields_set == slow.model_fields_set
    assert state.version != fast.version and state.status == "queuing"


def test_the_reference_view_of_a_snapshot_is_what_validation_builds_and_the_callers_own() -> None:
    """rollout_from_snapshot builds without validating again: the same Rollout / AttemptedRollout as the
    validating constructors, and containers of its own, so a caller changing them leaves the snapshot alone."""
    from litstream.schemas.models import AttemptedRollout, Rollout
    from litstream.streams.state import rollout_from_snapshot

    log = Log()
    log.fold(RolloutEnqueued(meta=log.f.meta(RID), input={"q": 1}, start_time=1.0, metadata={"k": [1]},
                             config={"max_attempts": 2, "retry_condition": ["failed"]}))
    queued = log.state.snapshot()  # type: ignore[union-attr]
    log.fold(AttemptStarted(meta=log.f.meta(RID), attempt_id="at-1", sequence_id=1, start_time=2.0, worker_id="w"))
    started = log.state.snapshot()  # type: ignore[union-attr]
    for snap, cls in ((queued, Rollout), (started, AttemptedRollout)):
        got = rollout_from_snapshot(snap)
        validated = cls.model_validate(got.model_dump())
        assert type(got) is cls
        assert got == validated
        assert got.model_fields_set == validated.model_fields_set
        got.metadata["new"] = 1  # type: ignore[index]
        got.config.retry_condition.append("timeout")
        assert snap.metadata == {"k": [1]} and snap.config.retry_condition == ["failed"]
