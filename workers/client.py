"""Producer-side commands that start a rollout's life: enqueue (and, later, cancel/requeue)."""

from __future__ import annotations

import time
from typing import Any

from litstream.infra.producer import EventProducer
from litstream.schemas.events import AvroRolloutConfig, RolloutEnqueued
from litstream.schemas.models import RolloutConfig, RolloutMode, new_rollout_id


def enqueue_rollout(events: EventProducer, input: Any, *, mode: RolloutMode | None = None,
                    resources_id: str | None = None, config: RolloutConfig | None = None,
                    metadata: dict[str, Any] | None = None, rollout_id: str | None = None) -> RolloutEnqueued:
    """Put a new rollout on the queue; returns the event (its ``rollout_id`` names the rollout)."""
    rid = rollout_id or new_rollout_id()
    event = RolloutEnqueued(
        meta=events.factory.meta(rid), input=input, start_time=time.time(), mode=mode, resources_id=resources_id,
        config=AvroRolloutConfig(**(config.model_dump() if config else {})), metadata=metadata or {},
    )
    events.send(events.topics.rollout_events, event)
    return event
