"""The gateway's token rule for browsers: a page cannot send ``Authorization: Bearer``, so the token, given once
on ``/ui/login`` (or as ``?token=`` in a link), is kept in an HttpOnly cookie that this middleware turns into the
bearer header before the gateway's own check runs. Without a token configured, nothing changes."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Any

import jinja2
from aiohttp import web

COOKIE = "litstream_token"
LOGIN = "/ui/login"
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _is_page(request: web.Request) -> bool:
    return request.method == "GET" and (request.path == "/" or request.path.startswith("/ui/"))


def add_cookie_auth(app: web.Application, token: str, env: jinja2.Environment) -> None:
    """Put the cookie middleware first, so the gateway's bearer check sees the header it stands for."""
    if not token:
        return

    def login_page(status: int, message: str | None, next_path: str) -> web.Response:
        html = env.get_template("login.html").render(message=message, next_path=next_path)
        return web.Response(text=html, status=status, content_type="text/html")

    def with_cookie(response: web.StreamResponse) -> web.StreamResponse:
        response.set_cookie(COOKIE, token, httponly=True, samesite="Strict", path="/")
        return response

    async def login(request: web.Request) -> web.StreamResponse:
        next_path = request.query.get("next", "/")
        if not next_path.startswith("/") or next_path.startswith("//"):
            next_path = "/"  # only paths of this site: no open redirect
        if request.method != "POST":
            return login_page(200, None, next_path)
        given = str((await request.post()).get("token", ""))
        if not hmac.compare_digest(given, token):
            return login_page(401, "That is not the gateway's token (LITSTREAM_GATEWAY_TOKEN).", next_path)
        return with_cookie(web.HTTPSeeOther(next_path))

    @web.middleware
    async def cookie_auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == LOGIN:
            return await login(request)
        if "token" in request.query and _is_page(request) and hmac.compare_digest(request.query["token"], token):
            clean = request.rel_url.with_query([(k, v) for k, v in request.query.items() if k != "token"])
            return with_cookie(web.HTTPSeeOther(str(clean)))
        cookie = request.cookies.get(COOKIE)
        if cookie and "Authorization" not in request.headers:
            request = request.clone(headers={**request.headers, "Authorization": f"Bearer {cookie}"})
        elif not cookie and "Authorization" not in request.headers and _is_page(request):
            if request.headers.get("HX-Request"):  # a fragment poll after the cookie went: reload to log in
                return web.Response(status=401, headers={"HX-Redirect": f"{LOGIN}?next=/"})
            return web.HTTPSeeOther(f"{LOGIN}?next={request.path_qs}")
        return await handler(request)

    app.middlewares.insert(0, cookie_auth)


__all__: list[Any] = ["add_cookie_auth", "COOKIE"]
