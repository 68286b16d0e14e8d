"""The owner's query API: a small loopback HTTP server that runs read-only SQL on the owner's connection."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import threading
import uuid
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


def serve_queries(ch: ClickHouse, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """Start the API in a daemon thread; returns the server (its ``server_address`` has the bound port)."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:  # quiet: queries are logged by the caller
            pass

        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, default=_jsonable).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/health":
                self._send(200, {"status": "ok", "role": ch.role})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/sql":
                self._send(404, {"error": "not found"})
                return
            length = int(self.headers.get("Content-Length", "0"))
            if length > MAX_BODY:
                self._send(413, {"error": f"body over {MAX_BODY} bytes"})
                return
            try:
                sql = json.loads(self.rfile.read(length))["query"]
                if not isinstance(sql, str) or not sql.strip():
                    raise ValueError
            except (ValueError, KeyError, TypeError):
                self._send(400, {"error": "body must be JSON {\"query\": \"SELECT ...\"}"})
                return
            try:
                self._send(200, ch.query(sql).to_json())
            except Exception as exc:  # a bad query is the caller's error, reported back
                self._send(400, {"error": str(exc).strip().splitlines()[0][:2000]})

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="query-api", daemon=True).start()
    return server
