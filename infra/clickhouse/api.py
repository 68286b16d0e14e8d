"""The owner's query API: a small loopback HTTP server that runs read-only SQL on the owner's connection."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from . import ClickHouse

MAX_BODY = 1 << 20


def _jsonable(value: Any) -> Any:
    if isinstance(value, (dt.datetime, dt.date)):
        return value.isoformat()
    if isinstance(value, (decimal.Decimal, uuid.UUID)):
        return str(value)
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


Action = Callable[[dict[str, Any]], dict[str, Any]]


class _QueryHandler(BaseHTTPRequestHandler):
    """``GET /health``, ``POST /sql`` and the owner's actions; ``serve_queries`` binds ``ch`` and ``routes``."""

    ch: ClickHouse
    routes: dict[str, Action]

    def log_message(self, *args: Any) -> None:  # quiet: queries are logged by the caller
        pass

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body, default=_jsonable).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {"status": "ok", "role": self.ch.role})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        if self.path != "/sql" and self.path not in self.routes:
            self._send(404, {"error": "not found"})
            return
        length = int(self.headers.get("Content-Length", "0"))
        if length > MAX_BODY:
            self._send(413, {"error": f"body over {MAX_BODY} bytes"})
            return
        if self.path in self.routes:
            self._action(self.routes[self.path], length)
        else:
            self._sql(length)

    def _sql(self, length: int) -> None:
        try:
            body = json.loads(self.rfile.read(length))
            sql, parameters = body["query"], body.get("parameters")
            if not isinstance(sql, str) or not sql.strip() or not isinstance(parameters, dict | None):
                raise ValueError
        except (ValueError, KeyError, TypeError, AttributeError):
            self._send(400, {"error": "body must be JSON {\"query\": \"SELECT ...\", \"parameters\": {...}}"})
            return
        try:
            self._send(200, self.ch.user_query(sql, parameters).to_json())
        except Exception as exc:  # noqa: BLE001 (a bad query is the caller's error, reported back)
            self._send(400, {"error": str(exc).strip().splitlines()[0][:2000]})

    def _action(self, action: Action, length: int) -> None:
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._send(400, {"error": "body must be a JSON object"})
            return
        try:
            self._send(200, action(body))
        except Exception as exc:  # noqa: BLE001 (reported to the caller, who prints it)
            self._send(500, {"error": f"{type(exc).__name__}: {str(exc).strip()[:2000]}"})


def serve_queries(ch: ClickHouse, host: str = "127.0.0.1", port: int = 0,
                  actions: dict[str, Action] | None = None) -> ThreadingHTTPServer:
    """Start the API in a daemon thread; returns the server (its ``server_address`` has the bound port).

    ``POST /sql`` runs a person's read-only SQL on a reader session (``ClickHouse.user_query``); ``actions`` adds owner-side operations by route (the sink adds ``/replay``,
    the ClickHouse rebuild, which only the owner of a chDB directory can run)."""
    handler = type("QueryHandler", (_QueryHandler,), {"ch": ch, "routes": dict(actions or {})})
    server = ThreadingHTTPServer((host, port), handler)
    threading.Thread(target=server.serve_forever, name="query-api", daemon=True).start()
    return server
