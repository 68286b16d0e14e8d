"""Workers: querying them, reading one, its heartbeat."""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web

from litstream.schemas.models import Worker, WorkerStatus

from .errors import HTTPFieldError
from .http import Page, check_page, dump, null_refused, parse, query_params, read_body, store_of

routes = web.RouteTableDef()


class QueryWorkers(Page):
    status_in: list[WorkerStatus] | None = None
    worker_id_contains: str | None = None
    filter_logic: Literal["and", "or"] = "and"


async def _query(request: web.Request, data: Any) -> web.Response:
    q = parse(QueryWorkers, data)
    check_page(q, Worker)
    return dump(await store_of(request).query_workers(
        status_in=q.status_in, worker_id_contains=q.worker_id_contains, filter_logic=q.filter_logic,
        sort_by=q.sort_by, sort_order=q.sort_order, limit=q.limit, offset=q.offset))


@routes.get("/workers")
async def query_get(request: web.Request) -> web.Response:
    return await _query(request, query_params(request, ("status_in",)))


@routes.post("/workers/search")
async def query_post(request: web.Request) -> web.Response:
    return await _query(request, await read_body(request))


@routes.get("/workers/{worker_id}")
async def get_worker(request: web.Request) -> web.Response:
    return dump(await store_of(request).get_worker_by_id(request.match_info["worker_id"]))


@routes.post("/workers/{worker_id}")
async def update_worker(request: web.Request) -> web.Response:
    """A heartbeat; with ``heartbeat_stats`` (an object, not null) it records them too."""
    body = await read_body(request)
    worker_id = request.match_info["worker_id"]
    if not isinstance(body, dict) or "heartbeat_stats" not in body:
        return dump(await store_of(request).update_worker(worker_id))
    stats = body["heartbeat_stats"]
    if stats is None:
        raise null_refused("heartbeat_stats")
    if not isinstance(stats, dict):
        raise HTTPFieldError(422, "heartbeat_stats must be an object", "heartbeat_stats")
    return dump(await store_of(request).update_worker(worker_id, stats))
