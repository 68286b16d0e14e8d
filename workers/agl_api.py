"""Agent Lightning 0.3's REST API (``/v1/agl``) on litstream's Store API, so the stock ``LightningStoreClient`` and
the runners built on it work unchanged.

Status codes follow the reference (201 on creates, ``null`` bodies for missing attempts, resources and workers),
except that bad input is a 4xx naming the field rather than a 500: a 400 for a value the store refuses, a 404
for an unknown rollout, a 422 for a body that does not validate. The stock client raises at once on a 4xx and
retries a 5xx, so a client error is reported instead of retried.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, Field, TypeAdapter, ValidationError

from litstream.schemas.models import (
    AttemptStatus,
    EnqueueRolloutRequest,
    NamedResources,
    RolloutConfig,
    RolloutMode,
    RolloutStatus,
    Span,
    WorkerStatus,
)
from litstream.streams.store import UNSET, LitStore, StoreError

from .attributes import check_span_limits

PREFIX = "/v1/agl"
_RESOURCES = TypeAdapter(NamedResources)


class RolloutRequest(BaseModel):
    input: Any
    mode: RolloutMode | None = None
    resources_id: str | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None
    worker_id: str | None = None


class EnqueueManyRequest(BaseModel):
    rollouts: list[EnqueueRolloutRequest]


class DequeueRequest(BaseModel):
    limit: int = 1
    worker_id: str | None = None


class WorkerIdRequest(BaseModel):
    worker_id: str | None = None


class Page(BaseModel):
    limit: int = Field(-1, ge=-1)
    offset: int = Field(0, ge=0)
    sort_by: str | None = None
    sort_order: Literal["asc", "desc"] = "asc"


class QueryRollouts(Page):
    status_in: list[RolloutStatus] | None = None
    rollout_id_in: list[str] | None = None
    rollout_id_contains: str | None = None
    filter_logic: Literal["and", "or"] = "and"


class QueryAttempts(Page):
    sort_by: str | None = "sequence_id"


class QueryWorkers(Page):
    status_in: list[WorkerStatus] | None = None
    worker_id_contains: str | None = None
    filter_logic: Literal["and", "or"] = "and"


class QueryResources(Page):
    resources_id: str | None = None
    resources_id_contains: str | None = None


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


class WaitRequest(BaseModel):
    rollout_ids: list[str]
    timeout: float | None = None


class NextSequenceRequest(BaseModel):
    rollout_id: str
    attempt_id: str


ROLLOUT_SORT = {"rollout_id", "start_time", "end_time", "status", "mode", "resources_id"}
ATTEMPT_SORT = {"sequence_id", "start_time", "end_time", "status", "attempt_id", "worker_id", "last_heartbeat_time"}
WORKER_SORT = {"worker_id", "status", "last_heartbeat_time", "last_dequeue_time", "last_busy_time", "last_idle_time"}
RESOURCES_SORT = {"resources_id", "version", "create_time", "update_time"}
SPAN_SORT = {"sequence_id", "start_time", "end_time", "name", "span_id", "trace_id"}
NOT_NULL = {"status", "config"}


class HTTPFieldError(web.HTTPException):
    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        self.status_code = status
        super().__init__(text=json.dumps({"detail": message, "field": field}), content_type="application/json")


def _dump(value: Any) -> web.Response:
    def plain(v: Any) -> Any:
        if isinstance(v, BaseModel):
            return v.model_dump(mode="json")
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v

    if hasattr(value, "items") and hasattr(value, "total") and isinstance(value, BaseModel):
        body: Any = {"items": [plain(i) for i in value.items], "limit": value.limit,  # type: ignore[attr-defined]
                     "offset": value.offset, "total": value.total}  # type: ignore[attr-defined]
    else:
        body = plain(value)
    return web.json_response(body, dumps=lambda o: json.dumps(o, default=str))


async def _body(request: web.Request, default: Any = None) -> Any:
    if not request.can_read_body:
        return default if default is not None else {}
    try:
        return await request.json()
    except json.JSONDecodeError as exc:
        raise HTTPFieldError(400, f"body is not JSON: {exc}") from None


def _parse(model: type[BaseModel], data: Any) -> Any:
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise HTTPFieldError(422, err["msg"], ".".join(str(p) for p in err["loc"]) or None) from None


def _sort(page: Page, allowed: set[str]) -> None:
    if page.sort_by is not None and page.sort_by not in allowed:
        raise HTTPFieldError(400, f"cannot sort by {page.sort_by!r}; one of {sorted(allowed)}", "sort_by")
    if page.limit == 0:
        raise HTTPFieldError(400, "limit must be -1 (all) or positive", "limit")


def _query_params(request: web.Request, lists: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in set(request.query.keys()):
        values = request.query.getall(key)
        out[key] = values if key in lists else values[-1]
    return out


async def _update_fields(request: web.Request, model: type[BaseModel]) -> dict[str, Any]:
    """An update body: only keys present change (the others are UNSET); an explicit null status or config is a
    400, an unknown key or a bad value a 422 naming the field."""
    body = await _body(request)
    if not isinstance(body, dict):
        raise HTTPFieldError(422, "body must be an object")
    for key, value in body.items():
        if key not in model.model_fields:
            raise HTTPFieldError(422, f"unknown field {key!r}", key)
        if value is None and key in NOT_NULL:
            raise HTTPFieldError(400, f"{key} cannot be null", key)
    checked = _parse(model, body)
    return {k: getattr(checked, k) if k in body else UNSET for k in model.model_fields}


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_agl_app(store: LitStore) -> web.Application:
    """The ``/v1/agl`` routes, to mount under the gateway."""
    routes = web.RouteTableDef()

    def guarded(handler: Handler) -> Handler:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            try:
                return await handler(request)
            except ValueError as exc:  # the store refused a value: the caller's error
                message = str(exc)
                raise HTTPFieldError(404 if "not found" in message else 400, message) from None
            except StoreError as exc:
                raise web.HTTPServiceUnavailable(text=json.dumps({"detail": str(exc)}),
                                                 content_type="application/json") from None
        return wrapped

    @routes.get("/health")
    async def health(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    @routes.post("/queues/rollouts/enqueue")
    @guarded
    async def enqueue(request: web.Request) -> web.Response:
        req = _parse(EnqueueManyRequest, await _body(request))
        if len(req.rollouts) == 1:
            r = req.rollouts[0]
            out = [await store.enqueue_rollout(r.input, r.mode, r.resources_id, r.config, r.metadata)]
        else:
            out = await store.enqueue_many_rollouts(req.rollouts)
        resp = _dump(out)
        resp.set_status(201)
        return resp

    @routes.post("/queues/rollouts/dequeue")
    @guarded
    async def dequeue(request: web.Request) -> web.Response:
        req = _parse(DequeueRequest, await _body(request))
        if req.limit <= 0:
            return _dump([])
        return _dump(await store.dequeue_many_rollouts(limit=req.limit, worker_id=req.worker_id))

    @routes.post("/rollouts")
    @guarded
    async def start_rollout(request: web.Request) -> web.Response:
        req = _parse(RolloutRequest, await _body(request))
        resp = _dump(await store.start_rollout(req.input, req.mode, req.resources_id, req.config, req.metadata,
                                               req.worker_id))
        resp.set_status(201)
        return resp

    async def _query_rollouts(data: dict[str, Any]) -> web.Response:
        q = _parse(QueryRollouts, data)
        _sort(q, ROLLOUT_SORT)
        return _dump(await store.query_rollouts(
            status_in=q.status_in, rollout_id_in=q.rollout_id_in, rollout_id_contains=q.rollout_id_contains,
            filter_logic=q.filter_logic, sort_by=q.sort_by, sort_order=q.sort_order, limit=q.limit, offset=q.offset))

    @routes.get("/rollouts")
    @guarded
    async def query_rollouts_get(request: web.Request) -> web.Response:
        return await _query_rollouts(_query_params(request, ("status_in", "rollout_id_in")))

    @routes.post("/rollouts/search")
    @guarded
    async def query_rollouts_post(request: web.Request) -> web.Response:
        return await _query_rollouts(await _body(request))

    @routes.get("/rollouts/{rollout_id}")
    @guarded
    async def get_rollout(request: web.Request) -> web.Response:
        return _dump(await store.get_rollout_by_id(request.match_info["rollout_id"]))

    @routes.post("/rollouts/{rollout_id}")
    @guarded
    async def update_rollout(request: web.Request) -> web.Response:
        fields = await _update_fields(request, _UpdateRollout)
        return _dump(await store.update_rollout(request.match_info["rollout_id"], **fields))

    @routes.post("/rollouts/{rollout_id}/attempts")
    @guarded
    async def start_attempt(request: web.Request) -> web.Response:
        req = _parse(WorkerIdRequest, await _body(request))
        resp = _dump(await store.start_attempt(request.match_info["rollout_id"], req.worker_id))
        resp.set_status(201)
        return resp

    async def _query_attempts(rollout_id: str, data: dict[str, Any]) -> web.Response:
        q = _parse(QueryAttempts, data)
        _sort(q, ATTEMPT_SORT)
        return _dump(await store.query_attempts(rollout_id, sort_by=q.sort_by or "sequence_id",
                                                sort_order=q.sort_order, limit=q.limit, offset=q.offset))

    @routes.get("/rollouts/{rollout_id}/attempts")
    @guarded
    async def query_attempts_get(request: web.Request) -> web.Response:
        return await _query_attempts(request.match_info["rollout_id"], _query_params(request))

    @routes.post("/rollouts/{rollout_id}/attempts/search")
    @guarded
    async def query_attempts_post(request: web.Request) -> web.Response:
        return await _query_attempts(request.match_info["rollout_id"], await _body(request))

    @routes.get("/rollouts/{rollout_id}/attempts/latest")
    @guarded
    async def latest_attempt(request: web.Request) -> web.Response:
        return _dump(await store.get_latest_attempt(request.match_info["rollout_id"]))

    @routes.post("/rollouts/{rollout_id}/attempts/{attempt_id}")
    @guarded
    async def update_attempt(request: web.Request) -> web.Response:
        fields = await _update_fields(request, _UpdateAttempt)
        return _dump(await store.update_attempt(request.match_info["rollout_id"], request.match_info["attempt_id"],
                                                **fields))

    async def _query_workers(data: dict[str, Any]) -> web.Response:
        q = _parse(QueryWorkers, data)
        _sort(q, WORKER_SORT)
        return _dump(await store.query_workers(status_in=q.status_in, worker_id_contains=q.worker_id_contains,
                                               filter_logic=q.filter_logic, sort_by=q.sort_by,
                                               sort_order=q.sort_order, limit=q.limit, offset=q.offset))

    @routes.get("/workers")
    @guarded
    async def query_workers_get(request: web.Request) -> web.Response:
        return await _query_workers(_query_params(request, ("status_in",)))

    @routes.post("/workers/search")
    @guarded
    async def query_workers_post(request: web.Request) -> web.Response:
        return await _query_workers(await _body(request))

    @routes.get("/workers/{worker_id}")
    @guarded
    async def get_worker(request: web.Request) -> web.Response:
        return _dump(await store.get_worker_by_id(request.match_info["worker_id"]))

    @routes.post("/workers/{worker_id}")
    @guarded
    async def update_worker(request: web.Request) -> web.Response:
        body = await _body(request)
        if isinstance(body, dict) and "heartbeat_stats" in body:
            if body["heartbeat_stats"] is None:
                raise HTTPFieldError(400, "heartbeat_stats cannot be null", "heartbeat_stats")
            if not isinstance(body["heartbeat_stats"], dict):
                raise HTTPFieldError(422, "heartbeat_stats must be an object", "heartbeat_stats")
            return _dump(await store.update_worker(request.match_info["worker_id"], body["heartbeat_stats"]))
        return _dump(await store.update_worker(request.match_info["worker_id"]))

    @routes.get("/statistics")
    @guarded
    async def statistics(_: web.Request) -> web.Response:
        return _dump(await store.statistics())

    @routes.get("/resources")
    @guarded
    async def query_resources(request: web.Request) -> web.Response:
        q = _parse(QueryResources, _query_params(request))
        _sort(q, RESOURCES_SORT)
        return _dump(await store.query_resources(resources_id=q.resources_id,
                                                 resources_id_contains=q.resources_id_contains, sort_by=q.sort_by,
                                                 sort_order=q.sort_order, limit=q.limit, offset=q.offset))

    def _named(data: Any) -> NamedResources:
        try:
            return _RESOURCES.validate_python(data)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise HTTPFieldError(422, err["msg"], ".".join(str(p) for p in err["loc"]) or None) from None

    @routes.post("/resources")
    @guarded
    async def add_resources(request: web.Request) -> web.Response:
        resp = _dump(await store.add_resources(_named(await _body(request))))
        resp.set_status(201)
        return resp

    @routes.get("/resources/latest")
    @guarded
    async def latest_resources(_: web.Request) -> web.Response:
        return _dump(await store.get_latest_resources())

    @routes.post("/resources/{resources_id}")
    @guarded
    async def update_resources(request: web.Request) -> web.Response:
        return _dump(await store.update_resources(request.match_info["resources_id"],
                                                  _named(await _body(request))))

    @routes.get("/resources/{resources_id}")
    @guarded
    async def get_resources(request: web.Request) -> web.Response:
        return _dump(await store.get_resources_by_id(request.match_info["resources_id"]))

    @routes.post("/spans")
    @guarded
    async def add_span(request: web.Request) -> web.Response:
        span = _parse(Span, await _body(request))
        try:
            check_span_limits(span)  # over the limits it could not be one Kafka message
        except ValueError as exc:
            raise HTTPFieldError(400, str(exc), "attributes") from None
        resp = _dump(await store.add_span(span))
        resp.set_status(201)
        return resp

    async def _query_spans(data: dict[str, Any]) -> web.Response:
        q = _parse(QuerySpans, data)
        _sort(q, SPAN_SORT)
        return _dump(await store.query_spans(
            q.rollout_id, q.attempt_id, trace_id=q.trace_id, trace_id_contains=q.trace_id_contains,
            span_id=q.span_id, span_id_contains=q.span_id_contains, parent_id=q.parent_id,
            parent_id_contains=q.parent_id_contains, name=q.name, name_contains=q.name_contains,
            filter_logic=q.filter_logic, limit=q.limit, offset=q.offset, sort_by=q.sort_by or "sequence_id",
            sort_order=q.sort_order))

    @routes.get("/spans")
    @guarded
    async def query_spans_get(request: web.Request) -> web.Response:
        return await _query_spans(_query_params(request))

    @routes.post("/spans/search")
    @guarded
    async def query_spans_post(request: web.Request) -> web.Response:
        return await _query_spans(await _body(request))

    @routes.post("/spans/next")
    @guarded
    async def next_sequence(request: web.Request) -> web.Response:
        req = _parse(NextSequenceRequest, await _body(request))
        return web.json_response({"sequence_id": await store.get_next_span_sequence_id(req.rollout_id,
                                                                                        req.attempt_id)})

    @routes.post("/waits/rollouts")
    @guarded
    async def wait(request: web.Request) -> web.Response:
        req = _parse(WaitRequest, await _body(request))
        return _dump(await store.wait_for_rollouts(rollout_ids=req.rollout_ids, timeout=req.timeout))

    app = web.Application()
    app.add_routes(routes)
    return app


class _UpdateRollout(BaseModel):
    input: Any = None
    mode: RolloutMode | None = None
    resources_id: str | None = None
    status: RolloutStatus | None = None
    config: RolloutConfig | None = None
    metadata: dict[str, Any] | None = None


class _UpdateAttempt(BaseModel):
    status: AttemptStatus | None = None
    worker_id: str | None = None
    last_heartbeat_time: float | None = None
    metadata: dict[str, Any] | None = None
