"""The gateway's liveness probe."""

from __future__ import annotations

from aiohttp import web

routes = web.RouteTableDef()


@routes.get("/health")
async def health(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})
