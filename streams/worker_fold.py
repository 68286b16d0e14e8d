"""Workers folded from ``workers`` observations (pure), with the reference's derivation: an attempt that
succeeded or failed leaves its worker idle, a timed-out or unresponsive one leaves it unknown, any other
status makes it busy; a dequeue stamps ``last_dequeue_time``; an empty dequeue makes it idle; heartbeats
never change the status, and one without stats keeps the stats reported before (as the reference's
``update_worker`` does)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from litstream.schemas.events import WorkerObserved
from litstream.schemas.models import Worker

from .state import AttemptState, RolloutState

IDLE_AFTER = frozenset({"succeeded", "failed"})
UNKNOWN_AFTER = frozenset({"timeout", "unresponsive"})


def worker_status_for(attempt_status: str) -> str:
    if attempt_status in IDLE_AFTER:
        return "idle"
    if attempt_status in UNKNOWN_AFTER:
        return "unknown"
    return "busy"


def apply_worker(worker: Worker | None, ev: WorkerObserved) -> Worker:
    w = worker or Worker(worker_id=ev.worker_id)
    changes: dict[str, object] = {}
    if ev.kind == "heartbeat":
        changes = {"last_heartbeat_time": ev.time}
        if ev.heartbeat_stats is not None:
            changes["heartbeat_stats"] = ev.heartbeat_stats
    elif ev.kind == "empty_dequeue":
        changes = {"status": "idle", "last_idle_time": ev.time, "last_dequeue_time": ev.time,
                   "current_rollout_id": None, "current_attempt_id": None}
    else:
        # Observations come from many lifecycle partitions: an older one must not undo a newer one.
        last = max(t for t in (w.last_busy_time, w.last_idle_time, w.last_dequeue_time, 0.0) if t is not None)
        if ev.time < last:
            return w
        if ev.status == "busy":
            changes = {"status": "busy", "last_busy_time": ev.time, "current_rollout_id": ev.rollout_id,
                       "current_attempt_id": ev.attempt_id}
        elif ev.status == "idle":
            changes = {"status": "idle", "last_idle_time": ev.time, "current_rollout_id": None,
                       "current_attempt_id": None}
        else:
            changes = {"status": "unknown", "current_rollout_id": None, "current_attempt_id": None}
        if ev.kind == "dequeue":
            changes["last_dequeue_time"] = ev.time
    return w.model_copy(update=changes)


def attempt_observations(before: RolloutState | None, after: RolloutState, at: float,
                         stamp: Callable[[], dict[str, Any]]) -> list[WorkerObserved]:
    """What the workers topic is told after an event moved ``before`` to ``after``: one observation per attempt
    whose status or worker changed (workers are derived from attempts). ``stamp`` gives each its identity."""
    old: dict[str, AttemptState] = {a.attempt_id: a for a in before.attempts} if before is not None else {}
    observed = []
    for a in after.attempts:
        prev = old.get(a.attempt_id)
        if not a.worker_id or (prev is not None and (prev.status, prev.worker_id) == (a.status, a.worker_id)):
            continue
        observed.append(WorkerObserved.rebuilt(**stamp(), worker_id=a.worker_id, time=at,
                                               kind="dequeue" if prev is None else "attempt",
                                               status=worker_status_for(a.status), rollout_id=after.rollout_id,
                                               attempt_id=a.attempt_id, heartbeat_stats=None))
    return observed
