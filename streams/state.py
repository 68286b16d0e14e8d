"""Rollout state as the fold builds it: immutable values, replaced (never mutated) by each applied event."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from litstream.schemas.events import AttemptSnapshot, AvroRolloutConfig, EventMeta, RolloutSnapshot, rebuilt
from litstream.schemas.models import (
    AttemptedRollout,
    Rollout,
    RolloutMode,
    RolloutStatus,
)

AttemptState = AttemptSnapshot  # the fold's attempt is what readers get


class RolloutState(BaseModel):
    """One rollout and its attempts after ``version`` accepted events.

    ``producers`` holds the last sequence number seen from each producer of this rollout's events: an event at
    or below it is a redelivery and changes nothing.
    """

    model_config = ConfigDict(frozen=True)
    rollout_id: str
    version: int
    input: Any
    start_time: float
    end_time: float | None = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    status: RolloutStatus = "queuing"
    config: AvroRolloutConfig = Field(default_factory=AvroRolloutConfig)
    metadata: dict[str, Any] = Field(default_factory=dict)
    attempts: tuple[AttemptState, ...] = ()
    producers: dict[str, int] = Field(default_factory=dict)
    updated_ns: int = 0
    next_sequence_id: int = 1  # span sequence ids handed out per rollout, strictly increasing

    @property
    def latest_attempt(self) -> AttemptState | None:
        return self.attempts[-1] if self.attempts else None

    def attempt(self, attempt_id: str) -> AttemptState | None:
        for a in self.attempts:
            if a.attempt_id == attempt_id:
                return a
        return None

    def snapshot(self, last: EventMeta | None = None, accepted: bool = True,
                 reason: str | None = None, reserved: int | None = None) -> RolloutSnapshot:
        """The state for readers, with the outcome of the event that led to it (its values came from validated
        events: :func:`rebuilt`)."""
        return RolloutSnapshot.rebuilt(
            next_sequence_id=self.next_sequence_id, last_reserved=reserved,
            last_event_id=last.event_id if last else None, last_producer_id=last.producer_id if last else None,
            last_producer_seq=last.producer_seq if last else None, last_accepted=accepted, last_reason=reason,
            rollout_id=self.rollout_id, version=self.version, input=self.input, start_time=self.start_time,
            end_time=self.end_time, mode=self.mode, resources_id=self.resources_id, status=self.status,
            config=self.config, metadata=self.metadata, updated_ns=self.updated_ns,
            attempts=list(self.attempts),
        )


def rollout_from_snapshot(snap: RolloutSnapshot) -> Rollout | AttemptedRollout:
    """The reference's view of a snapshot: the rollout with its latest attempt attached, if any. The caller gets
    its own containers (validation copies the config, dicts and lists), so changing the returned rollout never
    changes the store's view of it."""
    base: dict[str, Any] = {
        "rollout_id": snap.rollout_id, "input": snap.input, "start_time": snap.start_time, "end_time": snap.end_time,
        "mode": snap.mode, "resources_id": snap.resources_id, "status": snap.status, "config": dict(snap.config),
        "metadata": snap.metadata,
    }
    if not snap.attempts:
        return rebuilt(Rollout, base)
    a = snap.attempts[-1]
    attempt = {"rollout_id": snap.rollout_id, "attempt_id": a.attempt_id, "sequence_id": a.sequence_id,
               "start_time": a.start_time, "end_time": a.end_time, "status": a.status, "worker_id": a.worker_id,
               "last_heartbeat_time": a.last_heartbeat_time, "metadata": a.metadata}
    return rebuilt(AttemptedRollout, {**base, "attempt": attempt})
