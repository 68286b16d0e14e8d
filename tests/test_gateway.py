"""The HTTP gateway over the real broker: enqueue, list, SQL; 4xx naming the field; the bearer token."""

from __future__ import annotations

import json
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


@pytest.fixture
def gateway(settings: Settings) -> Iterator[tuple[str, Settings]]:
    settings = settings.model_copy(update={"gateway_token": SecretStr("s3cret")})
    port = free_port()
    with Stack(settings) as s:
        s.start("lifecycle", "process", "lifecycle")
        s.start("gateway", "gateway", "--port", str(port))
        s.wait_ready("gateway", "gateway")
        yield f"http://127.0.0.1:{port}", settings


def call(url: str, method: str = "GET", body: Any = None, token: str | None = "s3cret",
         raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def test_gateway(gateway: tuple[str, Settings]) -> None:
    base, _ = gateway
    assert call(f"{base}/health", token=None) == (200, {"status": "ok"})
    assert call(f"{base}/v1/rollouts", token=None)[0] == 401
    assert call(f"{base}/v1/rollouts", token="wrong")[0] == 401

    status, body = call(f"{base}/v1/rollouts", "POST", {"input": {"q": 1}, "mode": "train",
                                                       "config": {"max_attempts": 2}})
    assert status == 201 and body["rollout_id"].startswith("ro-")
    rid = body["rollout_id"]

    status, body = call(f"{base}/v1/rollouts", "POST", {"input": 1, "mode": "bogus"})
    assert status == 400 and body["field"] == "mode"
    status, body = call(f"{base}/v1/rollouts", "POST", {"input": 1, "config": {"max_attempts": 0}})
    assert status == 400 and body["field"] == "config.max_attempts"
    status, body = call(f"{base}/v1/rollouts", "POST", raw=b"{not json")
    assert status == 400 and "not JSON" in body["error"]
    status, body = call(f"{base}/v1/sql", "POST", {"query": ""})
    assert status == 400 and body["field"] == "query"
    huge = urllib.request.Request(f"{base}/v1/rollouts", data=b'{"input": "' + b"x" * (5 << 20) + b'"}',
                                  method="POST", headers={"Content-Type": "application/json",
                                                          "Authorization": "Bearer s3cret"})
    with pytest.raises(urllib.error.HTTPError) as too_big:
        urllib.request.urlopen(huge, timeout=30)
    assert too_big.value.code == 413

    deadline = time.monotonic() + 60
    items: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        items = call(f"{base}/v1/rollouts?status=queuing")[1]["items"]
        if items:
            break
        time.sleep(0.5)
    assert [i["rollout_id"] for i in items] == [rid]
    log = (gateway[1].data_dir / "logs" / "gateway.log").read_text()
    assert "/v1/rollouts" not in log, "no access log unless LITSTREAM_GATEWAY_ACCESS_LOG asks for it"


def test_access_log_when_asked_for(settings: Settings) -> None:
    """LITSTREAM_GATEWAY_ACCESS_LOG=true: a line per request in the gateway's log."""
    settings = settings.model_copy(update={"gateway_access_log": True})
    port = free_port()
    with Stack(settings) as s:
        s.start("gateway", "gateway", "--port", str(port))
        s.wait_ready("gateway", "gateway")
        assert call(f"http://127.0.0.1:{port}/health", token=None) == (200, {"status": "ok"})
        log = settings.data_dir / "logs" / "gateway.log"
        deadline = time.monotonic() + 10
        while '"GET /health' not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert '"GET /health' in log.read_text()
