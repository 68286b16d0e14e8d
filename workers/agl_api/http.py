"""What every route module shares: the store's key, reading and validating bodies and query strings, paging, and
writing results the way the reference's client reads them."""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from aiohttp import web
from pydantic import BaseModel, Field, ValidationError

from litstream.streams.store import UNSET, LitStore

from .errors import HTTPFieldError, invalid

PREFIX = "/v1/agl"
STORE = web.AppKey("store", LitStore)
NOT_NULL = {"status", "config"}  # update fields that may be left out but not set to null

M = TypeVar("M", bound=BaseModel)


class Page(BaseModel):
    limit: int = Field(-1, ge=-1)
    offset: int = Field(0, ge=0)
    sort_by: str | None = None
    sort_order: Literal["asc", "desc"] = "asc"


def store_of(request: web.Request) -> LitStore:
    return request.app[STORE]


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, (list, tuple)):
        return [_plain(x) for x in value]
    return value


def dump(value: Any, status: int = 200) -> web.Response:
    """A store result as JSON; a paginated result as the reference's ``{items, limit, offset, total}``."""
    if isinstance(value, BaseModel) and hasattr(value, "items") and hasattr(value, "total"):
        body: Any = {"items": [_plain(i) for i in getattr(value, "items")], "limit": getattr(value, "limit"),
                     "offset": getattr(value, "offset"), "total": getattr(value, "total")}
    else:
        body = _plain(value)
    return web.json_response(body, status=status, dumps=lambda o: json.dumps(o, default=str))


def created(value: Any) -> web.Response:
    return dump(value, status=201)


async def read_body(request: web.Request) -> Any:
    """The JSON body, or ``{}`` when there is none."""
    if not request.can_read_body:
        return {}
    try:
        return await request.json()
    except json.JSONDecodeError as exc:
        raise HTTPFieldError(400, f"body is not JSON: {exc}") from None


def parse(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise invalid(exc) from None


async def parse_body(request: web.Request, model: type[M]) -> M:
    return parse(model, await read_body(request))


def check_page(page: Page, sortable: set[str]) -> None:
    if page.sort_by is not None and page.sort_by not in sortable:
        raise HTTPFieldError(400, f"cannot sort by {page.sort_by!r}; one of {sorted(sortable)}", "sort_by")
    if page.limit == 0:
        raise HTTPFieldError(400, "limit must be -1 (all) or positive", "limit")


def query_params(request: web.Request, lists: tuple[str, ...] = ()) -> dict[str, Any]:
    """The query string as a dict: the keys in ``lists`` keep every value, the others the last one."""
    out: dict[str, Any] = {}
    for key in set(request.query.keys()):
        values = request.query.getall(key)
        out[key] = values if key in lists else values[-1]
    return out


async def update_fields(request: web.Request, model: type[BaseModel]) -> dict[str, Any]:
    """An update body: only keys present change (the others are UNSET); an explicit null status or config is a
    400, an unknown key or a bad value a 422 naming the field."""
    body = await read_body(request)
    if not isinstance(body, dict):
        raise HTTPFieldError(422, "body must be an object")
    for key, value in body.items():
        if key not in model.model_fields:
            raise HTTPFieldError(422, f"unknown field {key!r}", key)
        if value is None and key in NOT_NULL:
            raise HTTPFieldError(400, f"{key} cannot be null", key)
    checked = parse(model, body)
    return {k: getattr(checked, k) if k in body else UNSET for k in model.model_fields}
