"""Properties of the fold (hypothesis): any interleaving of rollouts' logs, with duplicates and redeliveries,
folds to the same state as one in-order application; and a state that goes through the processor's table
(JSON) folds on exactly as one kept in memory — so replay equals live."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from litstream.schemas.events import (
    AttemptHeartbeat,
    AttemptStarted,
    AttemptStatusChanged,
    AttemptUpdated,
    Event,
    EventFactory,
    RolloutEnqueued,
    RolloutStatusChanged,
    RolloutUpdated,
    SequenceRequested,
)
from litstream.schemas.models import ATTEMPT_STATUSES, ROLLOUT_STATUSES
from litstream.streams.fold import apply
from litstream.streams.replay import fold_events
from litstream.streams.state import RolloutState

PRODUCERS = ["api", "w1", "w2", "processor"]


@st.composite
def rollout_log(draw: Any, rid: str, factories: dict[str, EventFactory]) -> list[Event]:
    """One rollout's events as producers might write them: valid or not, the fold decides."""
    def meta(who: str) -> Any:
        return factories[who].meta(rid)

    config = {"max_attempts": draw(st.integers(1, 3)),
              "retry_condition": draw(st.lists(st.sampled_from(["failed", "timeout", "unresponsive"]), unique=True)),
              "timeout_seconds": draw(st.one_of(st.none(), st.floats(0.5, 10)))}
    log: list[Event] = [RolloutEnqueued(meta=meta("api"), input={"i": rid}, start_time=1.0, config=config)]
    attempts: list[str] = []
    for t in range(draw(st.integers(0, 12))):
        now = 2.0 + t
        kind = draw(st.sampled_from(["claim", "claim", "force", "beat", "attempt", "attempt", "rollout",
                                     "update", "attempt_update", "sequence"]))
        who = draw(st.sampled_from(PRODUCERS))
        if kind == "claim":
            seq = draw(st.integers(1, len(attempts) + 2))
            aid = f"at-{rid[-2:]}{len(attempts)}{t}"
            attempts.append(aid)
            log.append(AttemptStarted(meta=meta(who), attempt_id=aid, sequence_id=seq, start_time=now))
        elif kind == "force":
            aid = f"at-{rid[-2:]}f{t}"
            attempts.append(aid)
            log.append(AttemptStarted(meta=meta(who), attempt_id=aid, sequence_id=1, start_time=now, force=True))
        elif kind == "beat":
            aid = draw(st.sampled_from(attempts)) if attempts else "at-unknown"
            log.append(AttemptHeartbeat(meta=meta(who), attempt_id=aid, time=now,
                                        max_sequence_id=draw(st.one_of(st.none(), st.integers(1, 50)))))
        elif kind == "update":
            fields = draw(st.lists(st.sampled_from(["status", "metadata", "mode"]), unique=True, min_size=1))
            log.append(RolloutUpdated(meta=meta(who), time=now, set_fields=fields,
                                      status=draw(st.sampled_from(ROLLOUT_STATUSES)), metadata={"t": t},
                                      mode=draw(st.sampled_from(["train", "val", None]))))
        elif kind == "attempt_update":
            aid = draw(st.sampled_from(attempts + ["latest"])) if attempts else "latest"
            fields = draw(st.lists(st.sampled_from(["status", "metadata", "worker_id"]), unique=True, min_size=1))
            log.append(AttemptUpdated(meta=meta(who), attempt_id=aid, time=now, set_fields=fields,
                                      status=draw(st.sampled_from(ATTEMPT_STATUSES)), metadata={"t": t},
                                      worker_id="w-upd"))
        elif kind == "sequence":
            log.append(SequenceRequested(meta=meta(who), count=draw(st.integers(1, 5))))
        elif kind == "attempt":
            aid = draw(st.sampled_from(attempts)) if attempts else "at-unknown"
            log.append(AttemptStatusChanged(meta=meta(who), attempt_id=aid, status=draw(st.sampled_from(ATTEMPT_STATUSES)),
                                            time=now))
        else:
            log.append(RolloutStatusChanged(meta=meta(who), status=draw(st.sampled_from(ROLLOUT_STATUSES)), time=now))
    return log


@st.composite
def logs(draw: Any) -> tuple[list[list[Event]], list[Event]]:
    """Several rollouts' logs, and one interleaving of them with duplicates and redelivered runs."""
    factories = {p: EventFactory(producer_id=p) for p in PRODUCERS}
    per_rollout = [draw(rollout_log(f"ro-prop{i:02d}", factories)) for i in range(draw(st.integers(1, 4)))]
    # Interleave, keeping each rollout's own order (a partition keeps per-key order).
    cursors = [0] * len(per_rollout)
    merged: list[Event] = []
    while any(c < len(log) for c, log in zip(cursors, per_rollout)):
        i = draw(st.sampled_from([k for k, log in enumerate(per_rollout) if cursors[k] < len(log)]))
        merged.append(per_rollout[i][cursors[i]])
        cursors[i] += 1
    # Redelivery after a crash: a run of already-delivered events comes again, in order.
    for _ in range(draw(st.integers(0, 3))):
        if not merged:
            break
        end = draw(st.integers(1, len(merged)))
        start = draw(st.integers(0, end - 1))
        merged = merged[:end] + merged[start:end] + merged[end:]
    # Single duplicates anywhere after their original.
    for _ in range(draw(st.integers(0, 3))):
        i = draw(st.integers(0, len(merged) - 1))
        j = draw(st.integers(i + 1, len(merged)))
        merged.insert(j, merged[i])
    return per_rollout, merged


def _public(state: RolloutState | None) -> Any:
    return None if state is None else state.snapshot().model_dump(mode="json")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs())
def test_interleavings_and_redeliveries_fold_to_the_in_order_state(data: tuple[list[list[Event]], list[Event]]) -> None:
    per_rollout, merged = data
    expected = {log[0].rollout_id: fold_events(log).states.get(log[0].rollout_id) for log in per_rollout}
    got = fold_events(merged).states
    for rid, state in expected.items():
        assert _public(got.get(rid)) == _public(state)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs())
def test_state_through_the_table_folds_like_state_in_memory(data: tuple[list[list[Event]], list[Event]]) -> None:
    """The processor keeps state as JSON in its table; replay keeps objects. Both must agree at every step."""
    _, merged = data
    memory: dict[str, RolloutState] = {}
    table: dict[str, Any] = {}
    for e in merged:
        a = apply(memory.get(e.rollout_id), e)
        raw = table.get(e.rollout_id)
        b = apply(RolloutState.model_validate(raw) if raw is not None else None, e)
        assert (a.accepted, a.duplicate, a.reason, a.offer) == (b.accepted, b.duplicate, b.reason, b.offer)
        if a.state is not None:
            memory[e.rollout_id] = a.state
        if b.state is not None:
            table[e.rollout_id] = b.state.model_dump(mode="json")
    for rid, state in memory.items():
        assert RolloutState.model_validate(table[rid]) == state


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(logs())
def test_terminal_rollouts_stay_terminal(data: tuple[list[list[Event]], list[Event]]) -> None:
    """Under any event but the reference's update methods (update_rollout / update_attempt, which take its
    contract: tests/test_fold.py) and a forced start."""
    _, merged = data
    states: dict[str, RolloutState] = {}
    for e in merged:
        before = states.get(e.rollout_id)
        out = apply(before, e)
        if isinstance(e, (RolloutUpdated, AttemptUpdated)) and "status" in e.set_fields:
            pass  # the reference's contract: a finished rollout takes a new status, and follows its newest attempt
        elif before is not None and before.status in {"succeeded", "failed", "cancelled"}:
            assert out.state is not None
            if out.accepted and isinstance(e, AttemptStarted) and e.force:  # start_attempt reopens it
                assert out.state.status == "preparing" and out.state.end_time is None
                assert out.state.attempts[:-1] == before.attempts
            else:
                assert out.state.status == before.status
                assert out.state.end_time == before.end_time
            assert all(a.status not in {"preparing", "running"} or b.status == a.status
                       for a, b in zip(out.state.attempts, before.attempts))  # no old attempt comes back to life
        if out.state is not None:
            states[e.rollout_id] = out.state
