"""Fuzzing the two places hostile bytes and hostile events reach first: the codec and the fold.

The codec must turn any byte string into either a valid record or a DecodeError (never another exception, never
a hang); the fold must take any sequence of well-formed events — impossible transitions, unknown ids, duplicates,
any order — without raising, and deterministically.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from litstream.schemas.codec import DecodeError, default_codec
from litstream.schemas.events import (
    AttemptHeartbeat,
    AttemptStarted,
    AttemptStatusChanged,
    Event,
    EventFactory,
    RolloutEnqueued,
    RolloutStatusChanged,
    SequenceRequested,
    SpanRecorded,
)
from litstream.schemas.models import ATTEMPT_STATUSES, ROLLOUT_STATUSES
from litstream.streams.fold import apply
from litstream.streams.replay import fold_events

CODEC = default_codec()
FACTORY = EventFactory("fuzz")


def _valid_messages() -> list[bytes]:
    span = SpanRecorded(meta=FACTORY.meta("ro-1"), attempt_id="at-1", sequence_id=1, trace_id="ab" * 16,
                        span_id="cd" * 8, name="chat", start_time_ns=1, end_time_ns=2,
                        attributes={"k": "v", "n": 3, "l": [1, 2]})
    enq = RolloutEnqueued(meta=FACTORY.meta("ro-1"), input={"q": "2+2"}, start_time=1.0)
    started = AttemptStarted(meta=FACTORY.meta("ro-1"), attempt_id="at-1", sequence_id=1, start_time=2.0)
    return [CODEC.encode(e) for e in (span, enq, started)]


VALID = _valid_messages()


def _decode_or_error(data: bytes) -> None:
    try:
        CODEC.decode(data)
    except DecodeError as exc:
        assert str(exc)  # every refusal says why


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_random_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    _decode_or_error(data)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=256))
def test_random_bodies_behind_a_known_header(body: bytes) -> None:
    for valid in VALID:
        _decode_or_error(valid[:10] + body)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(range(len(VALID))), st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
                                                      min_size=1, max_size=8),
       st.integers(0, 64))
def test_mutated_valid_messages(which: int, flips: list[tuple[int, int]], cut: int) -> None:
    data = bytearray(VALID[which])
    for pos, byte in flips:
        data[pos % len(data)] = byte
    _decode_or_error(bytes(data))
    _decode_or_error(bytes(data[: max(0, len(data) - cut)]))


RIDS = ["ro-a", "ro-b"]
PRODUCERS = {who: EventFactory(who) for who in ("api", "w1", "w2")}  # one factory per producer, as in life
AIDS = ["at-1", "at-2", "at-x"]


@st.composite
def hostile_event(draw: Any) -> Event:
    """Well-formed events with arbitrary (often impossible) content, from a few producers."""
    meta = PRODUCERS[draw(st.sampled_from(sorted(PRODUCERS)))].meta(draw(st.sampled_from(RIDS)))
    kind = draw(st.sampled_from(["enq", "start", "status", "rstatus", "beat", "seq"]))
    now = draw(st.floats(0, 100, allow_nan=False))
    if kind == "enq":
        return RolloutEnqueued(meta=meta, input={"x": draw(st.integers())}, start_time=now,
                               config={"max_attempts": draw(st.integers(1, 4)),
                                       "retry_condition": draw(st.lists(st.sampled_from(["failed", "timeout"]),
                                                                        unique=True))})
    if kind == "start":
        return AttemptStarted(meta=meta, attempt_id=draw(st.sampled_from(AIDS)),
                              sequence_id=draw(st.integers(1, 5)), start_time=now, force=draw(st.booleans()))
    if kind == "status":
        return AttemptStatusChanged(meta=meta, attempt_id=draw(st.sampled_from(AIDS)),
                                    status=draw(st.sampled_from(ATTEMPT_STATUSES)), time=now)
    if kind == "rstatus":
        return RolloutStatusChanged(meta=meta, status=draw(st.sampled_from(ROLLOUT_STATUSES)), time=now)
    if kind == "beat":
        return AttemptHeartbeat(meta=meta, attempt_id=draw(st.sampled_from(AIDS)), time=now,
                                max_sequence_id=draw(st.one_of(st.none(), st.integers(1, 10**6))))
    return SequenceRequested(meta=meta, count=draw(st.integers(1, 1000)))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(hostile_event(), max_size=40), st.integers(0, 40))
def test_fold_takes_any_event_sequence(events: list[Event], resume_at: int) -> None:
    states: dict[str, Any] = {}
    for e in events:
        out = apply(states.get(e.rollout_id), e)  # must not raise
        if out.accepted:
            assert out.state is not None
        else:
            assert out.reason  # a refusal always says why (it becomes the dead letter's reason)
        if out.state is not None:
            states[e.rollout_id] = out.state
    assert _substance(fold_events(events).states) == _substance(fold_events(events).states)  # deterministic
    # A redelivery (the log again from an older committed offset) changes nothing. Only for logs where nothing
    # names a rollout before its enqueue: rollout ids come from the enqueue, so an earlier reference is a dead
    # letter; a rollout that appears later under that id could take it on a redelivery.
    causal, known = [], set()
    for e in events:
        if isinstance(e, RolloutEnqueued):
            known.add(e.rollout_id)
        if e.rollout_id in known:
            causal.append(e)
    once = _substance(fold_events(causal).states)
    assert _substance(fold_events(causal + causal[resume_at:]).states) == once


def _substance(states: dict[str, Any]) -> dict[str, Any]:
    """The rollouts without the per-producer dedupe bookkeeping (a re-refused event may note its producer)."""
    return {rid: s.model_dump(exclude={"producers"}) for rid, s in states.items()}
