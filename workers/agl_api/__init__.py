"""Agent Lightning 0.3's REST API (``/v1/agl``) on litstream's Store API, so the stock ``LightningStoreClient`` and
the runners built on it work unchanged.

Status codes follow the reference (201 on creates, ``null`` bodies for missing attempts, resources and workers),
except that bad input is a 4xx naming the field rather than a 500: a 400 for a value the store refuses, a 404
for an unknown rollout, a 422 for a body that does not validate (``errors.py``). The stock client raises at once
on a 4xx and retries a 5xx, so a client error is reported instead of retried.

One module per resource, each with an aiohttp ``RouteTableDef`` named ``routes`` whose handlers reach the store
through ``http.store_of(request)``. A new module is one more entry in ``ROUTES``.
"""

from __future__ import annotations

from aiohttp import web

from litstream.workers.store import LitStore

from . import attempts, resources, rollouts, spans, status, workers
from .errors import HTTPFieldError, error_mapping
from .http import PREFIX, STORE

__all__ = ["PREFIX", "ROUTES", "HTTPFieldError", "build_agl_app"]

ROUTES: tuple[web.RouteTableDef, ...] = (
    status.routes,
    rollouts.routes,
    attempts.routes,
    workers.routes,
    resources.routes,
    spans.routes,
)


def build_agl_app(store: LitStore) -> web.Application:
    """The ``/v1/agl`` routes, to mount under the gateway."""
    app = web.Application(middlewares=[error_mapping])
    app[STORE] = store
    for table in ROUTES:
        app.add_routes(table)
    return app
