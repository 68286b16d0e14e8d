"""The API's liveness probe and the store's statistics."""

from __future__ import annotations

from aiohttp import web

from .http import dump, store_of

routes = web.RouteTableDef()


@routes.get("/health")
async def health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


@routes.get("/statistics")
async def statistics(request: web.Request) -> web.Response:
    return dump(await store_of(request).statistics())
