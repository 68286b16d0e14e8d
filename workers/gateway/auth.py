"""The bearer token: when ``LITSTREAM_GATEWAY_TOKEN`` is set, every route but the liveness probes needs
``Authorization: Bearer <token>``."""

from __future__ import annotations

import hmac

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from .context import error

OPEN_PATHS = {"/health", "/v1/agl/health"}  # liveness probes answer without the token


def bearer_auth(token: str) -> Middleware:
    """A middleware that lets every request through when ``token`` is empty."""

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if token and request.path not in OPEN_PATHS:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given, f"Bearer {token}"):
                return error(401, "missing or wrong bearer token (Authorization: Bearer <LITSTREAM_GATEWAY_TOKEN>)")
        return await handler(request)

    return auth
