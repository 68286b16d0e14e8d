"""Producer-side commands that start a rollout's life: enqueue (and, later, cancel/requeue)."""

from __future__ import annotations

from typing import Any

from litstream.infra.producer import EventProducer
from litstream.schemas.events import RolloutEnqueued
from litstream.schemas.models import RolloutConfig, RolloutMode, new_rollout_id


def enqueue_rollout(events: EventProducer, input: Any, *, mode: RolloutMode | None = None,
                    resources_id: str | None = None, config: RolloutConfig | None = None,
                    metadata: dict[str, Any] | None = None, rollout_id: str | None = None) -> RolloutEnqueued:
    """Put a new rollout on the queue; returns the event (its ``rollout_id`` names the rollout)."""
    event = RolloutEnqueued.new(events.factory, rollout_id or new_rollout_id(), input, mode=mode,
                                resources_id=resources_id, config=config, metadata=metadata)
    events.send(events.topics.rollout_events, event)
    return event
