"""Workers folded from ``workers`` observations (pure), with the reference's derivation: an attempt that
succeeded or failed leaves its worker idle, a timed-out or unresponsive one leaves it unknown, any other
status makes it busy; a dequeue stamps ``last_dequeue_time``; an empty dequeue makes it idle; heartbeats
never change the status, and one without stats keeps the stats reported before (as the reference's
``update_worker`` does)."""

from __future__ import annotations

from litstream.schemas.events import WorkerObserved
from litstream.schemas.models import Worker

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
