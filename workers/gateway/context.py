"""What the gateway's routes share: the settings, the event producer, the rollouts' state view, and the shape of
an error (``{"error": ..., "field": ...}``)."""

from __future__ import annotations

import json
import threading
from typing import Any

from aiohttp import web
from pydantic_core import from_json

from litstream.infra.producer import EventProducer
from litstream.infra.settings import Settings
from litstream.streams.replay import OUTCOME_FIELDS, Until, replay
from litstream.streams.stateview import StateView
from litstream.workers.store import LitStore


class GatewayContext:
    def __init__(self, settings: Settings, events: EventProducer, store: LitStore) -> None:
        self.settings = settings
        self.events = events
        self.store = store  # the one store the gateway's APIs share: what one accepted, the others show
        self._view_lock = threading.Lock()
        self._view: StateView | None = None  # made on first use: it opens a consumer

    def snapshots(self, rollout_id: str | None = None) -> list[dict[str, Any]]:
        """Every rollout's latest snapshot (or only ``rollout_id``'s), caught up with its topic (blocking: run it
        in a thread)."""
        with self._view_lock:
            if self._view is None:
                self._view = StateView(self.settings)
            snaps = self._view.catch_up(timeout=5.0)
            chosen = snaps.values() if rollout_id is None else [snaps[rollout_id]] if rollout_id in snaps else []
            return [s.model_dump(mode="json") for s in chosen]

    def snapshots_as_of(self, until: Until, rollout_id: str | None = None) -> tuple[list[dict[str, Any]], str]:
        """The rollouts (or only ``rollout_id``) as they were at a point of the log, replayed with the fold, and
        that point as offsets (blocking: one read of ``rollout-events`` up to it)."""
        result = replay(self.settings, until=until, rollout_id=rollout_id)
        items = [s.snapshot().model_dump(mode="json", exclude=OUTCOME_FIELDS) for s in result.states.values()]
        return items, str(Until(offsets=result.until))


CONTEXT = web.AppKey("gateway", GatewayContext)


def context_of(request: web.Request) -> GatewayContext:
    return request.config_dict[CONTEXT]


def error(status: int, message: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status)


async def read_json(request: web.Request) -> Any:
    try:
        return from_json(await request.read())  # pydantic-core's parser: a quarter of json.loads' time
    except ValueError as exc:
        raise web.HTTPBadRequest(text=json.dumps({"error": f"body is not JSON: {exc}"}),
                                 content_type="application/json") from None
