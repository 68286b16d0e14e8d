"""``/v1/rollouts``: list the rollouts (optionally by status), get one, enqueue one; ``as_of`` shows them as they
were at an earlier point of the log (replayed with the fold).

An enqueue goes through the gateway's store, like ``/v1/agl``'s: it answers once the lifecycle processor has
stored the rollout, with the whole rollout, so an immediate read through either API finds it."""

from __future__ import annotations

import asyncio
import json
from typing import Any, get_args

from aiohttp import web
from pydantic import ValidationError

from litstream.schemas.models import EnqueueRolloutRequest, RolloutStatus
from litstream.streams.replay import parse_until
from litstream.workers.store import StoreError

from .context import context_of, error, read_json

routes = web.RouteTableDef()
STATUSES: tuple[str, ...] = get_args(RolloutStatus)


@routes.get("/v1/rollouts")
async def list_rollouts(request: web.Request) -> web.Response:
    status = request.query.get("status")
    if status is not None and status not in STATUSES:
        return error(400, f"unknown status {status!r}; one of {', '.join(STATUSES)}", "status")
    unknown = sorted(set(request.query) - {"status", "as_of"})
    if unknown:
        return error(400, f"unknown query parameter {unknown[0]!r}; the ones there are: status, as_of", unknown[0])
    items, as_of = await _snapshots(request, None)
    if isinstance(items, web.Response):
        return items
    if status:
        items = [i for i in items if i["status"] == status]
    return web.json_response({"items": items, "total": len(items), **as_of})


@routes.get("/v1/rollouts/{rollout_id}")
async def get_rollout(request: web.Request) -> web.Response:
    rollout_id = request.match_info["rollout_id"]
    unknown = sorted(set(request.query) - {"as_of"})
    if unknown:
        return error(400, f"unknown query parameter {unknown[0]!r}; the only one is 'as_of'", unknown[0])
    items, as_of = await _snapshots(request, rollout_id)
    if isinstance(items, web.Response):
        return items
    if not items:
        return error(404, f"no rollout {rollout_id}" + (f" as of {request.query['as_of']}" if as_of else ""))
    return web.json_response({**items[0], **as_of})


async def _snapshots(request: web.Request, rollout_id: str | None) -> tuple[Any, dict[str, str]]:
    """The snapshots now, or with ``as_of`` as they were then (and that point as offsets); or the 400 to send."""
    context = context_of(request)
    text = request.query.get("as_of")
    if text is None:
        return await asyncio.to_thread(context.snapshots, rollout_id), {}
    try:
        items, offsets = await asyncio.to_thread(context.snapshots_as_of, parse_until(text), rollout_id)
    except ValueError as exc:
        return error(400, str(exc), "as_of"), {}
    return items, {"as_of": offsets}


@routes.post("/v1/rollouts")
async def create_rollout(request: web.Request) -> web.Response:
    body = await read_json(request)
    try:
        req = EnqueueRolloutRequest.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        return error(400, err["msg"], ".".join(str(p) for p in err["loc"]))
    store = context_of(request).store
    try:
        rollout = await store.enqueue_rollout(req.input, req.mode, req.resources_id, req.config, req.metadata)
    except StoreError as exc:  # the pipeline does not answer: worth a retry, not the caller's fault
        return error(503, str(exc))
    except ValueError as exc:
        return error(400, str(exc), getattr(exc, "field", None))
    return web.json_response(rollout.model_dump(mode="json"), status=201, dumps=lambda o: json.dumps(o, default=str))
