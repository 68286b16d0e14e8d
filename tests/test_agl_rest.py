"""Agent Lightning's REST API (``/v1/agl``) as the reference's server answers it, over raw HTTP on the real stack:
read-your-writes across the gateway's two APIs and of worker records, sort fields and order, null refusals,
pagination checks, reasons in the status line, span ids that are any string (as the reference), span totals,
and CORS."""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from litstream.app.stack import Stack
from litstream.infra.broker import free_port
from litstream.infra.settings import Settings

TOKEN = "s3cret"
ORIGIN = "https://app.example"


@pytest.fixture
def base(settings: Settings) -> Iterator[str]:
    settings = settings.model_copy(update={"gateway_token": SecretStr(TOKEN), "gateway_cors_origins": ORIGIN})
    with Stack(settings) as s:
        yield s.start_store(free_port())


def call(url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None,
         token: str | None = TOKEN, raw: bytes | None = None) -> tuple[int, Any, str, dict[str, str]]:
    """Status, JSON body, reason phrase and headers (``raw``: the request body's bytes as given)."""
    data = raw if raw is not None else json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json",
                                                                         **(headers or {})})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw[:1] in (b"{", b"[", b"n") else raw.decode(), resp.reason, \
                dict(resp.headers)
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            parsed: Any = json.loads(raw)
        except json.JSONDecodeError:
            parsed = raw.decode()
        return exc.code, parsed, exc.reason, dict(exc.headers)


def agl(base: str, path: str, method: str = "GET", body: Any = None) -> tuple[int, Any, str, dict[str, str]]:
    return call(f"{base}/v1/agl{path}", method, body)


def test_writes_are_read_at_once_across_apis_and_by_worker(base: str) -> None:
    status, made, _, _ = call(f"{base}/v1/rollouts", "POST", {"input": {"q": 1}})
    assert status == 201 and made["status"] == "queuing" and made["input"] == {"q": 1}
    status, got, _, _ = agl(base, f"/rollouts/{made['rollout_id']}")  # at once, through the other API
    assert status == 200 and got is not None and got["rollout_id"] == made["rollout_id"]

    status, started, _, _ = agl(base, "/rollouts", "POST", {"input": 2, "mode": "train", "worker_id": "w-a"})
    assert status == 201
    _, worker, _, _ = agl(base, "/workers/w-a")  # the worker record follows start_rollout at once
    assert worker is not None and worker["status"] == "busy"
    assert worker["current_attempt_id"] == started["attempt"]["attempt_id"]
    status, again, _, _ = agl(base, f"/rollouts/{started['rollout_id']}/attempts", "POST", {"worker_id": "w-b"})
    assert status == 201
    _, worker, _, _ = agl(base, "/workers/w-b")  # and start_attempt
    assert worker is not None and worker["current_attempt_id"] == again["attempt"]["attempt_id"]

    status, body, _, _ = call(f"{base}/v1/rollouts?status=bogus")
    assert status == 400 and body["field"] == "status" and "queuing" in body["error"]


def test_queries_and_updates_answer_as_the_reference(base: str) -> None:
    _, plain, _, _ = agl(base, "/rollouts", "POST", {"input": 1})
    _, train, _, _ = agl(base, "/rollouts", "POST", {"input": 2, "mode": "train"})
    rid, aid = plain["rollout_id"], plain["attempt"]["attempt_id"]

    # sort fields: any field of the model, in the reference's words; a missing value first ascending
    status, body, _, _ = agl(base, "/rollouts?sort_by=bogus")
    assert status == 400 and body["detail"].startswith("Invalid sort_by: bogus, allowed fields are: rollout_id,")
    _, page, _, _ = agl(base, "/rollouts?sort_by=mode")
    assert [r["mode"] for r in page["items"]] == [None, "train"]
    _, page, _, _ = agl(base, "/rollouts?sort_by=mode&sort_order=desc&limit=1")
    assert [r["rollout_id"] for r in page["items"]] == [train["rollout_id"]]
    assert (page["limit"], page["offset"], page["total"]) == (1, 0, 2)
    assert agl(base, "/rollouts?limit=-2")[1]["detail"] == "Limit must be greater than 0 or -1 for no limit"
    assert agl(base, "/rollouts?offset=-1")[1]["detail"] == "Offset must be greater than or equal to 0"
    status, body, _, _ = agl(base, "/rollouts?status_in=bogus")
    assert status == 422 and "queuing" in body["detail"]

    # null where the store needs a value: refused as the reference does, the field named
    for field in ("worker_id", "last_heartbeat_time", "metadata", "status"):
        status, body, reason, _ = agl(base, f"/rollouts/{rid}/attempts/{aid}", "POST", {field: None})
        assert (status, body["field"]) == (400, field)
        assert body["detail"] == f"{field} is invalid; it cannot be a null value."
        assert reason == f"Bad Request: {field} is invalid; it cannot be a null value."

    # a finished rollout takes a new status, as the reference's; a refusal's reason reaches the status line, which
    # is what the stock client shows
    assert agl(base, f"/rollouts/{rid}", "POST", {"status": "cancelled"})[0] == 200
    status, body, _, _ = agl(base, f"/rollouts/{rid}", "POST", {"status": "queuing"})
    assert (status, body["status"]) == (200, "queuing")
    status, body, reason, _ = agl(base, f"/rollouts/{rid}/attempts/at-nope", "POST", {"status": "failed"})
    assert status == 404 and reason.startswith("Not Found: ") and body["detail"] in reason


def _span(rid: str, aid: str, **ids: str | None) -> dict[str, Any]:
    now = time.time()
    return {"rollout_id": rid, "attempt_id": aid, "sequence_id": 1, "trace_id": "a" * 32, "span_id": "b" * 16,
            "parent_id": None, "name": "step", "start_time": now, "end_time": now, **ids}


def test_spans_statistics_and_cors(base: str) -> None:
    _, ro, _, _ = agl(base, "/rollouts", "POST", {"input": 1})
    rid, aid = ro["rollout_id"], ro["attempt"]["attempt_id"]
    # ids that are not OpenTelemetry hex are stored as given, as the reference stores them
    status, added, _, _ = agl(base, "/spans", "POST", _span(rid, aid, trace_id="not-hex", span_id="B" * 16,
                                                           parent_id="xyz"))
    assert status == 201 and (added["trace_id"], added["span_id"], added["parent_id"]) == ("not-hex", "B" * 16, "xyz")
    status, added, _, _ = agl(base, "/spans", "POST", _span(rid, aid))
    assert status == 201 and added["span_id"] == "b" * 16
    status, page, _, _ = agl(base, f"/spans?rollout_id={rid}&sort_by=parent_id")
    assert status == 200 and page["total"] == 2
    assert [s["parent_id"] for s in page["items"]] == [None, "xyz"]  # a missing value sorts first, ascending
    # bodies read by pydantic-core: a span's floats and unicode back as sent; not JSON is a 400 saying so; null
    # is no body
    sent = {**_span(rid, aid, span_id="c" * 16), "attributes": {"x": 1e-07, "big": 2**40 + 1, "t": "caf\u00e9 \U0001F600"}}
    status, added, _, _ = agl(base, "/spans", "POST", {**sent, "attributes": {**sent["attributes"], "nan": math.nan}})
    assert status == 201 and added["attributes"] == {**sent["attributes"], "nan": None}  # standard JSON: no NaN
    assert added["start_time"] == sent["start_time"]
    status, body, reason, _ = call(f"{base}/v1/agl/spans", "POST", raw=b'{"rollout_id": ')
    assert status == 400 and body["detail"].startswith("body is not JSON: ") and reason.startswith("Bad Request: body")
    status, body, _, _ = call(f"{base}/v1/agl/spans/next", "POST", raw=b"null")
    assert (status, body["field"]) == (422, "rollout_id")
    status, body, _, _ = call(f"{base}/v1/agl/spans/next", "POST", raw=b'{"rollout_id": "' + rid.encode() + b'"}')
    assert (status, body["field"], body["detail"]) == (422, "attempt_id", "attempt_id: Field required")

    _, stats, _, _ = agl(base, "/statistics")
    assert stats["total_spans"] == 3 and stats["total_rollouts"] == 1 and stats["total_span_bytes"] > 0

    status, body, reason, _ = agl(base, "/nowhere")  # the router's own answers, in the reference's body shape
    assert (status, body["detail"], reason) == (404, "Not Found", "Not Found")
    status, body, _, headers = agl(base, "/statistics", "POST", {})
    assert (status, body["detail"]) == (405, "Method Not Allowed") and "GET" in headers["Allow"]

    # CORS as the reference's server with this origin allowed: a preflight needs no token
    preflight = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization,content-type"}
    status, text, _, headers = call(f"{base}/v1/agl/rollouts/search", "OPTIONS", headers=preflight, token=None)
    assert (status, text) == (200, "OK")
    assert headers["Access-Control-Allow-Origin"] == ORIGIN and headers["Access-Control-Allow-Credentials"] == "true"
    assert headers["Access-Control-Allow-Headers"] == "authorization,content-type"
    assert "POST" in headers["Access-Control-Allow-Methods"] and headers["Access-Control-Max-Age"] == "600"
    status, _, _, headers = call(f"{base}/v1/agl/statistics", headers={"Origin": ORIGIN})
    assert status == 200 and headers["Access-Control-Allow-Origin"] == ORIGIN
    status, _, _, headers = call(f"{base}/v1/agl/statistics", headers={"Origin": ORIGIN}, token=None)
    assert status == 401 and headers["Access-Control-Allow-Origin"] == ORIGIN  # the browser may read the refusal
    status, _, _, headers = call(f"{base}/v1/agl/statistics", "OPTIONS", token=None,
                                 headers={**preflight, "Origin": "https://evil.example"})
    assert status == 400 and "Access-Control-Allow-Origin" not in headers
