"""Spans: adding one, querying them, the next sequence number of an attempt."""

from __future__ import annotations

from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel

from litstream.schemas.models import Span

from ..attributes import check_span_limits
from .errors import HTTPFieldError
from .http import Page, check_page, created, dump, parse, parse_body, query_params, read_body, store_of

routes = web.RouteTableDef()


class QuerySpans(Page):
    rollout_id: str
    attempt_id: str | None = None
    trace_id: str | None = None
    trace_id_contains: str | None = None
    span_id: str | None = None
    span_id_contains: str | None = None
    parent_id: str | None = None
    parent_id_contains: str | None = None
    name: str | None = None
    name_contains: str | None = None
    filter_logic: Literal["and", "or"] = "and"
    sort_by: str | None = "sequence_id"


class NextSequenceRequest(BaseModel):
    rollout_id: str
    attempt_id: str


@routes.post("/spans")
async def add_span(request: web.Request) -> web.Response:
    span = await parse_body(request, Span)
    try:
        check_span_limits(span)  # over the limits it could not be one Kafka message
    except ValueError as exc:
        raise HTTPFieldError(400, str(exc), "attributes") from None
    return created(await store_of(request).add_span(span))


async def _query(request: web.Request, data: Any) -> web.Response:
    q = parse(QuerySpans, data)
    check_page(q, Span)
    return dump(await store_of(request).query_spans(
        q.rollout_id, q.attempt_id, trace_id=q.trace_id, trace_id_contains=q.trace_id_contains,
        span_id=q.span_id, span_id_contains=q.span_id_contains, parent_id=q.parent_id,
        parent_id_contains=q.parent_id_contains, name=q.name, name_contains=q.name_contains,
        filter_logic=q.filter_logic, limit=q.limit, offset=q.offset, sort_by=q.sort_by or "sequence_id",
        sort_order=q.sort_order))


@routes.get("/spans")
async def query_get(request: web.Request) -> web.Response:
    return await _query(request, query_params(request))


@routes.post("/spans/search")
async def query_post(request: web.Request) -> web.Response:
    return await _query(request, await read_body(request))


@routes.post("/spans/next")
async def next_sequence(request: web.Request) -> web.Response:
    req = await parse_body(request, NextSequenceRequest)
    sequence_id = await store_of(request).get_next_span_sequence_id(req.rollout_id, req.attempt_id)
    return web.json_response({"sequence_id": sequence_id})
