"""Named resources (the policy's prompts, model endpoints...): querying, adding, the latest, updating, reading."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from litstream.schemas.models import NamedResources, ResourcesUpdate

from .errors import invalid
from .http import Page, check_page, created, dump, parse, query_params, read_body, store_of

routes = web.RouteTableDef()
_NAMED = TypeAdapter(NamedResources)


class QueryResources(Page):
    resources_id: str | None = None
    resources_id_contains: str | None = None


def _named(data: Any) -> NamedResources:
    try:
        return _NAMED.validate_python(data)
    except ValidationError as exc:
        raise invalid(exc) from None


@routes.get("/resources")
async def query_resources(request: web.Request) -> web.Response:
    q = parse(QueryResources, query_params(request))
    check_page(q, ResourcesUpdate)
    return dump(await store_of(request).query_resources(
        resources_id=q.resources_id, resources_id_contains=q.resources_id_contains, sort_by=q.sort_by,
        sort_order=q.sort_order, limit=q.limit, offset=q.offset))


@routes.post("/resources")
async def add_resources(request: web.Request) -> web.Response:
    return created(await store_of(request).add_resources(_named(await read_body(request))))


@routes.get("/resources/latest")  # before /resources/{resources_id}, which would match it too
async def latest_resources(request: web.Request) -> web.Response:
    return dump(await store_of(request).get_latest_resources())


@routes.post("/resources/{resources_id}")
async def update_resources(request: web.Request) -> web.Response:
    named = _named(await read_body(request))
    return dump(await store_of(request).update_resources(request.match_info["resources_id"], named))


@routes.get("/resources/{resources_id}")
async def get_resources(request: web.Request) -> web.Response:
    return dump(await store_of(request).get_resources_by_id(request.match_info["resources_id"]))
