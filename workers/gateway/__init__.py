"""The HTTP gateway: enqueue and list rollouts, run read-only SQL over spans, and Agent Lightning's REST API
(``/v1/agl``, see ``agl_api``).

Binds 127.0.0.1 unless told otherwise; when ``LITSTREAM_GATEWAY_TOKEN`` is set, every route but ``/health``
needs ``Authorization: Bearer <token>`` (``auth.py``). Bad input is a 4xx whose body names the field.

One module per group of routes, each with an aiohttp ``RouteTableDef`` named ``routes`` whose handlers reach the
settings and the producer through ``context.context_of(request)``. A new module is one more entry in ``ROUTES``.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.log import access_logger

from litstream.infra import health
from litstream.infra.producer import EventProducer
from litstream.infra.service import AsyncProcess, Service
from litstream.infra.settings import Settings
from litstream.workers.store import LitStore

from ..agl_api import PREFIX, build_agl_app
from ..dashboard.routes import add_dashboard_routes
from ..otlp import add_otlp_routes
from . import lineage, rollouts, sql, status
from .auth import OPEN_PATHS, bearer_auth
from .context import CONTEXT, GatewayContext
from .cors import cors, parse_origins

__all__ = ["MAX_BODY", "OPEN_PATHS", "ROLE", "ROUTES", "GatewayProcess", "build_app", "run"]

ROLE = "gateway"
MAX_BODY = 4 << 20
HEARTBEAT_S = 2.0

ROUTES: tuple[web.RouteTableDef, ...] = (
    status.routes,
    rollouts.routes,
    lineage.routes,
    sql.routes,
)


def _flush_at_exit(ctx: GatewayContext) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup context: on the way out, what is still buffered is sent."""

    async def flush(_: web.Application) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(ctx.events.flush)

    return flush


def _mount_store_apis(app: web.Application, settings: Settings, store: LitStore) -> None:
    """The Agent Lightning 0.3 REST API (for its stock client and runners) and OTLP/HTTP (any OpenTelemetry SDK
    sends its spans here), both on the one store, closed with the app."""
    app.add_subapp(PREFIX, build_agl_app(store))
    add_otlp_routes(app, store, MAX_BODY)
    add_dashboard_routes(app, settings, store)  # the web dashboard at /, and /metrics

    async def close_store(_: web.Application) -> None:
        await store.close()

    app.on_cleanup.append(close_store)


def build_app(settings: Settings) -> web.Application:
    store = LitStore(settings)
    ctx = GatewayContext(settings, EventProducer(settings, role=ROLE), store)
    token = settings.gateway_token.get_secret_value() if settings.gateway_token else ""
    app = web.Application(middlewares=[cors(parse_origins(settings.gateway_cors_origins)), bearer_auth(token)],
                          client_max_size=MAX_BODY)
    app[CONTEXT] = ctx
    for table in ROUTES:
        app.add_routes(table)
    app.cleanup_ctx.append(_flush_at_exit(ctx))
    _mount_store_apis(app, settings, store)
    return app


GIL_SWITCH_S = 0.0005


class GatewayProcess(AsyncProcess):
    """The gateway as a process of the stack: the app served on ``host:port`` until stopped."""

    def __init__(self, settings: Settings, host: str, port: int) -> None:
        # The store's threads (its replica's follower, its delivery reports, its offers) hand the GIL back and
        # forth with the event loop on every call; at the default 5 ms interval a call could wait that long for
        # it. Measured with the stock client's loop at 1 agent on a loaded machine: mean time per request in the
        # handler 4.2 -> 1.6 ms (p50 1.1 -> 1.0).
        sys.setswitchinterval(GIL_SWITCH_S)
        super().__init__(health.Heartbeat(settings.data_dir, ROLE, dict, HEARTBEAT_S))
        # No access log unless asked for: formatting and writing a line per call was a tenth of this process's CPU
        # (the stock client's agent loop, three alternating runs: CPU-seconds 18.0 -> 16.1, 16 agents 39.0 -> 43.7
        # rollouts/s, medians).
        self.runner = web.AppRunner(build_app(settings), handle_signals=False,
                                    access_log=access_logger if settings.gateway_access_log else None)
        self.host, self.port = host, port

    def report(self) -> Mapping[str, Any]:
        return {}

    async def start(self) -> None:
        await self.runner.setup()
        await web.TCPSite(self.runner, self.host, self.port).start()

    async def shutdown(self) -> None:
        await self.runner.cleanup()  # stops the site, then the app's cleanup (the store, the producer's flush)


def run(settings: Settings, host: str, port: int) -> None:
    """Serve in the foreground until SIGINT/SIGTERM."""
    Service(settings, ROLE, ready_when_built=False).run(lambda s: GatewayProcess(s, host, port))
