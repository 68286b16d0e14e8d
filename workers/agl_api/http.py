"""What every route module shares: the store's key, reading and validating bodies and query strings, paging, and
writing results the way the reference's client reads them."""

from __future__ import annotations

from typing import Any, Literal, TypeVar

from aiohttp import web
from pydantic import BaseModel, ValidationError
from pydantic_core import from_json, to_json

from litstream.workers.store import UNSET, LitStore

from .errors import HTTPFieldError, invalid

PREFIX = "/v1/agl"
STORE = web.AppKey("store", LitStore)

M = TypeVar("M", bound=BaseModel)


class Page(BaseModel):
    limit: int = -1
    offset: int = 0
    sort_by: str | None = None
    sort_order: Literal["asc", "desc"] = "asc"


def store_of(request: web.Request) -> LitStore:
    return request.app[STORE]


def dump(value: Any, status: int = 200) -> web.Response:
    """A store result as JSON; a paginated result as the reference's ``{items, limit, offset, total}``.

    Written by pydantic-core's serializer, models included (what ``model_dump(mode="json")`` gives them), a value
    JSON has no type for as its ``str``, a float that is not finite as ``null`` (standard JSON has no NaN): a
    quarter of the time of ``json.dumps`` over ``model_dump`` for a span."""
    if isinstance(value, BaseModel) and hasattr(value, "items") and hasattr(value, "total"):
        value = {"items": getattr(value, "items"), "limit": getattr(value, "limit"),
                 "offset": getattr(value, "offset"), "total": getattr(value, "total")}
    body = to_json(value, fallback=str, inf_nan_mode="null")
    return web.Response(body=body, status=status, content_type="application/json", charset="utf-8")


def created(value: Any) -> web.Response:
    return dump(value, status=201)


def _not_json(reason: str) -> HTTPFieldError:
    return HTTPFieldError(400, f"body is not JSON: {reason}")


async def read_body(request: web.Request) -> Any:
    """The JSON body, or ``{}`` when there is none."""
    if not request.can_read_body:
        return {}
    try:
        return from_json(await request.read())
    except ValueError as exc:
        raise _not_json(str(exc)) from None


def parse(model: type[M], data: Any) -> M:
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        raise invalid(exc) from None


async def parse_body(request: web.Request, model: type[M]) -> M:
    """The body as ``model``, parsed and validated in one pass by pydantic-core (no dict in between); no body, or
    ``null``, is ``{}``."""
    if not request.can_read_body:
        return parse(model, {})
    raw = await request.read()
    if raw.strip() == b"null":
        return parse(model, {})
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            raise _not_json(first["msg"].removeprefix("Invalid JSON: ")) from None
        raise invalid(exc) from None


def check_page(page: Page, target: type[BaseModel]) -> None:
    """The reference's checks and wording: ``sort_by`` is any field of the listed model."""
    if page.sort_by is not None and page.sort_by not in target.model_fields:
        raise HTTPFieldError(400, f"Invalid sort_by: {page.sort_by}, allowed fields are: "
                             f"{', '.join(target.model_fields)}", "sort_by")
    if page.limit == 0 or page.limit < -1:
        raise HTTPFieldError(400, "Limit must be greater than 0 or -1 for no limit", "limit")
    if page.offset < 0:
        raise HTTPFieldError(400, "Offset must be greater than or equal to 0", "offset")


def query_params(request: web.Request, lists: tuple[str, ...] = ()) -> dict[str, Any]:
    """The query string as a dict: the keys in ``lists`` keep every value, the others the last one."""
    out: dict[str, Any] = {}
    for key in set(request.query.keys()):
        values = request.query.getall(key)
        out[key] = values if key in lists else values[-1]
    return out


def null_refused(field: str) -> HTTPFieldError:
    """The reference's refusal of ``null`` for a field the store needs a value of."""
    return HTTPFieldError(400, f"{field} is invalid; it cannot be a null value.", field)


async def update_fields(request: web.Request, model: type[BaseModel], not_null: frozenset[str]) -> dict[str, Any]:
    """An update body: only keys present change (the others are UNSET); an explicit null for a field in
    ``not_null`` is a 400 as in the reference, an unknown key or a bad value a 422 naming the field."""
    body = await read_body(request)
    if not isinstance(body, dict):
        raise HTTPFieldError(422, "body must be an object")
    for key, value in body.items():
        if key not in model.model_fields:
            raise HTTPFieldError(422, f"unknown field {key!r}; one of {', '.join(model.model_fields)}", key)
        if value is None and key in not_null:
            raise null_refused(key)
    checked = parse(model, body)
    return {k: getattr(checked, k) if k in body else UNSET for k in model.model_fields}
