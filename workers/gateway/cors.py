"""CORS as the reference's server does it (Starlette's ``CORSMiddleware`` with every method and header allowed,
credentials allowed and every header exposed), for the origins in ``LITSTREAM_GATEWAY_CORS_ORIGINS``; off when
that is empty, as in the reference when no origin is given.

A preflight (``OPTIONS`` with ``Access-Control-Request-Method``) is answered here, before the bearer token is
asked for: browsers never send credentials on a preflight.
"""

from __future__ import annotations

from collections.abc import Iterable, MutableMapping

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

ALL_METHODS = "DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT"
MAX_AGE = "600"


def parse_origins(value: str) -> tuple[str, ...]:
    """``"https://a.example, https://b.example"`` or ``"*"``; blanks dropped, ``*`` alone means every origin."""
    origins = tuple(o.strip() for o in value.split(",") if o.strip())
    return ("*",) if "*" in origins else origins


def _simple_headers(headers: MutableMapping[str, str], origin: str, all_origins: bool, has_cookie: bool) -> None:
    headers["Access-Control-Allow-Credentials"] = "true"
    headers["Access-Control-Expose-Headers"] = "*"
    if all_origins and not has_cookie:
        headers["Access-Control-Allow-Origin"] = "*"
    else:  # an allowed origin, or any with cookies (credentials forbid "*"): named, and caches told so
        headers["Access-Control-Allow-Origin"] = origin
        headers["Vary"] = "Origin"


def _preflight(request: web.Request, origin: str, allowed: bool) -> web.Response:
    headers = {"Access-Control-Allow-Methods": ALL_METHODS, "Access-Control-Max-Age": MAX_AGE,
               "Access-Control-Allow-Credentials": "true", "Vary": "Origin"}
    if allowed:
        headers["Access-Control-Allow-Origin"] = origin
    requested = request.headers.get("Access-Control-Request-Headers")
    if requested is not None:
        headers["Access-Control-Allow-Headers"] = requested
    if not allowed:
        return web.Response(status=400, text="Disallowed CORS origin", headers=headers)
    return web.Response(status=200, text="OK", headers=headers)


def cors(origins: Iterable[str]) -> Middleware:
    """A middleware that answers preflights and marks responses to allowed origins; a no-op without origins."""
    allowed_origins = frozenset(origins)
    all_origins = "*" in allowed_origins

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if not allowed_origins or origin is None:
            return await handler(request)
        allowed = all_origins or origin in allowed_origins
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            return _preflight(request, origin, allowed)
        has_cookie = "Cookie" in request.headers
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # an error raised, not returned: it still needs the headers
            if allowed:
                _simple_headers(exc.headers, origin, all_origins, has_cookie)
            raise
        if allowed:
            _simple_headers(response.headers, origin, all_origins, has_cookie)
        return response

    return middleware
