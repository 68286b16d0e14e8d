"""Rollouts: the queue (enqueue, dequeue), starting one directly, querying, reading, updating and waiting."""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel

from litstream.schemas.models import EnqueueRolloutRequest, Rollout, RolloutConfig, RolloutMode, RolloutStatus

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
NOT_NULL = frozenset({"status", "config"})  # as the reference refuses


class RolloutRequest(BaseModel):
    input: Any
    mode: RolloutMode | None = None
    resources_id: str | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None
    worker_id: str | None = None


class EnqueueManyRequest(BaseModel):
    rollouts: list[EnqueueRolloutRequest]


class DequeueRequest(BaseModel):
    limit: int = 1
    worker_id: str | None = None


class QueryRollouts(Page):
    status_in: list[RolloutStatus] | None = None
    rollout_id_in: list[str] | None = None
    rollout_id_contains: str | None = None
    filter_logic: Literal["and", "or"] = "and"


class UpdateRollout(BaseModel):
    input: Any = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    status: RolloutStatus | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None


class WaitRequest(BaseModel):
    rollout_ids: list[str]
    timeout: float | None = None


@routes.post("/queues/rollouts/enqueue")
async def enqueue(request: web.Request) -> web.Response:
    req = await parse_body(request, EnqueueManyRequest)
    store = store_of(request)
    if len(req.rollouts) == 1:
        r = req.rollouts[0]
        return created([await store.enqueue_rollout(r.input, r.mode, r.resources_id, r.config, r.metadata)])
    return created(await store.enqueue_many_rollouts(req.rollouts))


@routes.post("/queues/rollouts/dequeue")
async def dequeue(request: web.Request) -> web.Response:
    req = await parse_body(request, DequeueRequest)
    if req.limit <= 0:
        return dump([])
    return dump(await store_of(request).dequeue_many_rollouts(limit=req.limit, worker_id=req.worker_id))


@routes.post("/rollouts")
async def start_rollout(request: web.Request) -> web.Response:
    req = await parse_body(request, RolloutRequest)
    return created(await store_of(request).start_rollout(req.input, req.mode, req.resources_id, req.config,
                                                         req.metadata, req.worker_id))


async def _query(request: web.Request, data: Any) -> web.Response:
    q = parse(QueryRollouts, data)
    check_page(q, Rollout)
    return dump(await store_of(request).query_rollouts(
        status_in=q.status_in, rollout_id_in=q.rollout_id_in, rollout_id_contains=q.rollout_id_contains,
        filter_logic=q.filter_logic, sort_by=q.sort_by, sort_order=q.sort_order, limit=q.limit, offset=q.offset))


@routes.get("/rollouts")
async def query_get(request: web.Request) -> web.Response:
    return await _query(request, query_params(request, ("status_in", "rollout_id_in")))


@routes.post("/rollouts/search")
async def query_post(request: web.Request) -> web.Response:
    return await _query(request, await read_body(request))


@routes.get("/rollouts/{rollout_id}")
async def get_rollout(request: web.Request) -> web.Response:
    return dump(await store_of(request).get_rollout_by_id(request.match_info["rollout_id"]))


@routes.post("/rollouts/{rollout_id}")
async def update_rollout(request: web.Request) -> web.Response:
    fields = await update_fields(request, UpdateRollout, NOT_NULL)
    return dump(await store_of(request).update_rollout(request.match_info["rollout_id"], **fields))


@routes.post("/waits/rollouts")
async def wait(request: web.Request) -> web.Response:
    req = await parse_body(request, WaitRequest)
    return dump(await store_of(request).wait_for_rollouts(rollout_ids=req.rollout_ids, timeout=req.timeout))
