"""``/v1/rollouts``: list the rollouts (optionally by status) and enqueue one."""

from __future__ import annotations

import asyncio

from aiohttp import web
from pydantic import ValidationError

from litstream.schemas.models import EnqueueRolloutRequest

from ..client import enqueue_rollout
from .context import context_of, error, read_json

routes = web.RouteTableDef()


@routes.get("/v1/rollouts")
async def list_rollouts(request: web.Request) -> web.Response:
    items = await asyncio.to_thread(context_of(request).snapshots)
    status = request.query.get("status")
    if status:
        items = [i for i in items if i["status"] == status]
    return web.json_response({"items": items, "total": len(items)})


@routes.post("/v1/rollouts")
async def create_rollout(request: web.Request) -> web.Response:
    body = await read_json(request)
    try:
        req = EnqueueRolloutRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        return error(400, err["msg"], ".".join(str(p) for p in err["loc"]))
    events = context_of(request).events
    try:
        event = enqueue_rollout(events, req.input, mode=req.mode, resources_id=req.resources_id,
                                config=req.config, metadata=req.metadata)
    except (ValueError, ValidationError) as exc:
        return error(400, str(exc))
    await asyncio.to_thread(events.flush)
    return web.json_response({"rollout_id": event.rollout_id, "status": "queuing"}, status=201)
