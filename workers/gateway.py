"""The HTTP gateway: enqueue and list rollouts, run read-only SQL over spans, and Agent Lightning's REST API
(``/v1/agl``, see ``agl_api.py``).

Binds 127.0.0.1 unless told otherwise; when ``LITSTREAM_GATEWAY_TOKEN`` is set, every route but ``/health``
needs ``Authorization: Bearer <token>``. Bad input is a 4xx whose body names the field.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from litstream.infra import clickhouse, health
from litstream.infra.settings import Settings
from litstream.schemas.models import EnqueueRolloutRequest
from litstream.streams.stateview import StateView
from litstream.streams.store import LitStore

from .agl_api import PREFIX, build_agl_app
from .client import enqueue_rollout
from .otlp import add_otlp_routes
from .producer import EventProducer

ROLE = "gateway"
OPEN_PATHS = {"/health", "/v1/agl/health"}  # liveness probes answer without the token
MAX_BODY = 4 << 20


def _error(status: int, message: str, field: str | None = None) -> web.Response:
    body: dict[str, Any] = {"error": message}
    if field is not None:
        body["field"] = field
    return web.json_response(body, status=status)


def build_app(settings: Settings) -> web.Application:
    events = EventProducer(settings, role=ROLE)
    view_lock = threading.Lock()
    view: list[StateView] = []
    token = settings.gateway_token.get_secret_value() if settings.gateway_token else ""

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        if token and request.path not in OPEN_PATHS:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given, f"Bearer {token}"):
                return _error(401, "missing or wrong bearer token (Authorization: Bearer <LITSTREAM_GATEWAY_TOKEN>)")
        return await handler(request)

    async def read_json(request: web.Request) -> Any:
        try:
            return await request.json()
        except json.JSONDecodeError as exc:
            raise web.HTTPBadRequest(text=json.dumps({"error": f"body is not JSON: {exc}"}),
                                     content_type="application/json") from None

    async def health_route(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    def snapshots() -> list[dict[str, Any]]:
        with view_lock:
            if not view:
                view.append(StateView(settings))
            snaps = view[0].catch_up(timeout=5.0)
            return [s.model_dump(mode="json") for s in snaps.values()]

    async def list_rollouts(request: web.Request) -> web.Response:
        items = await asyncio.to_thread(snapshots)
        status = request.query.get("status")
        if status:
            items = [i for i in items if i["status"] == status]
        return web.json_response({"items": items, "total": len(items)})

    async def create_rollout(request: web.Request) -> web.Response:
        body = await read_json(request)
        try:
            req = EnqueueRolloutRequest.model_validate(body)
        except ValidationError as exc:
            err = exc.errors()[0]
            return _error(400, err["msg"], ".".join(str(p) for p in err["loc"]))
        try:
            event = enqueue_rollout(events, req.input, mode=req.mode, resources_id=req.resources_id,
                                    config=req.config, metadata=req.metadata)
        except (ValueError, ValidationError) as exc:
            return _error(400, str(exc))
        await asyncio.to_thread(events.flush)
        return web.json_response({"rollout_id": event.rollout_id, "status": "queuing"}, status=201)

    async def sql(request: web.Request) -> web.Response:
        body = await read_json(request)
        query = body.get("query") if isinstance(body, dict) else None
        if not isinstance(query, str) or not query.strip():
            return _error(400, "a non-empty SQL string is required", "query")
        try:
            res = await asyncio.to_thread(clickhouse.user_sql, settings.resolved_clickhouse_dsn, query)
        except clickhouse.NoOwnerError as exc:  # the sink is (re)starting: try again, not a bad query
            return _error(503, str(exc))
        except Exception as exc:  # the query's own error or refusal, for the caller
            return _error(400, str(exc).strip().splitlines()[0][:2000], "query")
        return web.json_response(res.to_json(), dumps=lambda o: json.dumps(o, default=str))

    async def beat(app: web.Application) -> Any:
        async def loop() -> None:
            while True:
                health.beat(settings.data_dir, ROLE)
                await asyncio.sleep(2.0)

        task = asyncio.create_task(loop())
        yield
        task.cancel()
        await asyncio.to_thread(events.flush)

    app = web.Application(middlewares=[auth], client_max_size=MAX_BODY)
    app.router.add_get("/health", health_route)
    app.router.add_get("/v1/rollouts", list_rollouts)
    app.router.add_post("/v1/rollouts", create_rollout)
    app.router.add_post("/v1/sql", sql)
    app.cleanup_ctx.append(beat)
    # The Agent Lightning 0.3 REST API, for its stock client and runners.
    store = LitStore(settings)
    app.add_subapp(PREFIX, build_agl_app(store))
    add_otlp_routes(app, store, MAX_BODY)  # OTLP/HTTP: any OpenTelemetry SDK sends its spans here

    async def close_store(_: web.Application) -> None:
        await store.close()

    app.on_cleanup.append(close_store)
    return app


def run(settings: Settings, host: str, port: int) -> None:
    web.run_app(build_app(settings), host=host, port=port, print=None)
