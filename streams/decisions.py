"""Decisions the fold implies but time triggers: when an attempt times out or goes unresponsive (pure).

The lifecycle processor asks :func:`next_deadline` after every change and :func:`due` when its clock passes that
deadline; the outcome is written back to the log as an ``AttemptStatusChanged`` event, so the decision is a
fact that replay sees too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from litstream.schemas.models import RUNNING

from .state import RolloutState

TimerKind = Literal["timeout", "unresponsive"]
WATCHED_ATTEMPT_STATUSES = frozenset({"preparing", "running"})


@dataclass(frozen=True)
class Deadline:
    at: float  # epoch seconds
    attempt_id: str


def _timers(state: RolloutState) -> list[tuple[float, TimerKind]]:
    attempt = state.latest_attempt
    if state.status not in RUNNING or attempt is None or attempt.status not in WATCHED_ATTEMPT_STATUSES:
        return []
    cfg = state.config
    out: list[tuple[float, TimerKind]] = []
    if cfg.timeout_seconds is not None:
        out.append((attempt.start_time + cfg.timeout_seconds, "timeout"))  # from the attempt's start
    if cfg.unresponsive_seconds is not None:
        since = attempt.last_heartbeat_time if attempt.last_heartbeat_time is not None else attempt.start_time
        out.append((since + cfg.unresponsive_seconds, "unresponsive"))
    return out


def next_deadline(state: RolloutState) -> Deadline | None:
    """The earliest moment a timer of the latest attempt can fire, or None if none is armed."""
    timers = _timers(state)
    attempt = state.latest_attempt
    if not timers or attempt is None:
        return None
    return Deadline(min(t for t, _ in timers), attempt.attempt_id)


def due(state: RolloutState, now: float) -> TimerKind | None:
    """Which timer has fired at ``now``: timeout is checked first, as in the reference."""
    fired = {kind for at, kind in _timers(state) if now > at}
    if "timeout" in fired:
        return "timeout"
    if "unresponsive" in fired:
        return "unresponsive"
    return None
