"""The pure fold: ``apply(state, event) -> Outcome``. No I/O, no clock: the same log always folds to the same state.

Rules (reference semantics, Agent Lightning 0.3, except where noted):
* Only the latest attempt drives the rollout's status. A failed/timeout/unresponsive attempt requeues the rollout
  iff its status is in ``retry_condition`` and ``sequence_id < max_attempts``; otherwise the rollout fails.
* A claim (``AttemptStarted``) is accepted only for a queuing/requeuing rollout and only for the next attempt
  number: a second claim for the same offer is rejected (explicit version check).
* Heartbeats promote preparing/unresponsive attempts to running, and the rollout with its latest attempt.
* Status events (``RolloutStatusChanged``, ``AttemptStatusChanged``: runners, the SDK, the processor's timers and
  ``litstream cancel``) keep terminal states final: a status change of a finished rollout or of a succeeded or
  failed attempt is rejected, so a late timer or a second outcome never rewrites an outcome.
* The reference's update methods (``RolloutUpdated``, ``AttemptUpdated``: ``update_rollout`` and ``update_attempt``
  of the Store API and ``/v1/agl``) take the reference's contract: setting the status a rollout or attempt already
  has is a no-op, any other status is taken, finished or not, and a new status of the latest attempt sets the
  rollout's (even when the attempt's is unchanged), so the rollout follows its newest attempt. A rollout set back
  on the queue this way is offered again, for its next attempt number.
* A new attempt started on purpose (``start_attempt``, a forced ``AttemptStarted``) is accepted on a finished
  rollout too, which then follows it (``preparing``). A rollout that leaves a finished status has no end time
  again (the reference keeps the old one); an attempt keeps its end time until it ends again, as there.
* Each producer's events carry a strictly increasing ``producer_seq``; one at or below the last seen from that
  producer is a redelivery and is ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from litstream.schemas.events import (
    AttemptHeartbeat,
    AttemptStarted,
    AttemptStatusChanged,
    AttemptUpdated,
    Event,
    RolloutEnqueued,
    RolloutStatusChanged,
    RolloutUpdated,
    SequenceRequested,
)
from litstream.schemas.models import FINISHED, QUEUING, RUNNING

from .state import AttemptState, RolloutState

M = TypeVar("M", RolloutState, AttemptState)
# The events the fold applies: what belongs on rollout-events (``log_records`` checks records against it).
LIFECYCLE_EVENTS = (RolloutEnqueued, RolloutStatusChanged, AttemptStarted, AttemptHeartbeat, AttemptStatusChanged,
                    RolloutUpdated, AttemptUpdated, SequenceRequested)

ATTEMPT_TERMINAL = frozenset({"failed", "succeeded"})
ATTEMPT_UNHEALTHY = frozenset({"failed", "timeout", "unresponsive"})


@dataclass(frozen=True)
class Offer:
    """Effect: put the rollout on offer for attempt number ``attempt_sequence``."""

    attempt_sequence: int


class Outcome(NamedTuple):
    """What one event did. A named tuple: made once per event, it costs a third of a frozen dataclass."""

    state: RolloutState | None
    accepted: bool
    reason: str | None = None  # why an event was not applied (duplicate, rejected)
    duplicate: bool = False
    offer: Offer | None = None
    reserved: int | None = None  # first span sequence id reserved by this event

    @property
    def changed(self) -> bool:
        return self.accepted


def _seen(state: RolloutState, event: Event) -> RolloutState:
    producers = dict(state.producers)
    producers[event.meta.producer_id] = event.meta.producer_seq
    return _evolve(state, {"producers": producers})


def _reject(state: RolloutState | None, event: Event, reason: str) -> Outcome:
    return Outcome(_seen(state, event) if state is not None else None, accepted=False, reason=reason)


def _accept(state: RolloutState, event: Event, offer: Offer | None = None, reserved: int | None = None,
            **changes: Any) -> Outcome:
    meta = event.meta
    producers = dict(state.producers)
    producers[meta.producer_id] = meta.producer_seq
    changes["producers"] = producers  # changes is this call's own dict (keyword arguments)
    changes["version"] = state.version + 1
    changes["updated_ns"] = meta.timestamp_ns
    return Outcome(_evolve(state, changes), accepted=True, offer=offer, reserved=reserved)


def _evolve(model: M, changes: dict[str, Any]) -> M:
    """The fold's frozen state with ``changes``: a shallow copy, as each applied event replaces it."""
    return model.model_copy(update=changes)


def _replace_attempt(state: RolloutState, attempt: AttemptState) -> tuple[AttemptState, ...]:
    return tuple(attempt if a.attempt_id == attempt.attempt_id else a for a in state.attempts)


def rollout_status_from_attempt(state: RolloutState, attempt: AttemptState) -> str:
    """The rollout status the latest attempt implies (the reference's propagation table)."""
    if attempt.status in ATTEMPT_UNHEALTHY:
        cfg = state.config
        if attempt.status in cfg.retry_condition and attempt.sequence_id < cfg.max_attempts:
            return "requeuing"
        return "failed"
    return attempt.status


def apply(state: RolloutState | None, event: Event) -> Outcome:
    """Fold one event into a rollout's state."""
    if state is not None and event.meta.producer_seq <= state.producers.get(event.meta.producer_id, -1):
        return Outcome(state, accepted=False, reason="duplicate", duplicate=True)
    if isinstance(event, RolloutEnqueued):
        return _enqueued(state, event)
    if state is None:
        return _reject(None, event, f"unknown rollout {event.rollout_id}")
    if isinstance(event, AttemptStarted):
        return _attempt_started(state, event)
    if isinstance(event, AttemptHeartbeat):
        return _heartbeat(state, event)
    if isinstance(event, AttemptStatusChanged):
        return _attempt_status(state, event)
    if isinstance(event, RolloutStatusChanged):
        return _rollout_update(state, event, {"status": event.status}, event.time, final=True)
    if isinstance(event, RolloutUpdated):
        return _rollout_update(state, event, {f: getattr(event, f) for f in event.set_fields}, event.time,
                               final=False)
    if isinstance(event, AttemptUpdated):
        return _attempt_update(state, event)
    if isinstance(event, SequenceRequested):
        first = state.next_sequence_id
        return _accept(state, event, reserved=first, next_sequence_id=first + event.count)
    return _reject(state, event, f"{type(event).__name__} is not a lifecycle event")


def _enqueued(state: RolloutState | None, ev: RolloutEnqueued) -> Outcome:
    if state is not None:
        return _reject(state, ev, f"rollout {ev.rollout_id} already exists")
    started = ev.start_attempt_id is not None  # start_rollout: straight to an attempt, bypassing the queue
    attempts = (AttemptState(attempt_id=ev.start_attempt_id, sequence_id=1, start_time=ev.start_time,
                             worker_id=ev.worker_id),) if ev.start_attempt_id else ()
    new = RolloutState(
        rollout_id=ev.rollout_id, version=1, input=ev.input, start_time=ev.start_time, mode=ev.mode,
        resources_id=ev.resources_id, status="preparing" if started else "queuing", config=ev.config,
        metadata=ev.metadata, attempts=attempts, producers={ev.meta.producer_id: ev.meta.producer_seq},
        updated_ns=ev.meta.timestamp_ns,
    )
    return Outcome(new, accepted=True, offer=None if started else Offer(1))


def offer_outdated(state: RolloutState, attempt_sequence: int) -> bool:
    """Whether a claim of attempt number ``attempt_sequence`` can never win, judged from ``state``, which may be
    older than the offer (a replica that has not folded the requeue behind it yet): the attempt it offers exists
    already. That stays true as the log goes on (attempts are only added). A finished rollout is not a reason: an
    update may put it back on the queue later in the log than ``state`` has read, and the claim of an offer it
    outlived is refused by the fold."""
    return len(state.attempts) >= attempt_sequence


def _attempt_started(state: RolloutState, ev: AttemptStarted) -> Outcome:
    expected = len(state.attempts) + 1
    if ev.force:  # start_attempt: bypasses the queue and max_attempts, and reopens a finished rollout
        if state.attempt(ev.attempt_id) is not None:
            return _reject(state, ev, f"attempt id {ev.attempt_id} already used")
        attempt = AttemptState(attempt_id=ev.attempt_id, sequence_id=expected, start_time=ev.start_time,
                               worker_id=ev.worker_id)
        return _accept(state, ev, attempts=state.attempts + (attempt,), status="preparing", end_time=None)
    if state.status not in QUEUING:
        return _reject(state, ev, f"claim rejected: rollout is {state.status}, not on offer")
    if ev.sequence_id != expected:
        return _reject(state, ev, f"claim rejected: attempt {ev.sequence_id} claimed, next is {expected}")
    if state.attempt(ev.attempt_id) is not None:
        return _reject(state, ev, f"claim rejected: attempt id {ev.attempt_id} already used")
    attempt = AttemptState(attempt_id=ev.attempt_id, sequence_id=ev.sequence_id, start_time=ev.start_time,
                           worker_id=ev.worker_id)
    return _accept(state, ev, attempts=state.attempts + (attempt,), status="preparing")


def _heartbeat(state: RolloutState, ev: AttemptHeartbeat) -> Outcome:
    attempt = state.attempt(ev.attempt_id)
    if attempt is None:
        return _reject(state, ev, f"unknown attempt {ev.attempt_id}")
    beat = max(ev.time, attempt.last_heartbeat_time or ev.time)
    next_seq = state.next_sequence_id
    if ev.max_sequence_id is not None:
        next_seq = max(next_seq, ev.max_sequence_id + 1)  # ids the sender chose itself move the counter
    # A heartbeat revives a preparing or unresponsive attempt, but not under a finished rollout: it would be a
    # running attempt of a rollout that is over. The beat and the counter are still recorded.
    revive = attempt.status in {"preparing", "unresponsive"} and state.status not in FINISHED
    status = "running" if revive else attempt.status
    attempt = _evolve(attempt, {"last_heartbeat_time": beat, "status": status})
    rollout_status = state.status
    if attempt is not None and state.latest_attempt and state.latest_attempt.attempt_id == attempt.attempt_id:
        if state.status in {"preparing", "requeuing"} and attempt.status == "running":
            rollout_status = "running"
    return _accept(state, ev, attempts=_replace_attempt(state, attempt), status=rollout_status,
                   next_sequence_id=next_seq)


def _attempt_status(state: RolloutState, ev: AttemptStatusChanged) -> Outcome:
    attempt = state.attempt(ev.attempt_id)
    if attempt is None:
        return _reject(state, ev, f"unknown attempt {ev.attempt_id}")
    changes: dict[str, object] = {"worker_id": ev.worker_id or attempt.worker_id}
    if ev.error is not None:
        changes["error"] = ev.error
    return _set_attempt(state, ev, attempt, ev.status, ev.time, changes, final=True)


def _attempt_update(state: RolloutState, ev: AttemptUpdated) -> Outcome:
    if ev.attempt_id == "latest":
        attempt = state.latest_attempt
    else:
        attempt = state.attempt(ev.attempt_id)
    if attempt is None:
        return _reject(state, ev, f"unknown attempt {ev.attempt_id}")
    changes: dict[str, object] = {f: getattr(ev, f) for f in ev.set_fields if f != "status"}
    if changes.get("metadata") is None and "metadata" in changes:
        changes["metadata"] = {}
    status = ev.status if "status" in ev.set_fields and ev.status is not None else None
    return _set_attempt(state, ev, attempt, status, ev.time, changes, final=False)


def _set_attempt(state: RolloutState, ev: Event, attempt: AttemptState, status: str | None, time: float,
                 changes: dict[str, object], final: bool) -> Outcome:
    """Change an attempt; a new status of the latest attempt drives the rollout's. ``final``: a status event,
    refused for a succeeded or failed attempt and under a finished rollout."""
    if status is not None and final:
        if attempt.status in ATTEMPT_TERMINAL:
            return _reject(state, ev, f"attempt {attempt.attempt_id} already {attempt.status}")
        if state.status in FINISHED:  # no attempt of a finished rollout changes status again
            return _reject(state, ev, f"rollout already {state.status}")
    if status is not None and status != attempt.status:
        changes["status"] = status
        if status in ATTEMPT_TERMINAL:
            changes["end_time"] = time
    updated = _evolve(attempt, changes)
    rollout_changes: dict[str, Any] = {"attempts": _replace_attempt(state, updated)}
    offer = None
    is_latest = state.latest_attempt is not None and state.latest_attempt.attempt_id == attempt.attempt_id
    if status is not None and is_latest:
        new_status = rollout_status_from_attempt(state, updated)
        if new_status != state.status:
            rollout_changes.update(_status_change(state, new_status, time))
            if new_status in QUEUING and state.status not in QUEUING:
                offer = Offer(len(state.attempts) + 1)
    return _accept(state, ev, offer, **rollout_changes)


def _status_change(state: RolloutState, status: str, time: float) -> dict[str, Any]:
    """A rollout's new status (another than its own) and its end time: set when it finishes, gone when it leaves
    a finished status."""
    if status in FINISHED:
        return {"status": status, "end_time": time}
    if state.status in FINISHED:
        return {"status": status, "end_time": None}
    return {"status": status}


def _rollout_update(state: RolloutState, ev: Event, fields: dict[str, object], time: float, final: bool) -> Outcome:
    """update_rollout (``final=False``) or a status event (``final=True``: terminal states are final). Setting the
    status the rollout has changes nothing; fields other than the status may change whatever the status."""
    status = fields.get("status")
    if status is not None and final and state.status in FINISHED:
        return _reject(state, ev, f"rollout already {state.status}; terminal states are final")
    changes: dict[str, Any] = {k: v for k, v in fields.items() if k != "status"}
    if "metadata" in changes and changes["metadata"] is None:
        changes["metadata"] = {}
    if "config" in changes and changes["config"] is None:
        return _reject(state, ev, "config cannot be null")
    offer = None
    if isinstance(status, str) and status != state.status:
        changes.update(_status_change(state, status, time))
        if status in QUEUING and state.status not in QUEUING:
            offer = Offer(len(state.attempts) + 1)
    return _accept(state, ev, offer, **changes)


__all__ = ["apply", "Outcome", "Offer", "rollout_status_from_attempt", "RUNNING"]
