"""Lineage over REST (docs/history.md): ``/v1/versions/{version}/lineage`` (what trained a policy version) and
``/v1/rollouts/{rollout_id}/lineage`` (the versions behind a rollout's calls and those its triplets went into),
from ClickHouse's views through the gateway's store."""

from __future__ import annotations

from aiohttp import web

from litstream.infra.clickhouse import NoOwnerError, QueryError

from .context import context_of, error

routes = web.RouteTableDef()


@routes.get("/v1/versions/{version}/lineage")
async def version_lineage(request: web.Request) -> web.Response:
    text = request.match_info["version"].removeprefix("policy-v")
    if not text.isdigit():
        return error(400, f"not a policy version: {request.match_info['version']!r} (a number, or policy-vN)",
                     "version")
    try:
        lineage = await context_of(request).store.version_lineage(int(text))
    except (NoOwnerError, QueryError, TimeoutError) as exc:  # the sink that owns the tables does not answer
        return error(503, f"the lineage tables are not readable now: {exc}")
    return web.json_response(lineage.model_dump(mode="json"))


@routes.get("/v1/rollouts/{rollout_id}/lineage")
async def rollout_lineage(request: web.Request) -> web.Response:
    try:
        lineage = await context_of(request).store.rollout_lineage(request.match_info["rollout_id"])
    except (NoOwnerError, QueryError, TimeoutError) as exc:
        return error(503, f"the lineage tables are not readable now: {exc}")
    return web.json_response(lineage.model_dump(mode="json"))
