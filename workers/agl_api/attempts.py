"""A rollout's attempts: starting one, querying them, the latest, updating one."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import BaseModel

from litstream.schemas.models import Attempt, AttemptStatus

from .http import (
    Page,
    check_page,
    created,
    dump,
    parse,
    parse_body,
    query_params,
    read_body,
    store_of,
    update_fields,
)

routes = web.RouteTableDef()
NOT_NULL = frozenset({"status", "worker_id", "last_heartbeat_time", "metadata"})  # as the reference refuses


class WorkerIdRequest(BaseModel):
    worker_id: str | None = None


class QueryAttempts(Page):
    sort_by: str | None = "sequence_id"


class UpdateAttempt(BaseModel):
    status: AttemptStatus | None = None
    worker_id: str | None = None
    last_heartbeat_time: float | None = None
    metadata: dict[str, Any] | None = None


@routes.post("/rollouts/{rollout_id}/attempts")
async def start_attempt(request: web.Request) -> web.Response:
    req = await parse_body(request, WorkerIdRequest)
    return created(await store_of(request).start_attempt(request.match_info["rollout_id"], req.worker_id))


async def _query(request: web.Request, data: Any) -> web.Response:
    q = parse(QueryAttempts, data)
    check_page(q, Attempt)
    return dump(await store_of(request).query_attempts(
        request.match_info["rollout_id"], sort_by=q.sort_by or "sequence_id", sort_order=q.sort_order,
        limit=q.limit, offset=q.offset))


@routes.get("/rollouts/{rollout_id}/attempts")
async def query_get(request: web.Request) -> web.Response:
    return await _query(request, query_params(request))


@routes.post("/rollouts/{rollout_id}/attempts/search")
async def query_post(request: web.Request) -> web.Response:
    return await _query(request, await read_body(request))


@routes.get("/rollouts/{rollout_id}/attempts/latest")
async def latest_attempt(request: web.Request) -> web.Response:
    return dump(await store_of(request).get_latest_attempt(request.match_info["rollout_id"]))


@routes.post("/rollouts/{rollout_id}/attempts/{attempt_id}")
async def update_attempt(request: web.Request) -> web.Response:
    fields = await update_fields(request, UpdateAttempt, NOT_NULL)
    return dump(await store_of(request).update_attempt(request.match_info["rollout_id"],
                                                       request.match_info["attempt_id"], **fields))
