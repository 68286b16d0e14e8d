"""Producer-side commands that start a rollout's life: enqueue, pinned to the resources it will run with."""

from __future__ import annotations

import time
from typing import Any

from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.schemas.events import RolloutEnqueued, RolloutStatusChanged
from litstream.schemas.models import RolloutConfig, RolloutMode, new_rollout_id
from litstream.streams.views import ResourcesView


def cancel_rollout(events: EventProducer, rollout_id: str) -> RolloutStatusChanged:
    """Ask for a rollout to be cancelled: a status event, so a rollout that finished first keeps its outcome
    (terminal states are final) and one a runner claimed meanwhile ends cancelled, as ``litstream cancel``."""
    event = RolloutStatusChanged(meta=events.factory.meta(rollout_id), status="cancelled", time=time.time())
    events.send(events.topics.rollout_events, event)
    return event


def latest_resources_id(settings: Settings, events: EventProducer, timeout: float = 15.0) -> str | None:
    """The newest resources published so far (None when there are none), read from the resources topic: a
    rollout enqueued without resources runs with these, as the reference's store pins the latest at enqueue."""
    view = ResourcesView(settings, events.codec)
    try:
        if not view.caught_up(timeout):
            raise TimeoutError(f"the resources topic was not read to its end within {timeout:.0f}s")
        return view.state.latest_id
    finally:
        view.close()


def enqueue_rollout(events: EventProducer, input: Any, *, mode: RolloutMode | None = None,
                    resources_id: str | None = None, config: RolloutConfig | None = None,
                    metadata: dict[str, Any] | None = None, rollout_id: str | None = None) -> RolloutEnqueued:
    """Put a new rollout on the queue; returns the event (its ``rollout_id`` names the rollout). ``resources_id``
    None leaves the choice to the runner (the latest when the attempt starts); pin it with
    :func:`latest_resources_id` to run with the latest of now."""
    event = RolloutEnqueued.new(events.factory, rollout_id or new_rollout_id(), input, mode=mode,
                                resources_id=resources_id, config=config, metadata=metadata)
    events.send(events.topics.rollout_events, event)
    return event
