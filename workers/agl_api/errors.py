"""The API's one error mapping: what a handler raises becomes a status and a JSON body naming the field.

The body has the reference server's shape (``{"detail": ...}``, plus ``field``). The stock client raises
``aiohttp.ClientResponseError`` from ``raise_for_status()``, whose text shows the status line's reason phrase and
never the body; so the reason phrase carries the message too ("400, message='Bad Request: cannot ...'").

A value the store refuses (``ValueError``) is the caller's error: a 404 when it names something not found, else a
400. The store being unreachable (``StoreError``) is a 503, which the stock client retries. A body that does not
validate is a 422 naming the first bad field.
"""

from __future__ import annotations

import json
import logging
from http import HTTPStatus

from aiohttp import web
from aiohttp.typedefs import Handler
from pydantic import ValidationError

from litstream.workers.store import StoreError

log = logging.getLogger("litstream.agl_api")
_MAX_REASON = 1000  # a status line is no place for a novel


def reason_phrase(status: int, message: str) -> str:
    """The standard phrase with the message after it, on one line."""
    standard = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    flat = " ".join(message.split())
    text = f"{standard}: {flat}" if flat and flat != standard else standard
    return text if len(text) <= _MAX_REASON else text[:_MAX_REASON - 3] + "..."


class HTTPFieldError(web.HTTPException):
    """A client error whose body is ``{"detail": ..., "field": ...}`` and whose reason phrase shows the message."""

    def __init__(self, status: int, message: str, field: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        self.status_code = status
        super().__init__(text=json.dumps({"detail": message, "field": field}), content_type="application/json",
                         reason=reason_phrase(status, message), headers=headers)


def invalid(exc: ValidationError, status: int = 422) -> HTTPFieldError:
    """A 422 (or ``status``) for the first error pydantic found, naming the field by its location."""
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or None
    return HTTPFieldError(status, f"{field}: {err['msg']}" if field else err["msg"], field)


@web.middleware
async def error_mapping(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ValidationError as exc:  # a value an internal model refused: the caller's, named by its field
        raise invalid(exc, 400) from None
    except ValueError as exc:  # the store refused a value: the caller's error
        message = str(exc)
        raise HTTPFieldError(404 if "not found" in message else 400, message, getattr(exc, "field", None)) from None
    except StoreError as exc:
        raise web.HTTPServiceUnavailable(text=json.dumps({"detail": str(exc)}), content_type="application/json",
                                         reason=reason_phrase(503, str(exc))) from None
    except web.HTTPException as exc:
        if exc.content_type == "application/json":
            raise
        # the router's own 404 and 405, in the reference's body shape ({"detail": "Not Found"})
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        raise HTTPFieldError(exc.status, exc.reason, headers=allow) from None
    except Exception as exc:  # a bug of ours: a 500 the stock client retries, with the reference's body shape
        log.exception("unhandled error in %s %s", request.method, request.path)
        raise HTTPFieldError(500, "Internal server error") from exc
