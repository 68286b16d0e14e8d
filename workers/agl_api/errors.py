"""The API's one error mapping: what a handler raises becomes a status and a JSON body naming the field.

A value the store refuses (``ValueError``) is the caller's error: a 404 when it names something not found, else a
400. The store being unreachable (``StoreError``) is a 503, which the stock client retries. A body that does not
validate is a 422 naming the first bad field.
"""

from __future__ import annotations

import json

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import ValidationError

from litstream.streams.store import StoreError


class HTTPFieldError(web.HTTPException):
    """A client error whose body is ``{"detail": ..., "field": ...}``."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        self.status_code = status
        super().__init__(text=json.dumps({"detail": message, "field": field}), content_type="application/json")


def invalid(exc: ValidationError) -> HTTPFieldError:
    """A 422 for the first error pydantic found, with its location as the field."""
    err = exc.errors()[0]
    return HTTPFieldError(422, err["msg"], ".".join(str(p) for p in err["loc"]) or None)


@web.middleware
async def error_mapping(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ValueError as exc:  # the store refused a value: the caller's error
        message = str(exc)
        raise HTTPFieldError(404 if "not found" in message else 400, message) from None
    except StoreError as exc:
        raise web.HTTPServiceUnavailable(text=json.dumps({"detail": str(exc)}),
                                         content_type="application/json") from None
